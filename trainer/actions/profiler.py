"""--profile_steps=A,B: a TensorFlow profiler trace of the loop calls running steps
A to B (loop calls end at A - 1 and B), under MODEL_DIR/train. Each loop call
carries a step marker (see Controller): the Profile tab's Overview page shows
each call as a step (with --steps_per_loop=1, each step). When the window is
complete, where a step's time went (outputs.profile) goes to results.json
("profile") and to one line."""

import os

import tensorflow as tf

from trainer.actions.base import Action, LoopCall
from trainer.outputs import profile


class Profiler(Action):
  """Starts and stops the trace around the window's loop calls (on the chief)."""

  def __init__(self, *, window, model_dir: str, is_chief: bool, results, console):
    self._window = tuple(window)
    self._log_dir = os.path.join(model_dir, "train")
    self._enabled = bool(self._window) and is_chief
    self._results = results
    self._console = console
    self._active = False
    self._calls = 0

  def next_stop(self, step):
    if not self._window:
      return None
    first, last = self._window
    stops = [s for s in (first - 1, last) if s > step]
    return min(stops) if stops else None

  def _start(self):
    tf.profiler.experimental.start(self._log_dir)
    self._active = True

  def close(self):
    """Stops a trace still recording (the run ended inside the window)."""
    if self._active:
      tf.profiler.experimental.stop()
      self._active = False

  def before_training(self, step: int):
    """Starts the trace when training starts at the window's first step."""
    if self._enabled and step == self._window[0] - 1:
      self._start()

  def _report(self):
    try:
      trace = profile.latest_trace(self._log_dir)
      breakdown = profile.step_breakdown(
          trace, steps=self._window[1] - self._window[0] + 1)
    except Exception as e:  # noqa: BLE001
      # A trace that cannot be read (corrupt, too large, none) never fails a run.
      self._console.say(f"note: no step breakdown from the profile "
                        f"({type(e).__name__}: {e})")
      return
    if breakdown["loop_calls"] != self._calls:
      self._console.say(
          f"note: no step breakdown from the profile: it holds "
          f"{breakdown['loop_calls']} loop calls, not the {self._calls} of steps "
          f"{self._window[0]}-{self._window[1]} (a rollback inside the window)")
      return
    self._results.data["profile"] = dict(breakdown, trace=trace)
    self._console.say(profile.describe(breakdown))

  def __call__(self, call: LoopCall):
    if not self._enabled:
      return
    if self._active:
      self._calls += 1  # Loop calls that ran inside the trace.
    if self._active and call.step >= self._window[1]:
      self.close()
      self._report()
    elif not self._active and call.step == self._window[0] - 1:
      self._start()
