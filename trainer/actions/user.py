"""A user's own actions: any callable `action(context)`, run after every loop call
(or, wrapped in `every(N, action)`, after the loop calls that end at multiples of
N), on every worker. Returning `trainer.STOP` ends training at that step with a
checkpoint and an export: status "stopped", exit 0, and a rerun changes nothing.

Example (runs as written):

    import trainer

    def stop_at_target(context):
      if context.eval_metrics and context.eval_metrics["accuracy"] >= 0.9:
        return trainer.STOP

    results = trainer.train(
        trainer.Config(train_steps=300, mode="train_and_eval", eval_every=50),
        actions=[stop_at_target])

An action object may also own its schedule, as the framework's actions do: its
`next_stop(step)`, called before each loop call that starts at `step`, returns
the step at which that call must end for it (or None).

Actions run on every worker of a cluster, each on its own copy of the model: only
the chief (`context.is_chief`) should write files. An action that raises (or calls
`sys.exit`) shows its traceback and one line naming it; the run exits 1 with status
"failed" and keeps its checkpoints. One that raises KeyboardInterrupt stops the
run as SIGINT does: a checkpoint of that step, status "interrupted", exit 4.
"""

import dataclasses
from typing import Callable, Optional

from trainer.actions.base import Action, LoopCall, Stop, due, next_multiple
from trainer.errors import RunStatus, UserCodeError, user_code


class _StopSignal:
  """What an action returns to end training (`trainer.STOP`)."""

  def __repr__(self):
    return "trainer.STOP"


STOP = _StopSignal()


@dataclasses.dataclass(frozen=True)
class ActionContext:
  """What an action sees after a loop call. Read-only.

  Attributes:
    step: the global step the loop call ended at.
    metrics: the call's train metrics: mean loss and task metrics.
    eval_metrics: the evaluation's metrics when one ran at this step, else None.
    model: the task's Keras model (this worker's copy; do not change it).
    model_dir: the run directory.
    is_chief: whether this process writes the run's files.
    summaries: writes to the run's TensorBoard at this step (nothing on other
      workers): `summaries.scalar(tag, value)`, `.text(tag, text)`,
      `.histogram(tag, values)`, `.image(tag, images)`.
  """
  step: int
  metrics: dict
  eval_metrics: Optional[dict]
  model: object
  model_dir: str
  is_chief: bool
  summaries: object


def action_context(call: LoopCall, *, model, model_dir: str, is_chief: bool,
                   evaluate, summaries) -> ActionContext:
  """The ActionContext of loop call `call` (`evaluate`: the run's Evaluate action,
  whose evaluation of that step, if any, it shows)."""
  return ActionContext(step=call.step, metrics=call.metrics,
                       eval_metrics=evaluate.metrics_at(call.step), model=model,
                       model_dir=model_dir, is_chief=is_chief,
                       summaries=summaries.at("train", call.step))


class Every:
  """An action run only after loop calls that end at multiples of `steps`; loop
  calls end there for it."""

  def __init__(self, steps: int, action: Callable):
    if not (isinstance(steps, int) and steps >= 1):
      raise ValueError(f"every(steps={steps!r}): must be an int >= 1")
    self.steps = steps
    self.action = action

  def __call__(self, context: ActionContext):
    return self.action(context) if due(context.step, self.steps) else None


def every(steps: int, action: Callable) -> Every:
  """`action`, run after the loop calls that end at multiples of `steps`."""
  return Every(steps, action)


def action_name(action) -> str:
  """How errors and lines name a user's action."""
  target = action.action if isinstance(action, Every) else action
  name = getattr(target, "__qualname__", None) or type(target).__qualname__
  return name.split(".<locals>.")[-1]


class UserAction(Action):
  """Runs a user's action on an ActionContext; STOP becomes a stop request."""

  def __init__(self, action: Callable, *, context: Callable):
    """Args:
      action: the user's callable.
      context: `context(call) -> ActionContext`.
    """
    self._action = action
    self._context = context
    self.name = action_name(action)

  def next_stop(self, step):
    if isinstance(self._action, Every):
      return next_multiple(step, self._action.steps)
    own = getattr(self._action, "next_stop", None)
    if own is None:
      return None
    with user_code(f"action {self.name} (next_stop)"):
      return own(step)

  def __call__(self, call: LoopCall):
    try:
      result = self._action(self._context(call))
    except KeyboardInterrupt:
      # As SIGINT: every worker stops at this step, with its checkpoint.
      return Stop(RunStatus.INTERRUPTED, f"action {self.name} raised "
                  f"KeyboardInterrupt: saved a checkpoint at step {call.step}; "
                  "rerun the same command to resume")
    except (Exception, SystemExit) as e:  # noqa: BLE001 (the user's code: any
      # error is theirs; sys.exit() in an action is its failure, not a success).
      raise UserCodeError(f"action {self.name}", e) from e
    if result is STOP:
      return Stop(RunStatus.STOPPED, f"action {self.name} returned trainer.STOP at "
                  f"step {call.step}: saved a checkpoint")
    return None
