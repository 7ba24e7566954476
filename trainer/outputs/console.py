"""The run's one output channel: progress lines and messages on stdout.

Only the chief speaks; other workers stay silent but for the lines that are
theirs alone (which files they read). `--summaries=false` silences the per-call
progress lines, not the messages.
"""

import time

from trainer.outputs import progress


class Console:
  """Says a run's lines: one per loop call, one per evaluation, and messages."""

  def __init__(self, *, total_steps: int, is_chief: bool, progress_lines: bool):
    """Creates the channel.

    Args:
      total_steps: the run's --train_steps, for the ETA.
      is_chief: whether this process speaks.
      progress_lines: print a line per loop call (--summaries).
    """
    self._total = total_steps
    self._is_chief = is_chief
    self._progress = progress_lines and is_chief
    self._start = time.perf_counter()
    self._start_step = None

  def say(self, message: str):
    """A message from the run (the chief's)."""
    if self._is_chief:
      print(message, flush=True)

  def say_as_worker(self, message: str):
    """A line of this worker's own (e.g. the files it reads): every worker says it."""
    print(message, flush=True)

  def report(self, step: int, metrics: dict, *, examples_per_second: float,
             compiled_seconds=None):
    """The line of a loop call that ended at `step` (`compiled_seconds`: the
    call traced the loop and took that long)."""
    if self._start_step is None:
      self._start_step, self._start = step, time.perf_counter()
      eta = "?"
    else:
      rate = (step - self._start_step) / max(time.perf_counter() - self._start, 1e-9)
      eta = progress.duration((self._total - step) / rate) if rate > 0 else "?"
    if self._progress:
      print(progress.step_line(step, self._total, metrics,
                               examples_per_second=examples_per_second, eta=eta,
                               compiled_seconds=compiled_seconds),
            flush=True)

  def report_eval(self, step: int, metrics: dict):
    """An evaluation's line (`metrics` holds "examples", the count)."""
    self.say(progress.eval_line(step, metrics))
