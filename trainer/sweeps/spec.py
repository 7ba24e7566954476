"""Sweep specs: `--grid` and `--random` over trainer flags, expanded into trials.

`--grid=learning_rate=0.01,0.003` tries each value; `--random=NAME=DIST` samples
DIST (`uniform:LO:HI`, `loguniform:LO:HI`, `int:LO:HI`, `choice:A,B,...`) once per
random trial. With both, every random sample is combined with every grid point.
Values are typed by the trainer flag they set (floats stay floats, ints ints,
choices strings), so TensorBoard's HParams sees the right types. This module never
imports TensorFlow: a spec is checked before anything starts.
"""

import dataclasses
import itertools
import math
import random
from typing import Optional

from trainer import config as config_lib
from trainer.errors import ConfigError

DISTRIBUTIONS = ("uniform", "loguniform", "int", "choice")
_SET_BY_SWEEP = ("model_dir", "hparams")
_SIGNIFICANT_DIGITS = 4  # Sampled floats are rounded so trial names stay readable.


@dataclasses.dataclass(frozen=True)
class Param:
  """One swept flag: a grid of values or a distribution to sample."""
  name: str
  distribution: str  # "grid" or one of DISTRIBUTIONS.
  values: tuple = ()  # grid and choice values, typed.
  low: Optional[float] = None
  high: Optional[float] = None

  def sample(self, rng: random.Random):
    if self.distribution == "choice":
      return rng.choice(self.values)
    if self.distribution == "int":
      return rng.randint(int(self.low), int(self.high))
    if self.distribution == "loguniform":
      value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
    else:
      value = rng.uniform(self.low, self.high)
    return float(f"{value:.{_SIGNIFICANT_DIGITS}g}")


@dataclasses.dataclass(frozen=True)
class Trial:
  """One point of the sweep: a name (its run directory) and the swept values."""
  name: str
  values: dict

  def flags(self) -> list:
    return [f"--{name}={flag_text(value)}" for name, value in self.values.items()]


def flag_text(value) -> str:
  """A typed value as a flag writes it (true/false for booleans)."""
  if isinstance(value, bool):
    return "true" if value else "false"
  return str(value)


def _flag_kind(name, option, task_class=None):
  try:
    kind = config_lib.flag_kind(name, task_class)
  except KeyError:
    raise ConfigError(f"{option}: unknown trainer flag --{name}") from None
  if name in _SET_BY_SWEEP:
    raise ConfigError(f"{option}: --{name} is set by the sweep itself")
  if kind is list:
    raise ConfigError(f"{option}: --{name} is a list flag and cannot be swept")
  return kind


def _typed(name, raw, kind, option):
  """Parses one raw value for flag `name`."""
  try:
    if kind is bool:
      if raw.lower() not in ("true", "false"):
        raise ValueError
      value = raw.lower() == "true"
    else:
      value = kind(raw)
  except ValueError:
    raise ConfigError(f"{option}: {raw!r} is not a valid {kind.__name__} for "
                      f"--{name}") from None
  choices = config_lib.field_choices(name)
  if choices and value not in choices:
    raise ConfigError(f"{option}: {raw!r} is not one of --{name}'s values "
                      f"({', '.join(choices)})")
  return value


def _split_assignment(text, option):
  name, sep, rest = text.partition("=")
  if not sep or not name or not rest:
    raise ConfigError(f"{option}={text}: expected NAME=VALUE(S), e.g. "
                      "learning_rate=0.01,0.001")
  return name.strip(), rest.strip()


def parse_grid(text: str, task_class=None) -> Param:
  """Parses `NAME=V1,V2,...` (NAME a trainer flag or `task.NAME` of `task_class`).

  Raises:
    ConfigError: unknown flag, empty grid, repeated or mistyped values.
  """
  option = "--grid"
  name, rest = _split_assignment(text, option)
  kind = _flag_kind(name, f"{option}={text}", task_class)
  raw_values = [v.strip() for v in rest.split(",")]
  if not all(raw_values):
    raise ConfigError(f"{option}={text}: empty value in the grid")
  values = tuple(_typed(name, v, kind, f"{option}={text}") for v in raw_values)
  if len(set(values)) != len(values):
    raise ConfigError(f"{option}={text}: a value is repeated")
  return Param(name=name, distribution="grid", values=values)


def parse_random(text: str, task_class=None) -> Param:
  """Parses `NAME=uniform:LO:HI`, `loguniform:LO:HI`, `int:LO:HI` or `choice:A,B`
  (NAME a trainer flag or `task.NAME` of `task_class`).

  Raises:
    ConfigError: unknown flag or distribution, bad bounds, mistyped values.
  """
  option = f"--random={text}"
  name, rest = _split_assignment(text, "--random")
  kind = _flag_kind(name, option, task_class)
  distribution, _, arguments = rest.partition(":")
  if distribution not in DISTRIBUTIONS:
    raise ConfigError(f"{option}: unknown distribution {distribution!r}; use "
                      "uniform:LO:HI, loguniform:LO:HI, int:LO:HI or choice:A,B,...")
  if distribution == "choice":
    raw_values = [v.strip() for v in arguments.split(",")]
    if not all(raw_values):
      raise ConfigError(f"{option}: choice needs values, e.g. choice:adam,sgd")
    return Param(name=name, distribution="choice",
                 values=tuple(_typed(name, v, kind, option) for v in raw_values))
  wanted = int if distribution == "int" else float
  if kind is not wanted:
    fitting = {int: "int:LO:HI", float: "uniform or loguniform"}.get(kind,
                                                                     "choice:A,B,...")
    raise ConfigError(f"{option}: --{name} holds a {kind.__name__}; use {fitting}")
  bounds = arguments.split(":")
  try:
    low, high = (wanted(b) for b in bounds)
  except ValueError:
    raise ConfigError(f"{option}: expected {distribution}:LO:HI with "
                      f"{wanted.__name__} bounds") from None
  if not low < high or (distribution == "loguniform" and low <= 0):
    raise ConfigError(f"{option}: needs LO < HI" +
                      (" and LO > 0" if distribution == "loguniform" else ""))
  return Param(name=name, distribution=distribution, low=low, high=high)


def trial_name(values: dict, prefix: str = "") -> str:
  """A trial's name (its directory): `prefix` and NAME=VALUE pairs."""
  parts = [f"{k}={flag_text(v)}" for k, v in values.items()]
  return (prefix + ",".join(parts)).replace("/", "_")


def check_params(params: list):
  """Raises ConfigError when there is nothing to sweep or a flag is swept twice."""
  if not params:
    raise ConfigError("nothing to sweep: give at least one --grid or --random")
  names = [p.name for p in params]
  repeated = sorted({n for n in names if names.count(n) > 1})
  if repeated:
    raise ConfigError(f"--{repeated[0]} is swept more than once")


def expand(params: list, *, trials: int, seed: int) -> list:
  """The sweep's trials, in a fixed order (same spec and seed: same trials).

  Args:
    params: parsed grid and random params, each flag at most once.
    trials: random samples to draw (ignored without random params).
    seed: seed of the random samples.

  Returns:
    A list of Trial with unique names.

  Raises:
    ConfigError: no params, a flag swept twice, or fewer than 1 random trial.
  """
  check_params(params)
  grid = [p for p in params if p.distribution == "grid"]
  sampled = [p for p in params if p.distribution != "grid"]
  points = [dict(zip([p.name for p in grid], combo))
            for combo in itertools.product(*[p.values for p in grid])]
  if not sampled:
    return [Trial(name=trial_name(point), values=point) for point in points]
  if trials < 1:
    raise ConfigError(f"--trials={trials}: must be at least 1 with --random")
  rng = random.Random(seed)
  width = len(str(trials - 1))
  result = []
  for index in range(trials):
    sample = {p.name: p.sample(rng) for p in sampled}
    for point in points:
      values = dict(point, **sample)
      result.append(Trial(name=trial_name(values, prefix=f"{index:0{width}d}-"),
                          values=values))
  return result


def read_spec_file(path: str) -> list:
  """The sweep options in a `.sweep` file: one per line, `#` comments.

  Raises:
    ConfigError: the file cannot be read.
  """
  try:
    with open(path) as f:
      lines = [line.strip() for line in f]
  except OSError as e:
    raise ConfigError(f"--spec={path}: {e.strerror}") from None
  return [line for line in lines if line and not line.startswith("#")]
