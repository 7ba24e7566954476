"""Ends training at the next loop call when asked: by SIGTERM or SIGINT
(interrupted), or past --max_time (time_limit). Each worker asks for itself; the
controller's vote makes them all stop after the same step."""

import time
from typing import Optional

from trainer.actions.base import Action, LoopCall, Stop
from trainer.errors import RunStatus


class SignalStop(Action):
  """Asks to stop once this process got SIGTERM or SIGINT, or the requeue signal
  (--requeue_signal: the job is requeued once every worker saved)."""

  def __init__(self, stop_request, *, requeue_signal=None):
    self._request = stop_request
    self._requeue_signal = requeue_signal

  def __call__(self, call: LoopCall):
    if not self._request:
      return None
    name = self._request.signal_name
    if name == self._requeue_signal:
      return Stop(RunStatus.REQUEUED, f"{name}: saved a checkpoint at step "
                  f"{call.step}")
    return Stop(RunStatus.INTERRUPTED, (
        f"{name}: saved a checkpoint at step {call.step}; rerun the same command "
        "to resume"))


class TimeLimit(Action):
  """--max_time: asks to stop after the first loop call past the budget."""

  def __init__(self, *, max_time: Optional[str], budget: Optional[float]):
    self._max_time = max_time
    self._budget = budget
    self._started = time.monotonic()

  def __call__(self, call: LoopCall):
    if self._budget is None or time.monotonic() - self._started <= self._budget:
      return None
    return Stop(RunStatus.TIME_LIMIT, (
        f"--max_time={self._max_time} reached at step {call.step}: saved a "
        "checkpoint; rerun (with a new budget) to resume"))
