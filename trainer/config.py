"""Every flag of `trainer`, defined once, and the frozen `Config` they fill.

The `Config` dataclass is the single source: each field carries its help text and
bounds, `define_flags()` turns the fields into absl flags, and `Config.__post_init__`
validates, so the CLI and Python callers (`trainer.train(Config(...))`, tests, sweeps)
get the same checks and the same one-line errors. This module and `trainer/main.py`
are the only ones that touch absl FLAGS, and this one never imports TensorFlow, so
scripts can validate flags cheaply.
"""

import dataclasses
import math
import datetime
import os
import typing
from typing import Any, Optional, Sequence, Tuple

from trainer.errors import ConfigError

MODES = ("train", "eval", "train_and_eval")
DATASETS = ("digits", "mnist", "npz", "synthetic", "tfrecord")
MODELS = ("cnn", "mlp", "resnet")
ARRAY_INPUTS = ("gather", "dataset")
STRATEGIES = ("mirrored", "one_device", "multi_worker")
CLUSTER_RESOLVERS = ("tf_config", "slurm")
CROSS_DEVICE_OPS = ("auto", "ring", "nccl", "hierarchical_copy", "reduce_to_one_device")
OPTIMIZERS = ("adam", "adamw", "lion", "sgd", "momentum")
LR_SCHEDULES = ("constant", "cosine", "linear", "step", "exponential")
ON_NAN = ("stop", "rollback")
MIXED_PRECISION = ("none", "mixed_bfloat16", "mixed_float16")
MAX_CPU_DEVICES = 64
MAX_THREADS = 1024
MAX_SYNTHETIC_VALUES = 2**28  # 1 GiB of float32.
DEFAULT_PER_REPLICA_BATCH_SIZE = 32
HANG_TIMEOUT_FLOOR_SECONDS = 600.0  # --hang_timeout unset: at least 10 minutes.


def _field(default, help_text, *, choices=None, lower=None, upper=None, layout=False,
           flag=True):
  """A Config field whose metadata also defines its flag.

  Args:
    default: the default value (lists are stored as tuples).
    help_text: the flag's help.
    choices: allowed values of a string field.
    lower: smallest allowed value of a number field.
    upper: largest allowed value of a number field.
    layout: whether changing it on an existing model_dir changes the model or the
      batch layout, so a checkpoint made with another value cannot be resumed.
    flag: whether it is a command-line flag (task_params is set by --task.NAME).
  """
  return dataclasses.field(
      default=default,
      metadata=dict(help=help_text, choices=choices, lower=lower, upper=upper,
                    layout=layout, flag=flag))


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything one run needs. Build it directly, or from flags with `from_flags`."""
  # What to do and where.
  mode: str = _field("train", "train: train only; train_and_eval: train, evaluating "
                     "every --eval_every steps and at the end; eval: evaluate the "
                     "latest checkpoint of --model_dir.", choices=MODES)
  model_dir: Optional[str] = _field(
      None, "Run directory (events, checkpoints, results.json). Default: a new "
      "timestamped folder under runs/.")
  # The problem: a task, and its hyperparameters (--task.NAME=VALUE).
  task: str = _field("classification", "classification (--dataset, --model), "
                     "regression (scikit-learn's diabetes data) or MODULE:CLASS of "
                     "a trainer.Task subclass; its fields are --task.NAME flags.",
                     layout=True)
  task_params: Tuple[Tuple[str, Any], ...] = _field(
      (), "The task's hyperparameters as (name, value) pairs.", flag=False)
  # Data (of the classification task).
  dataset: str = _field("digits", "Classification: digits (8x8, scikit-learn's, shipped inside trainer, offline), "
                        "mnist, npz (any .npz with x_train, y_train, x_test, y_test), "
                        "synthetic, or tfrecord (--train_files, --eval_files).",
                        choices=DATASETS, layout=True)
  data_path: Optional[str] = _field(
      None, "A local .npz file: required for npz; for mnist, a local mnist.npz "
      "instead of the download.")
  train_files: Optional[str] = _field(
      None, "--dataset=tfrecord: glob of the training shards (tf.train.Example "
      "records, see the README's record layout), e.g. 'data/digits/train-*'.")
  eval_files: Optional[str] = _field(
      None, "--dataset=tfrecord: glob of the evaluation shards (optional).")
  num_classes: int = _field(
      0, "--dataset=tfrecord: number of classes (0 = from the shards' dataset.json "
      "index, written by scripts/make_tfrecords.py).", lower=0, upper=100_000,
      layout=True)
  synthetic_examples: int = _field(2048, "Training examples of --dataset=synthetic.",
                                   lower=1, upper=10_000_000)
  synthetic_shape: Sequence[int] = _field(
      (28, 28, 1), "Example shape of --dataset=synthetic, e.g. 28,28,1.", layout=True)
  shuffle: bool = _field(True, "Shuffle the training set each epoch (arrays: a "
                         "stateless permutation of (seed, epoch); a tf.data task: a "
                         "seeded buffer).")
  array_input: str = _field(
      "gather", "How array data reaches the replicas: gather (each replica gathers "
      "its batch in-graph from a copy of the arrays on its device, by (seed, step, "
      "replica): no iterator) or dataset (tf.data and "
      "experimental_distribute_dataset). The same examples either way; arrays over "
      "1 GiB always use dataset.", choices=ARRAY_INPUTS)
  shuffle_buffer: int = _field(10000, "Shuffle buffer of streamed data (a task's "
                               "tf.data.Dataset or pipeline function, TFRecord files).",
                               lower=1)
  # Model.
  model: str = _field("cnn", "Classification: cnn (Conv2D(32,3)-MaxPool-Flatten-Dense(64)-Dense), mlp "
                      "or resnet (a small ResNet).", choices=MODELS, layout=True)
  dropout: float = _field(0.0, "Classification: dropout rate before the last layer (0 = none).",
                          lower=0.0, upper=0.95, layout=True)
  l2: float = _field(0.0, "L2 weight regularization factor on kernels.", lower=0.0,
                     layout=True)
  # Devices and distribution.
  strategy: str = _field("mirrored", "mirrored (every local device), one_device, or "
                         "multi_worker (MultiWorkerMirroredStrategy).",
                         choices=STRATEGIES)
  cluster_resolver: str = _field(
      "tf_config", "Where multi_worker finds the cluster: tf_config (TF_CONFIG) or "
      "slurm.", choices=CLUSTER_RESOLVERS)
  cross_device_ops: str = _field(
      "auto", "All-reduce implementation: auto, ring or nccl (multi_worker); nccl, "
      "hierarchical_copy or reduce_to_one_device (mirrored). Alias: --communication.",
      choices=CROSS_DEVICE_OPS)
  cpu_devices: int = _field(1, "Split the CPU into this many logical devices (used "
                            "when no GPU is visible).", lower=1, upper=MAX_CPU_DEVICES)
  gpus: Optional[Sequence[int]] = _field(
      None, "Indices of the GPUs to use, e.g. 0,1. Default: all.")
  memory_growth: bool = _field(True, "Let GPU memory grow instead of taking it all.")
  intra_op_threads: int = _field(
      0, "TensorFlow intra-op threads (0 = the usable cores / --cpu_devices when the "
      "CPU is split into replicas, else TF's default).", lower=0, upper=MAX_THREADS)
  inter_op_threads: int = _field(0, "TensorFlow inter-op threads (0 = TF's default).",
                                 lower=0, upper=MAX_THREADS)
  # Steps and batches.
  # Not layout flags: a run may resume on other replicas with the same global
  # batch (the checkpoint's run record holds it; see RunState.resume_changes).
  per_replica_batch_size: Optional[int] = _field(
      None, "Examples per replica per step; the global batch is this times the "
      f"replica count. Default: {DEFAULT_PER_REPLICA_BATCH_SIZE} (unless "
      "--global_batch_size is set).", lower=1)
  global_batch_size: Optional[int] = _field(
      None, "Examples per step over all replicas, instead of "
      "--per_replica_batch_size: each replica gets this divided by the replica "
      "count, so a run can resume on other hardware with the same batches.",
      lower=1)
  train_steps: int = _field(200, "Total training steps (a rerun resumes up to it).",
                            lower=1)
  steps_per_loop: int = _field(0, "Steps per tf.function call (0 = automatic: about "
                               "one second per call).", lower=0)
  summary_every: int = _field(0, "At most this many steps between summaries (0 = "
                              "once per loop call).", lower=0)
  # Optimization.
  optimizer: str = _field("adam", "adam, adamw (decoupled --weight_decay), lion, sgd "
                          "or momentum.", choices=OPTIMIZERS, layout=True)
  learning_rate: float = _field(1e-3, "Peak learning rate (the schedule scales it).",
                                lower=0.0)
  momentum: float = _field(0.9, "Momentum of --optimizer=momentum.", lower=0.0,
                           upper=1.0)
  weight_decay: float = _field(0.01, "Decoupled weight decay of --optimizer=adamw "
                               "and lion.", lower=0.0)
  lr_schedule: str = _field("constant", "constant, cosine, linear (to "
                            "--min_learning_rate at --decay_steps), step (times "
                            "--lr_decay_factor at each --lr_boundaries step) or "
                            "exponential (times --lr_decay_factor by --decay_steps); "
                            "after --warmup_steps.", choices=LR_SCHEDULES)
  warmup_steps: int = _field(0, "Steps of linear warm-up from 0 to --learning_rate.",
                             lower=0)
  decay_steps: Optional[int] = _field(None, "Step at which cosine, linear and "
                                      "exponential decay end. Default: "
                                      "--train_steps.", lower=1)
  min_learning_rate: float = _field(0.0, "Floor of every schedule.", lower=0.0)
  lr_boundaries: Sequence[int] = _field((), "Steps at which --lr_schedule=step "
                                        "multiplies the rate by --lr_decay_factor.")
  lr_decay_factor: float = _field(0.1, "Factor of the step and exponential "
                                  "schedules.", lower=0.0, upper=1.0)
  clip_norm: float = _field(0.0, "Clip the all-reduced gradients to this global norm "
                            "(0 = off).", lower=0.0)
  grad_accum_steps: int = _field(1, "Micro-batches accumulated per update: N steps "
                                 "of one per-replica batch each make one optimizer "
                                 "step (an N times larger batch in the same memory).",
                                 lower=1, upper=1024, layout=True)
  ema_decay: float = _field(0.0, "Keep an exponential moving average of the weights "
                            "with this decay, e.g. 0.999 (0 = off).", lower=0.0,
                            layout=True)
  eval_with_ema: bool = _field(True, "With --ema_decay: evaluate and export the "
                               "averaged weights.")
  init_checkpoint: Optional[str] = _field(
      None, "Warm start: initialise the model's weights (not the optimizer or the "
      "step) from this checkpoint or run directory before step 0.")
  mixed_precision: str = _field("none", "none, mixed_bfloat16 or mixed_float16 (with "
                                "loss scaling).", choices=MIXED_PRECISION, layout=True)
  jit_compile: bool = _field(False, "Compile the replica step with XLA.")
  seed: int = _field(0, "Seed of weights, dropout and data order.", lower=0,
                     upper=2**32 - 1, layout=True)
  deterministic: bool = _field(False, "Enable TensorFlow op determinism (bit-exact "
                               "reruns and resumes).")
  # Evaluation, checkpoints, faults.
  best_metric: Optional[str] = _field(
      None, "The metric that picks the best evaluation, eval/NAME (default: the "
      "task's, e.g. eval/accuracy).")
  best_goal: Optional[str] = _field(
      None, "max or min: which way --best_metric is better (default: the task's).",
      choices=("max", "min"))
  eval_every: int = _field(0, "With --mode=train_and_eval: evaluate every N steps "
                           "(0 = only at the end).", lower=0)
  checkpoint_every: int = _field(100, "Save a checkpoint every N steps (and at the "
                                 "end).", lower=1)
  keep_checkpoints: int = _field(3, "Checkpoints to keep.", lower=1)
  export_dir: Optional[str] = _field(None, "SavedModel destination. Default: "
                                     "MODEL_DIR/export.")
  on_nan: str = _field("stop", "On a non-finite loss or gradient: stop, or rollback "
                       "(restore the last checkpoint, halve the learning rate, at "
                       "most 3 times).", choices=ON_NAN)
  early_stopping_patience: int = _field(0, "Stop after this many evaluations without "
                                        "an improvement of --best_metric (0 = off).",
                                        lower=0)
  early_stopping_min_delta: float = _field(0.0, "The least change of --best_metric "
                                           "that counts as an improvement.",
                                           lower=0.0)
  max_time: Optional[str] = _field(None, "Time budget of this invocation, e.g. 90m, "
                                   "2h, 3600s: stop (with a checkpoint) after the "
                                   "first loop call past it.")
  hang_timeout: Optional[str] = _field(
      None, "Longest a loop call, evaluation or checkpoint may take (and, with "
      "multi_worker, a collective), e.g. 15m: past it the process writes "
      "MODEL_DIR/hang-WORKER.txt with every thread's stack and exits 7. Default: "
      "the larger of 10m and 20 times the median loop call.")
  profile_steps: Sequence[int] = _field((), "A,B: record a TensorFlow profile of "
                                        "steps A to B under MODEL_DIR/train (the "
                                        "Profile tab).")
  # Inspection.
  summaries: bool = _field(True, "Write TensorBoard summaries and progress lines.")
  hparams: Sequence[str] = _field((), "Flag names to record as TensorBoard HParams "
                                  "(sweeps set this).")

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if isinstance(value, dict):
        value = tuple(value.items())
      if isinstance(value, list):
        value = tuple(value)
      # Tuples keep the dataclass hashable and immutable.
      object.__setattr__(self, field.name, value)
      _check_field(field, value)
    object.__setattr__(self, "task_params", tuple(tuple(p) for p in self.task_params))
    if self.per_replica_batch_size and self.global_batch_size:
      raise ConfigError(f"--global_batch_size={self.global_batch_size} and "
                        f"--per_replica_batch_size={self.per_replica_batch_size}: "
                        "set one of them")
    if self.dataset == "tfrecord" and not self.train_files:
      raise ConfigError("--dataset=tfrecord needs --train_files=GLOB, e.g. "
                        "--train_files='data/digits/train-*'")
    if self.dataset != "tfrecord" and (self.train_files or self.eval_files):
      raise ConfigError(f"--train_files/--eval_files: only read with "
                        f"--dataset=tfrecord, not --dataset={self.dataset}")
    if self.dataset == "npz" and not self.data_path:
      raise ConfigError("--dataset=npz needs --data_path=FILE.npz")
    if self.data_path and not os.path.isfile(self.data_path):
      raise ConfigError(f"--data_path={self.data_path}: no such file")
    if len(self.synthetic_shape) not in (1, 2, 3) or min(self.synthetic_shape) < 1:
      raise ConfigError(f"--synthetic_shape={_flag_value(self.synthetic_shape)}: "
                        "must be 1 to 3 positive sizes, e.g. 28,28,1")
    values = self.synthetic_examples * math.prod(self.synthetic_shape)
    if self.dataset == "synthetic" and values > MAX_SYNTHETIC_VALUES:
      raise ConfigError(f"--synthetic_examples={self.synthetic_examples} x "
                        f"--synthetic_shape={_flag_value(self.synthetic_shape)}: "
                        f"{values * 4 / 2**30:.1f} GiB of data; at most "
                        f"{MAX_SYNTHETIC_VALUES * 4 / 2**30:.0f} GiB")
    if self.mode == "eval" and not self.model_dir:
      raise ConfigError("--mode=eval needs --model_dir of a trained run")
    if self.strategy == "multi_worker" and not self.model_dir:
      raise ConfigError("--strategy=multi_worker needs --model_dir: every worker "
                        "must name the same directory")
    self._check_optimization()
    for name in ("max_time", "hang_timeout"):
      if getattr(self, name) is not None:
        parse_duration(getattr(self, name), flag=f"--{name}")
    if self.profile_steps and (len(self.profile_steps) != 2 or
                               not 1 <= self.profile_steps[0] <= self.profile_steps[1]
                               or self.profile_steps[1] > self.train_steps):
      raise ConfigError(f"--profile_steps={_flag_value(self.profile_steps)}: must be "
                        "A,B with 1 <= A <= B <= --train_steps, e.g. 10,20")
    if self.early_stopping_patience and not (self.mode == "train_and_eval" and
                                             self.eval_every):
      raise ConfigError(f"--early_stopping_patience={self.early_stopping_patience}: "
                        "needs evaluations: --mode=train_and_eval and --eval_every=N")
    if self.best_metric is not None and not self.best_metric.startswith("eval/"):
      raise ConfigError(f"--best_metric={self.best_metric}: must be eval/NAME, e.g. "
                        "eval/loss")
    # task.NAME entries are checked once the task is known (setup.resolve_task).
    unknown = sorted(n for n in set(self.hparams) - set(field_names())
                     if not n.startswith("task."))
    if unknown:
      raise ConfigError(f"--hparams: unknown flag(s) {', '.join(unknown)}")

  def _check_optimization(self):
    decay_steps = self.decay_steps or self.train_steps
    if self.lr_schedule in ("cosine", "linear", "exponential") and (
        decay_steps <= self.warmup_steps):
      raise ConfigError(f"--decay_steps={decay_steps}: must be more than "
                        f"--warmup_steps={self.warmup_steps} (decay ends after warm-up)")
    if self.min_learning_rate > self.learning_rate:
      raise ConfigError(f"--min_learning_rate={self.min_learning_rate}: must be <= "
                        f"--learning_rate={self.learning_rate}")
    if list(self.lr_boundaries) != sorted(set(self.lr_boundaries)) or (
        self.lr_boundaries and self.lr_boundaries[0] < 1):
      raise ConfigError(f"--lr_boundaries={_flag_value(self.lr_boundaries)}: must be "
                        "increasing steps >= 1, e.g. 1000,2000")
    if self.lr_schedule == "step" and not self.lr_boundaries:
      raise ConfigError("--lr_schedule=step needs --lr_boundaries, e.g. 1000,2000")
    if self.ema_decay and not 0.0 < self.ema_decay < 1.0:
      raise ConfigError(f"--ema_decay={self.ema_decay}: must be in (0, 1), e.g. 0.999 "
                        "(or 0 for no averaging)")

  def batch_sizes(self, num_replicas: int, *, exact: bool = True) -> tuple:
    """(per-replica batch, global batch) on `num_replicas` replicas.

    Args:
      num_replicas: replicas in sync.
      exact: --global_batch_size must divide evenly (training); otherwise the
        per-replica batch is rounded up (an evaluation pads its batches anyway).

    Raises:
      ConfigError: --global_batch_size is not a multiple of the replica count.
    """
    if self.global_batch_size is None:
      per_replica = self.per_replica_batch_size or DEFAULT_PER_REPLICA_BATCH_SIZE
      return per_replica, per_replica * num_replicas
    per_replica = -(-self.global_batch_size // num_replicas)
    if exact and self.global_batch_size % num_replicas:
      raise ConfigError(
          f"--global_batch_size={self.global_batch_size}: must be a multiple of the "
          f"{num_replicas} replicas, e.g. {per_replica * num_replicas}")
    return per_replica, per_replica * num_replicas

  @property
  def max_time_seconds(self) -> Optional[float]:
    """--max_time in seconds (None when unset)."""
    return None if self.max_time is None else parse_duration(self.max_time,
                                                             flag="--max_time")

  @property
  def hang_timeout_seconds(self) -> Optional[float]:
    """--hang_timeout in seconds (None when unset: the watchdog's default)."""
    return None if self.hang_timeout is None else parse_duration(
        self.hang_timeout, flag="--hang_timeout")

  @property
  def task_kwargs(self) -> dict:
    """The task's hyperparameters as {name: value}."""
    return dict(self.task_params)

  def replace(self, **changes) -> "Config":
    """Returns a copy with `changes` applied (and validated)."""
    return dataclasses.replace(self, **changes)

  def with_model_dir(self) -> "Config":
    """Returns a copy whose model_dir is set (a new timestamped folder if unset)."""
    if self.model_dir:
      return self
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return self.replace(model_dir=os.path.join("runs", stamp))

  def value(self, name: str):
    """The value of flag `name`, a Config field or `task.NAME`."""
    if name.startswith("task."):
      return self.task_kwargs[name[len("task."):]]
    return getattr(self, name)

  def to_flags(self) -> list:
    """Returns `--name=value` lines: a flagfile that reproduces this config."""
    lines = [f"--{field.name}={_flag_value(getattr(self, field.name))}"
             for field in dataclasses.fields(self)
             if field.metadata["flag"] and getattr(self, field.name) is not None]
    return lines + [f"--task.{name}={_flag_value(value)}"
                    for name, value in self.task_params]

  def layout_flags(self, task_layout=()) -> dict:
    """Returns {name: flag value} of the flags that fix the model and batch layout.

    Args:
      task_layout: the task's hyperparameters that are part of the layout.
    """
    layout = {field.name: _flag_value(getattr(self, field.name))
              for field in dataclasses.fields(self) if field.metadata["layout"]}
    layout.update({f"task.{name}": _flag_value(value)
                   for name, value in self.task_params if name in task_layout})
    return layout


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
  if not (math.isfinite(seconds) and seconds > 0):
    raise ConfigError(f"{flag}={text}: must be a positive duration such as 90m, 2h "
                      "or 3600s")
  return seconds


def _flag_fields():
  return [f for f in dataclasses.fields(Config) if f.metadata["flag"]]


def flag_table() -> str:
  """The README's flag table (Markdown), generated from the fields' metadata."""
  rows = ["| Flag | Default | Meaning |", "|---|---|---|"]
  for field in _flag_fields():
    default = "" if field.default is None else f"`{_flag_value(field.default)}`"
    rows.append(f"| `--{field.name}` | {default} | {field.metadata['help']} |")
  return "\n".join(rows)


def field_names() -> list:
  """Names of all Config flags (its fields but task_params)."""
  return [field.name for field in _flag_fields()]


def _field_named(name: str) -> dataclasses.Field:
  """The Config field of flag `name`; KeyError if there is none."""
  return {f.name: f for f in _flag_fields()}[name]


def field_kind(name: str) -> type:
  """The type flag `name` holds (str, int, float, bool or list); KeyError if none.

  `task.NAME` flags are typed by the default task's fields; see `flag_kind` for
  another task.
  """
  return _base_type(_field_named(name))


def flag_kind(name: str, task_class=None) -> type:
  """The type of flag `name`, a Config flag or `task.NAME` of `task_class`.

  Raises:
    KeyError: no such flag.
  """
  if name.startswith("task."):
    from trainer import tasks  # pylint: disable=g-import-not-at-top
    task_class = task_class or tasks.load_task_class(Config.task)
    if name[len("task."):] not in [f.name for f in tasks.hyperparameters(task_class)]:
      raise KeyError(name)
    return tasks.param_type(task_class, name[len("task."):])
  return field_kind(name)


def field_choices(name: str):
  """The values flag `name` allows, or None when it is not an enum."""
  if name.startswith("task."):
    return None
  return _field_named(name).metadata["choices"]


def _flag_value(value) -> str:
  if isinstance(value, (tuple, list)):
    return ",".join(str(v) for v in value)
  if isinstance(value, bool):
    return "true" if value else "false"
  return str(value)


def _check_field(field, value):
  meta = field.metadata
  if value is None or not meta["flag"]:
    return
  if meta["choices"] and value not in meta["choices"]:
    raise ConfigError(f"--{field.name}={value}: must be one of "
                      f"{', '.join(meta['choices'])}")
  if isinstance(value, float) and not math.isfinite(value):
    raise ConfigError(f"--{field.name}={value}: must be a finite number")
  if meta["lower"] is not None and value < meta["lower"]:
    raise ConfigError(f"--{field.name}={value}: must be >= {meta['lower']}")
  if meta["upper"] is not None and value > meta["upper"]:
    raise ConfigError(f"--{field.name}={value}: must be <= {meta['upper']}")


def _base_type(field):
  """The Python type a field's flag holds: str, int, float, bool or list."""
  hint = typing.get_type_hints(Config)[field.name]
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  if typing.get_origin(hint) is typing.Union:
    hint = args[0]
  return list if typing.get_origin(hint) is not None or hint is Sequence else hint


def _define(flags, flag_values, *, name, kind, default, help_text, choices=None):
  kwargs = dict(name=name, default=default, help=help_text, flag_values=flag_values)
  if choices:
    flags.DEFINE_enum(enum_values=list(choices), **kwargs)
  elif kind is bool:
    flags.DEFINE_bool(**kwargs)
  elif kind is int:
    flags.DEFINE_integer(**kwargs)
  elif kind is float:
    flags.DEFINE_float(**kwargs)
  elif kind is list:
    kwargs["default"] = None if default is None else [str(v) for v in default]
    flags.DEFINE_list(**kwargs)
  else:
    flags.DEFINE_string(**kwargs)


def define_flags(flag_values=None):
  """Defines one absl flag per Config field (on absl's global FLAGS by default)."""
  from absl import flags  # Only the CLI needs absl's flag machinery.
  if flag_values is None:
    flag_values = flags.FLAGS
  for field in _flag_fields():
    _define(flags, flag_values, name=field.name, kind=_base_type(field),
            default=field.default, help_text=field.metadata["help"],
            choices=field.metadata["choices"])
  # The name MultiWorkerMirroredStrategy's own options use for the same choice.
  flags.DEFINE_alias("communication", "cross_device_ops", flag_values=flag_values)


def define_task_flags(task_class, flag_values=None):
  """Defines `--task.NAME` for each hyperparameter of `task_class`."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from trainer import tasks  # pylint: disable=g-import-not-at-top
  if flag_values is None:
    flag_values = flags.FLAGS
  defaults = tasks.param_defaults(task_class)
  for field in tasks.hyperparameters(task_class):
    name = f"task.{field.name}"
    if name in flag_values:
      continue
    _define(flags, flag_values, name=name,
            kind=tasks.param_type(task_class, field.name),
            default=defaults.get(field.name),
            help_text=f"Hyperparameter {field.name} of task {task_class.__name__}.")


def _expand(argv, flag_values) -> list:
  """`argv` (without the program name) with its flagfiles expanded.

  Raises:
    ConfigError: a flagfile cannot be read.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  try:
    expanded = flag_values.read_flags_from_files(list(argv), force_gnu=False)
  except (flags.Error, UnicodeDecodeError) as e:
    raise ConfigError(str(e).splitlines()[0]) from None
  return expanded[:expanded.index("--")] if "--" in expanded else expanded


def prepare_flags(argv: Sequence[str], flag_values=None):
  """Loads the task a command line names and defines its `--task.NAME` flags.

  Call before parsing `argv` (which includes the program name).

  Raises:
    ConfigError: the task cannot be loaded, it has no hyperparameter that a
      `--task.NAME` names, or a flagfile cannot be read.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  from trainer import tasks  # pylint: disable=g-import-not-at-top
  flag_values = flags.FLAGS if flag_values is None else flag_values
  expanded = _expand(argv[1:], flag_values)
  spec, names = Config.task, []
  for index, arg in enumerate(expanded):
    name, has_value, value = arg.lstrip("-").partition("=")
    if not arg.startswith("-"):
      continue
    if name == "task":  # absl takes --task=X, --task X, -task=X and -task X.
      spec = value if has_value else (expanded[index + 1:index + 2] or [""])[0]
    elif name.startswith(("task.", "notask.")):
      names.append(name.split(".", 1)[1])
  task_class = tasks.load_task_class(spec)
  tasks.check_param_names(spec, task_class, names)
  define_task_flags(task_class, flag_values)


def from_flags(flag_values=None) -> Config:
  """Builds a Config from parsed absl flags (those of `prepare_flags` included).

  Raises:
    ConfigError: a flag value is invalid.
  """
  from absl import flags
  from trainer import tasks  # pylint: disable=g-import-not-at-top
  if flag_values is None:
    flag_values = flags.FLAGS
  values = {}
  for field in _flag_fields():
    value = flag_values[field.name].value
    if _base_type(field) is list and value is not None:
      value = tuple(_parse_list_item(field, item) for item in value)
    values[field.name] = value
  task_class = tasks.load_task_class(values["task"])
  params = {}
  for field in tasks.hyperparameters(task_class):
    flag = flag_values[f"task.{field.name}"]
    if flag.value is None:
      raise ConfigError(f"--task.{field.name}: task {values['task']} needs a value")
    params[field.name] = flag.value
  config = Config(task_params=tuple(params.items()), **values)
  tasks.build_task(config.task, config.task_kwargs)  # Checks the values.
  return config


def _parse(argv: Sequence[str], flag_values) -> Config:
  from absl import flags  # pylint: disable=g-import-not-at-top
  argv = ["trainer", *argv]
  prepare_flags(argv, flag_values)
  try:
    rest = flag_values(argv)
  except flags.Error as e:
    raise ConfigError(str(e).splitlines()[0]) from None
  if len(rest) > 1:
    raise ConfigError(f"unexpected arguments {' '.join(rest[1:])!r}")
  return from_flags(flag_values)


def from_argv(argv: Sequence[str]) -> Config:
  """Parses trainer flags (`--flagfile=F`, `--name=value`) exactly as the CLI does.

  Uses private FlagValues, so sweeps and scripts can check a trial's command line
  without touching the global FLAGS (nor importing TensorFlow, unless the task's
  own module does).

  Raises:
    ConfigError: an unknown or malformed flag, an invalid value or task.
  """
  from absl import flags
  flag_values = flags.FlagValues()
  define_flags(flag_values)
  return _parse(argv, flag_values)


def _parse_list_item(field, item):
  if field.name == "hparams":
    return item
  try:
    return int(item)
  except ValueError:
    raise ConfigError(f"--{field.name}: {item!r} is not an integer") from None


def load_flagfile(path: str) -> Config:
  """Parses a flagfile (e.g. a run's flags.txt) into a Config.

  Raises:
    ConfigError: the file is missing or holds invalid flags.
  """
  try:
    return from_argv([f"--flagfile={path}"])
  except (ConfigError, OSError, UnicodeDecodeError) as e:
    raise ConfigError(f"{path}: {e}") from None


def read_flagfile(path: str) -> dict:
  """Reads a flagfile written by `Config.to_flags` into {name: value string}.

  Unreadable files and lines that are not flags are skipped.
  """
  values = {}
  try:
    with open(path, errors="replace") as f:
      lines = f.read().splitlines()
  except OSError:
    return values
  for line in lines:
    line = line.strip()
    if line.startswith("--") and "=" in line:
      name, value = line[2:].split("=", 1)
      values[name] = value
  return values
