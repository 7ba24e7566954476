"""The controller: loop calls of K steps to --train_steps, then small actions.

Each loop call is one dispatch of the compiled train loop (K steps, K a tensor)
whose outputs are read once on the host as a `LoopCall`. The actions (trainer/
training/actions.py) then run in order on that call: check the ledger, apply the
NaN policy, record, summarise, report, checkpoint, evaluate, vote on stopping.
An action returns None to go on, `ROLLED_BACK` when it restored an earlier step
(the controller then restarts the input there), or a status that ends training.
"""

import dataclasses
import time

import tensorflow as tf

from trainer import data
from trainer.config import Config
from trainer.training.state import RunState
from trainer.training.steps import call_checked
from trainer.training.watchdog import LOOP_CALL, HangWatchdog

ROLLED_BACK = "rolled_back"
_AUTO_TARGET_SECONDS = 1.0  # --steps_per_loop=0: aim for loop calls this long.
_AUTO_MAX_STEPS = 1000


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


def next_stop(step: int, config: Config) -> int:
  """The next step at which a loop call must end (checkpoint, eval, summary, end)."""
  stops = [config.train_steps, _next_multiple(step, config.checkpoint_every)]
  if config.mode == "train_and_eval" and config.eval_every:
    stops.append(_next_multiple(step, config.eval_every))
  if config.summary_every:
    stops.append(_next_multiple(step, config.summary_every))
  # The profiler records whole loop calls: calls end where its window starts
  # (after step A - 1) and where it ends (after step B).
  stops += [s for s in (config.profile_steps[0] - 1, config.profile_steps[-1])
            if s > step] if config.profile_steps else []
  return min(stops)


def _next_multiple(step, every):
  return (step // every + 1) * every


def auto_steps_per_loop(num_steps: int, seconds: float, *, first: bool) -> int:
  """K for the next call under --steps_per_loop=0: calls of about a second."""
  if first:
    return 10  # The first call traced; measure a short untraced one next.
  return max(1, min(_AUTO_MAX_STEPS, int(num_steps * _AUTO_TARGET_SECONDS / seconds)))


def train_iterator(state: RunState):
  """The distributed iterator of training batches from the current global step;
  None when the replicas gather their batches in-graph (--array_input=gather)."""
  if state.gather_input is not None:
    return None
  config = state.config
  # Each update reads --grad_accum_steps global batches of the stream.
  return iter(data.train_input(
      state.strategy, state.train_data, global_batch_size=state.global_batch_size,
      seed=config.seed, shuffle=config.shuffle, shuffle_buffer=config.shuffle_buffer,
      start_step=state.step * config.grad_accum_steps,
      preprocess=state.task.preprocess))


def _input_error(state: RunState, error, step: int, num_steps: int):
  """A DataError naming the bad record that failed the loop call of `num_steps`
  from `step`, or None."""
  config = state.config
  # This worker's stream positions: its share of the global batches.
  num_pipelines, _ = data.input_pipelines(state.strategy)
  per_step = config.grad_accum_steps * state.global_batch_size // num_pipelines
  return data.input_error(state.strategy, state.train_data, error, split="train",
                          step=step, seed=config.seed, shuffle=config.shuffle,
                          position=step * per_step, records=num_steps * per_step)


class Controller:
  """Trains to --train_steps in loop calls, running `actions` after each call."""

  def __init__(self, *, state: RunState, actions: list, watchdog: HangWatchdog):
    """Creates the controller.

    Args:
      state: the run's state (restored, if resuming).
      actions: callables `action(call: LoopCall)`, run in order after each call.
      watchdog: bounds each loop call, and the actions after it, in time.
    """
    self._state = state
    self._actions = actions
    self._watchdog = watchdog
    self._calls = 0
    self._num_steps = {}  # num_steps -> its tensor: a new constant costs an eager op.

  def _dispatch(self, iterator, num_steps: int, *, step: int) -> LoopCall:
    state = self._state
    if num_steps not in self._num_steps:
      self._num_steps[num_steps] = tf.constant(num_steps)
    start = time.perf_counter()
    outputs = {k: v.numpy() for k, v in call_checked(
        state.train_loop, iterator, self._num_steps[num_steps],
        explain_input_error=lambda e: _input_error(state, e, step, num_steps)
    ).items()}
    seconds = time.perf_counter() - start
    self._calls += 1
    examples = max(float(outputs["examples"]), 1.0)
    means = {"loss": float(outputs["loss"]) / num_steps}
    means.update({name: float(outputs[name]) / examples
                  for name in state.metric_names})
    return LoopCall(index=self._calls, step=int(outputs["step"]), num_steps=num_steps,
                    seconds=seconds, outputs=outputs,
                    metrics=state.task.finalize_metrics(means))

  def train(self) -> str:
    """Runs loop calls until --train_steps or an action ends training.

    Returns:
      "completed", or the status an action ended training with.
    """
    state, config = self._state, self._state.config
    step = state.step  # Then from each call's outputs: reading the variable is an op.
    iterator = train_iterator(state)
    steps_per_loop = config.steps_per_loop or 1  # Auto: one step first (it traces).
    while step < config.train_steps:
      num_steps = min(steps_per_loop, next_stop(step, config) - step)
      with self._watchdog.guard(LOOP_CALL, step=step):
        call = self._dispatch(iterator, num_steps, step=step)
      step = call.step
      self._watchdog.completed(step)
      outcome = self._run_actions(call)
      if outcome == ROLLED_BACK:
        step = state.step
        iterator = train_iterator(state)
      elif outcome:
        return outcome
      if not config.steps_per_loop:
        steps_per_loop = auto_steps_per_loop(num_steps, call.seconds,
                                             first=call.index == 1)
    return "completed"

  def _run_actions(self, call: LoopCall):
    """Runs the actions in order, each bounded by the watchdog on its own; the
    first outcome that is not None ends them."""
    for action in self._actions:
      name = getattr(action, "__qualname__", type(action).__name__)
      with self._watchdog.guard(f"{name.split('.<locals>')[0]} after a loop call",
                                step=call.step):
        outcome = action(call)
      if outcome:
        return outcome
    return None
