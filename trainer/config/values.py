"""How a flag's value is read and checked: durations (90m, 2h), class weights
(0:1,1:50) and a field's choices and bounds. Imports neither absl nor
TensorFlow."""

import dataclasses
import math

from trainer.errors import ConfigError

MAX_DURATION_SECONDS = 100 * 365 * 86400.0  # --max_time, --hang_timeout: a century.
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, *, flag: str) -> float:
  """Seconds in "90m", "2h", "3600s", "1.5h" or a plain number of seconds.

  Raises:
    ConfigError: naming the flag and the forms that are valid.
  """
  value, unit = text.strip().lower(), "s"
  if value and value[-1] in _UNITS:
    value, unit = value[:-1], value[-1]
  try:
    seconds = float(value) * _UNITS[unit]
  except ValueError:
    seconds = float("nan")
  if not (math.isfinite(seconds) and 0 < seconds <= MAX_DURATION_SECONDS):
    raise ConfigError(f"{flag}={text}: must be a positive duration of at most 100 "
                      "years, such as 90m, 2h or 3600s")
  return seconds


def parse_class_weight(text: str) -> dict:
  """{class id: weight} of "0:1,1:50".

  Raises:
    ConfigError: naming --class_weight and the valid form.
  """
  weights = {}
  try:
    for pair in text.split(","):
      label, weight = pair.split(":")
      weights[int(label)] = float(weight)
  except ValueError:
    weights = {}
  if not weights or min(weights) < 0 or not all(
      math.isfinite(w) and w >= 0 for w in weights.values()):
    raise ConfigError(f"--class_weight={text}: must be CLASS:WEIGHT pairs with "
                      "class ids >= 0 and finite weights >= 0, e.g. 0:1,1:50")
  return weights


def check_field(f: dataclasses.Field, value):
  """Raises ConfigError when `value` breaks field `f`'s choices or bounds."""
  meta = f.metadata
  if value is None or not meta["flag"]:
    return
  if meta["choices"] and value not in meta["choices"]:
    raise ConfigError(f"--{f.name}={value}: must be one of "
                      f"{', '.join(meta['choices'])}")
  if isinstance(value, float) and not math.isfinite(value):
    raise ConfigError(f"--{f.name}={value}: must be a finite number")
  if meta["lower"] is not None and value < meta["lower"]:
    raise ConfigError(f"--{f.name}={value}: must be >= {meta['lower']}")
  if meta["upper"] is not None and value > meta["upper"]:
    raise ConfigError(f"--{f.name}={value}: must be <= {meta['upper']}")
