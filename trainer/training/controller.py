"""The controller: loop calls of K steps to --train_steps, then the actions.

Each loop call is one dispatch of the compiled train loop (K steps, K a tensor)
whose outputs are read once on the host as a `LoopCall`. The actions
(trainer/actions) then run in order on it; each says when the next loop call must
end for it (`next_stop`), so K never runs past an evaluation, a checkpoint or a
summary. An action returns None to go on, `ROLLED_BACK` after restoring an earlier
step (the controller then restarts the input there), or a `Stop`. After the
actions, every worker votes on stopping: all of them stop after the same step, for
the most urgent reason any of them had, with a checkpoint of that step.
"""

import time

import tensorflow as tf

from trainer.actions.base import STOP_PRIORITY, LoopCall, Stop
from trainer.actions.nan_policy import ROLLED_BACK
from trainer.errors import RunStatus
from trainer.outputs import profile
from trainer.training import steps
from trainer.training.watchdog import LOOP_CALL, HangWatchdog

_AUTO_TARGET_SECONDS = 1.0  # --steps_per_loop=0: aim for loop calls this long.
_AGREED = {  # What the chief says when another worker's request stopped the run.
    RunStatus.STOPPED: "an action on another worker returned trainer.STOP",
    RunStatus.EARLY_STOPPED: "early stop",
    RunStatus.TIME_LIMIT: "--max_time reached on another worker",
    RunStatus.INTERRUPTED: "a stop request",
    RunStatus.REQUEUED: "the requeue signal on another worker",
}


def auto_steps_per_loop(num_steps: int, seconds: float, *, first: bool) -> int:
  """K for the next call under --steps_per_loop=0: calls of about a second."""
  if first:
    return 10  # The first call traced; measure a short untraced one next.
  return max(1, min(steps.MAX_AUTO_STEPS_PER_LOOP,
                    int(num_steps * _AUTO_TARGET_SECONDS / seconds)))


class Controller:
  """Trains to --train_steps in loop calls, running `actions` after each call."""

  def __init__(self, *, trainer, train_data, actions: list, train_steps: int,
               steps_per_loop: int, watchdog: HangWatchdog, on_stop):
    """Creates the controller.

    Args:
      trainer: what trains (restored, if resuming).
      train_data: its training data.
      actions: Actions (trainer/actions), run in order after each call.
      train_steps: --train_steps.
      steps_per_loop: --steps_per_loop (0: about a second per call).
      watchdog: bounds each loop call, and each action after it, in time.
      on_stop: `on_stop(message)`, called by every worker once they agreed to
        stop: saves the checkpoint of this step and says why.
    """
    self._trainer = trainer
    self._data = train_data
    self._actions = actions
    self._train_steps = train_steps
    self._steps_per_loop = steps_per_loop
    self._watchdog = watchdog
    self._on_stop = on_stop
    self._calls = 0
    self._num_steps = {}  # num_steps -> its tensor: a new constant costs an eager op.

  def next_stop(self, step: int) -> int:
    """The next step at which a loop call must end: the soonest any action asks
    for, and --train_steps."""
    stops = [self._train_steps] + [action.next_stop(step) for action in self._actions]
    return min(s for s in stops if s is not None and s > step)

  def _dispatch(self, iterator, num_steps: int, *, step: int) -> LoopCall:
    trainer = self._trainer
    if num_steps not in self._num_steps:
      self._num_steps[num_steps] = tf.constant(num_steps)
    start = time.perf_counter()
    # A step marker for the profiler (a no-op unless it records): the Profile
    # tab's Overview page times each loop call as a step.
    with tf.profiler.experimental.Trace(profile.STEP_MARKER, step_num=step + num_steps,
                                        _r=1):
      outputs = trainer.run_train_loop(self._data, iterator,
                                       self._num_steps[num_steps], step=step)
    seconds = time.perf_counter() - start
    self._calls += 1
    return LoopCall(index=self._calls, step=int(outputs["step"]), num_steps=num_steps,
                    seconds=seconds, outputs=outputs,
                    metrics=trainer.call_metrics(outputs, num_steps=num_steps))

  def train(self) -> RunStatus:
    """Runs loop calls until --train_steps or the workers agree to stop.

    Returns:
      COMPLETED, or the status training stopped with.
    """
    trainer = self._trainer
    step = trainer.step  # Then from each call's outputs: reading the variable is an op.
    iterator = trainer.train_iterator(self._data)
    steps_per_loop = self._steps_per_loop or 1  # Auto: one step first (it traces).
    while step < self._train_steps:
      num_steps = min(steps_per_loop, self.next_stop(step) - step)
      with self._watchdog.guard(LOOP_CALL, step=step):
        call = self._dispatch(iterator, num_steps, step=step)
      step = call.step
      self._watchdog.completed(step)
      proposal = steps_per_loop if self._steps_per_loop else auto_steps_per_loop(
          num_steps, call.seconds, first=call.index == 1)
      outcome, agreed_steps = self._run_actions(call, proposal)
      if agreed_steps and not self._steps_per_loop:
        steps_per_loop = agreed_steps  # Every worker's the same (see the vote).
      if outcome == ROLLED_BACK:
        step = trainer.step
        iterator = trainer.train_iterator(self._data)
      elif outcome:
        return outcome
    return RunStatus.COMPLETED

  def _run_actions(self, call: LoopCall, steps_per_loop: int):
    """Runs every action, each bounded by the watchdog on its own, then the vote.

    Args:
      call: the loop call just made.
      steps_per_loop: this worker's proposal for the next call's length.

    Returns:
      (ROLLED_BACK, the agreed stop status or None; the fewest steps any worker
      proposed, or None after a rollback, which every worker makes without a vote).
    """
    requests = []
    for action in self._actions:
      name = getattr(action, "name", type(action).__name__)
      with self._watchdog.guard(f"{name} after a loop call", step=call.step):
        outcome = action(call)
      if outcome == ROLLED_BACK:
        # Every worker saw the same non-finite step; the vote comes after the
        # next call.
        return ROLLED_BACK, None
      if isinstance(outcome, Stop):
        requests.append(outcome)
    mine = max(requests, key=lambda r: STOP_PRIORITY.index(r.status), default=None)
    with self._watchdog.guard("the stop vote", step=call.step):
      agreed, agreed_steps = self._trainer.loop_vote(
          0 if mine is None else STOP_PRIORITY.index(mine.status) + 1, steps_per_loop)
    if not agreed:
      return None, agreed_steps
    status = STOP_PRIORITY[agreed - 1]
    self._on_stop(mine.message if mine is not None and mine.status == status else
                  f"{_AGREED[status]} at step {call.step}: saved a checkpoint; rerun "
                  "the same command to resume")
    return status, agreed_steps
