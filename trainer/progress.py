"""Progress lines on stdout, and their parser (sweeps read trials' lines).

The line formats live here, next to the parser, so changing one changes the other.
This module does not import TensorFlow.
"""

import re
import time

_STEP_LINE = re.compile(r"^step (?P<step>\d+)/(?P<total>\d+)  loss (?P<loss>\S+)  "
                        r"accuracy (?P<accuracy>\S+)  ")
_EVAL_LINE = re.compile(r"^eval at step (?P<step>\d+): loss (?P<loss>\S+)  "
                        r"accuracy (?P<accuracy>\S+)")


def parse_line(line: str) -> dict:
  """{"step", "train/loss", "train/accuracy"} or eval metrics from a progress line.

  Returns:
    The values the line reports ({} for other lines).
  """
  match = _STEP_LINE.match(line)
  if match:
    return {"step": int(match["step"]), "train/loss": float(match["loss"]),
            "train/accuracy": float(match["accuracy"])}
  match = _EVAL_LINE.match(line)
  if match:
    return {"step": int(match["step"]), "eval/loss": float(match["loss"]),
            "eval/accuracy": float(match["accuracy"])}
  return {}


def _duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
  """One line per loop call: step/total, loss, accuracy, examples/s, ETA."""

  def __init__(self, *, total_steps: int, enabled: bool, speak: bool = True):
    """Creates the reporter.

    Args:
      total_steps: the run's --train_steps, for the ETA.
      enabled: print a line per loop call.
      speak: print one-off messages (`say`); off on non-chief workers.
    """
    self._total = total_steps
    self._enabled = enabled
    self._speak = speak
    self._start = time.perf_counter()
    self._start_step = None

  def report(self, step: int, *, loss: float, accuracy: float,
             examples_per_second: float):
    if self._start_step is None:
      self._start_step, self._start = step, time.perf_counter()
      eta = "?"
    else:
      rate = (step - self._start_step) / max(time.perf_counter() - self._start, 1e-9)
      eta = _duration((self._total - step) / rate) if rate > 0 else "?"
    if self._enabled:
      print(f"step {step}/{self._total}  loss {loss:.4f}  accuracy {accuracy:.4f}  "
            f"{examples_per_second:,.0f} examples/s  ETA {eta}", flush=True)

  def report_eval(self, step: int, *, loss: float, accuracy: float, examples: int):
    self.say(f"eval at step {step}: loss {loss:.4f}  accuracy {accuracy:.4f}  "
             f"({examples} examples)")

  def say(self, message: str):
    if self._speak:
      print(message, flush=True)
