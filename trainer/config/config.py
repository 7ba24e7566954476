"""`Config`: every section of the configuration at once, validated together."""

import dataclasses

from trainer.config.sections import (DistributeConfig, InputConfig, LoopConfig,
                                     OptimizationConfig, RunConfig,
                                     default_model_dir, flag_names)
from trainer.config.values import check_field, parse_class_weight, parse_duration
from trainer.errors import ConfigError
from trainer.flag_spelling import TASK_FLAG_ALIASES, flag_value


@dataclasses.dataclass(frozen=True)
class Config(LoopConfig, OptimizationConfig, InputConfig, DistributeConfig,
             RunConfig):
  """Everything one run needs. Build it directly, or from flags with `from_flags`.

  Example:
    >>> config = Config(cpu_devices=2, train_steps=300, mode="train_and_eval")
    >>> config.optimization.learning_rate
    0.001
  """

  # What acts on evaluations' patience: nothing without evaluations, nor in a run
  # opened read-only (--mode=eval, replay, trainer.load).
  PATIENCE_FIELDS = ("early_stopping_patience", "reduce_lr_patience")

  def __post_init__(self):
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if isinstance(value, dict):
        value = tuple(value.items())
      if isinstance(value, list):
        value = tuple(value)
      if isinstance(value, bool) and "true" in (f.metadata["choices"] or ()):
        value = str(value).lower()  # verify_equivalence=True is "true".
      # Tuples keep the dataclass hashable and immutable.
      object.__setattr__(self, f.name, value)
      check_field(f, value)
    object.__setattr__(self, "task_params", tuple(tuple(p) for p in self.task_params))
    if self.per_replica_batch_size and self.global_batch_size:
      raise ConfigError(f"--global_batch_size={self.global_batch_size} and "
                        f"--per_replica_batch_size={self.per_replica_batch_size}: "
                        "set one of them")
    if self.model_dir is not None and not self.model_dir.strip():
      raise ConfigError("--model_dir=: must name a directory, e.g. runs/r1 (leave "
                        "it out for a new one under runs/)")
    if self.mode in ("eval", "continuous_eval") and not self.model_dir:
      raise ConfigError(f"--mode={self.mode} needs --model_dir of a run")
    if self.strategy == "multi_worker" and not self.model_dir:
      raise ConfigError("--strategy=multi_worker needs --model_dir: every worker "
                        "must name the same directory")
    self._check_optimization()
    self._check_loop()
    # task.NAME entries are checked once the task is known (run.resolve_task).
    known = set(flag_names()) | set(TASK_FLAG_ALIASES)
    unknown = sorted(n for n in set(self.hparams) - known if not n.startswith("task."))
    if unknown:
      raise ConfigError(f"--hparams: unknown flag(s) {', '.join(unknown)}")

  def _check_optimization(self):
    if self.learning_rate == 0:
      raise ConfigError("--learning_rate=0: must be > 0 (a run at rate 0 never "
                        "changes its weights; --mode=eval evaluates a checkpoint)")
    decay_steps = self.decay_steps or self.train_steps
    if self.lr_schedule in ("cosine", "linear", "exponential") and (
        decay_steps <= self.warmup_steps):
      raise ConfigError(f"--decay_steps={decay_steps}: must be more than "
                        f"--warmup_steps={self.warmup_steps} (decay ends after "
                        "warm-up)")
    if self.min_learning_rate > self.learning_rate:
      raise ConfigError(f"--min_learning_rate={self.min_learning_rate}: must be <= "
                        f"--learning_rate={self.learning_rate}")
    if list(self.lr_boundaries) != sorted(set(self.lr_boundaries)) or (
        self.lr_boundaries and self.lr_boundaries[0] < 1):
      raise ConfigError(f"--lr_boundaries={flag_value(self.lr_boundaries)}: must be "
                        "increasing steps >= 1, e.g. 1000,2000")
    if self.lr_schedule == "step" and not self.lr_boundaries:
      raise ConfigError("--lr_schedule=step needs --lr_boundaries, e.g. 1000,2000")
    if self.class_weight is not None:
      parse_class_weight(self.class_weight)
    if self.ema_decay and not 0.0 < self.ema_decay < 1.0:
      raise ConfigError(f"--ema_decay={self.ema_decay}: must be in (0, 1), e.g. 0.999 "
                        "(or 0 for no averaging)")

  def _check_loop(self):
    for name in ("max_time", "hang_timeout", "eval_timeout"):
      if getattr(self, name) is not None:
        parse_duration(getattr(self, name), flag=f"--{name}")
    if self.profile_steps and (len(self.profile_steps) != 2 or
                               not 1 <= self.profile_steps[0] <= self.profile_steps[1]
                               or self.profile_steps[1] > self.train_steps):
      raise ConfigError(f"--profile_steps={flag_value(self.profile_steps)}: must be "
                        "A,B with 1 <= A <= B <= --train_steps, e.g. 10,20")
    for name in self.PATIENCE_FIELDS:
      if getattr(self, name) and not (self.mode in (None, "train_and_eval")
                                      and self.eval_every):
        raise ConfigError(f"--{name}={getattr(self, name)}: needs evaluations: "
                          "--mode=train_and_eval and --eval_every=N")
    if self.reduce_lr_patience and not 0.0 < self.reduce_lr_factor < 1.0:
      raise ConfigError(f"--reduce_lr_factor={self.reduce_lr_factor}: must be in "
                        "(0, 1), e.g. 0.1")
    if self.best_metric is not None and not self.best_metric.startswith("eval/"):
      raise ConfigError(f"--best_metric={self.best_metric}: must be eval/NAME, e.g. "
                        "eval/loss")

  def _section(self, section_class):
    return section_class(**{f.name: getattr(self, f.name)
                            for f in dataclasses.fields(section_class)})

  @property
  def run(self) -> RunConfig:
    return self._section(RunConfig)

  @property
  def distribute(self) -> DistributeConfig:
    return self._section(DistributeConfig)

  @property
  def input(self) -> InputConfig:
    return self._section(InputConfig)

  @property
  def optimization(self) -> OptimizationConfig:
    return self._section(OptimizationConfig)

  @property
  def loop(self) -> LoopConfig:
    return self._section(LoopConfig)

  @property
  def summary_steps(self) -> int:
    """Steps between two train summary points: --summary_every, else about 100
    points per run."""
    return self.summary_every or max(1, self.train_steps // 100)

  @property
  def task_kwargs(self) -> dict:
    """The task's hyperparameters as {name: value}."""
    return dict(self.task_params)

  def replace(self, **changes) -> "Config":
    """Returns a copy with `changes` applied (and validated)."""
    return dataclasses.replace(self, **changes)

  def with_model_dir(self) -> "Config":
    """Returns a copy whose model_dir is set (a new timestamped folder if unset)."""
    return self if self.model_dir else self.replace(model_dir=default_model_dir())

  def value(self, name: str):
    """The value of flag `name`: a Config field, `task.NAME`, or an alias of one
    (--dataset is --task.dataset)."""
    if name.startswith("task.") or name in TASK_FLAG_ALIASES:
      return self.task_kwargs[name.split(".", 1)[-1]]
    return getattr(self, name)

  def to_flags(self) -> list:
    """Returns `--name=value` lines: a flagfile that reproduces this config."""
    lines = [f"--{f.name}={flag_value(getattr(self, f.name))}"
             for f in dataclasses.fields(self)
             if f.metadata["flag"] and getattr(self, f.name) is not None]
    return lines + [f"--task.{name}={flag_value(value)}"
                    for name, value in self.task_params if value is not None]

  def layout_flags(self, task_layout=()) -> dict:
    """Returns {name: flag value} of the flags that fix the model and batch layout.

    Args:
      task_layout: the task's hyperparameters that are part of the layout.
    """
    layout = {f.name: flag_value(getattr(self, f.name))
              for f in dataclasses.fields(self) if f.metadata["layout"]}
    layout.update({f"task.{name}": flag_value(value)
                   for name, value in self.task_params if name in task_layout})
    return layout
