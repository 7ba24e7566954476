"""What an action is: a callable run after every loop call, which owns its schedule.

The controller dispatches K steps, reads the loop call's outputs once as a
`LoopCall`, runs every action on it in order, and asks each for its next stop (the
step at which a loop call must end for it: an evaluation, a checkpoint, a summary).
An action returns None to go on, or a `Stop` to end training at this step; every
worker votes, so all of them stop together, with the checkpoint of that step.
"""

import dataclasses
from typing import Optional

from trainer.errors import RunStatus

# When two workers ask to stop for different reasons, the later one here wins.
STOP_PRIORITY = (RunStatus.STOPPED, RunStatus.EARLY_STOPPED, RunStatus.TIME_LIMIT,
                 RunStatus.REQUEUED, RunStatus.INTERRUPTED)


@dataclasses.dataclass(frozen=True)
class LoopCall:
  """One loop call, as the host saw it.

  Attributes:
    index: 1 for the run's first call in this process (it traces), then 2, ...
    step: the global step after the call.
    num_steps: steps the call ran.
    seconds: its wall time.
    outputs: the train loop's outputs as numpy values.
    metrics: the mean loss and task metrics over the call's steps.
  """
  index: int
  step: int
  num_steps: int
  seconds: float
  outputs: dict
  metrics: dict

  @property
  def all_finite(self) -> bool:
    return bool(self.outputs["all_finite"])


@dataclasses.dataclass(frozen=True)
class Stop:
  """An action's request to end training at this step.

  Attributes:
    status: why (one of STOP_PRIORITY).
    message: the line said when this worker's request is the one agreed on.
  """
  status: RunStatus
  message: str


class Action:
  """Base of the framework's actions (a user's action may be any callable)."""

  def next_stop(self, step: int) -> Optional[int]:
    """The next step after `step` at which a loop call must end for this action,
    or None."""
    del step
    return None

  def __call__(self, call: LoopCall) -> Optional[Stop]:
    raise NotImplementedError


def next_multiple(step: int, every: int) -> int:
  """The first multiple of `every` after `step`."""
  return (step // every + 1) * every


def due(step: int, every: int) -> bool:
  """Whether `step` is a multiple of `every` (never when `every` is 0)."""
  return bool(every) and step % every == 0
