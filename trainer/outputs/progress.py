"""Progress lines, and their parser (sweeps read trials' lines).

The line formats live here, next to the parser, so changing one changes the other:

    step 1/300  loss 2.3061  accuracy 0.0938  (compiling: 1.84 s)  ETA ?
    step 100/300  loss 0.4211  accuracy 0.8750  45,120 examples/s  ETA 0:00:02
    eval at step 100: loss 0.4253  accuracy 0.8778  (360 examples)

The first loop call of a process traces the loop: its time is compilation's, not
a throughput.

Each line holds the loss and the task's metrics as `name value` pairs. This module
does not import TensorFlow.
"""

import re

_STEP_LINE = re.compile(r"^step (?P<step>\d+)/(?P<total>\d+)  (?P<pairs>.*?)  "
                        r"([\d,]+ examples/s|\(compiling: [\d.]+ s\))")
_EVAL_LINE = re.compile(
    r"^eval at step (?P<step>\d+): (?P<pairs>.*?)  \(\d+ examples\)")
_PAIR = re.compile(r"^(?P<name>\S+) (?P<value>\S+)$")


def format_metrics(metrics: dict) -> str:
  """`loss 0.1234  accuracy 0.9000`: every scalar metric but the example count
  (a confusion matrix is in results.json and TensorBoard, not on a line)."""
  return "  ".join(f"{name} {format_number(value)}" for name, value in metrics.items()
                   if name != "examples" and not isinstance(value, list))


def format_number(value: float) -> str:
  """Four decimals, or four significant digits where those would show 0.0000
  (a loss weighted by 1/count per class is 1e-6)."""
  if value == 0 or not 0 < abs(value) < 5e-4:
    return f"{value:.4f}"
  return f"{value:.4g}"


def _pairs(text: str, split: str) -> dict:
  values = {}
  for part in text.split("  "):
    match = _PAIR.match(part)
    if match:
      try:
        values[f"{split}/{match['name']}"] = float(match["value"])
      except ValueError:
        pass
  return values


def parse_line(line: str) -> dict:
  """{"step", "train/NAME" ...} or {"step", "eval/NAME" ...} from a progress line.

  Returns:
    The values the line reports ({} for other lines).
  """
  for pattern, split in ((_STEP_LINE, "train"), (_EVAL_LINE, "eval")):
    match = pattern.match(line)
    if match:
      return {"step": int(match["step"]), **_pairs(match["pairs"], split)}
  return {}


def step_line(step: int, total: int, metrics: dict, *, examples_per_second: float,
              eta: str, compiled_seconds=None) -> str:
  """`step 100/300  loss 0.4211  accuracy 0.8750  45,120 examples/s  ETA 0:00:02`,
  or for a call that traced, `(compiling: 1.84 s)` instead of the rate."""
  rate = (f"(compiling: {compiled_seconds:.2f} s)" if compiled_seconds is not None
          else f"{examples_per_second:,.0f} examples/s")
  return f"step {step}/{total}  {format_metrics(metrics)}  {rate}  ETA {eta}"


def eval_line(step: int, metrics: dict) -> str:
  """`eval at step 100: loss 0.4253  accuracy 0.8778  (360 examples)`; `metrics`
  holds "examples", the count."""
  return (f"eval at step {step}: {format_metrics(metrics)}  "
          f"({metrics['examples']} examples)")


def duration(seconds: float) -> str:
  """`1:02:03`."""
  seconds = int(max(seconds, 0))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
