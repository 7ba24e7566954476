"""Every flag of `trainer`, defined once, and the frozen `Config` they fill.

The `Config` dataclass is the single source: each field carries its help text and
bounds, `define_flags()` turns the fields into absl flags, and `Config.__post_init__`
validates, so the CLI and Python callers (`trainer.train(Config(...))`, tests, sweeps)
get the same checks and the same one-line errors. This module and `trainer/main.py`
are the only ones that touch absl FLAGS, and this one never imports TensorFlow, so
scripts can validate flags cheaply.
"""

import dataclasses
import datetime
import os
import typing
from typing import Optional, Sequence

from trainer.errors import ConfigError

MODES = ("train", "eval", "train_and_eval")
DATASETS = ("digits", "mnist", "npz", "synthetic")
MODELS = ("cnn", "mlp", "resnet")
STRATEGIES = ("mirrored", "one_device", "multi_worker")
CLUSTER_RESOLVERS = ("tf_config", "slurm")
CROSS_DEVICE_OPS = ("auto", "ring", "nccl", "hierarchical_copy", "reduce_to_one_device")
OPTIMIZERS = ("adam", "sgd", "momentum")
ON_NAN = ("stop", "rollback")
MIXED_PRECISION = ("none", "mixed_bfloat16", "mixed_float16")
MAX_CPU_DEVICES = 64


def _field(default, help_text, *, choices=None, lower=None, upper=None, layout=False):
  """A Config field whose metadata also defines its flag.

  Args:
    default: the default value (lists are stored as tuples).
    help_text: the flag's help.
    choices: allowed values of a string field.
    lower: smallest allowed value of a number field.
    upper: largest allowed value of a number field.
    layout: whether changing it on an existing model_dir changes the model or the
      batch layout, so a checkpoint made with another value cannot be resumed.
  """
  return dataclasses.field(
      default=default,
      metadata=dict(help=help_text, choices=choices, lower=lower, upper=upper,
                    layout=layout))


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
  # Data.
  dataset: str = _field("digits", "digits (8x8, ships with scikit-learn, offline), "
                        "mnist, npz (any .npz with x_train, y_train, x_test, y_test) "
                        "or synthetic.", choices=DATASETS, layout=True)
  data_path: Optional[str] = _field(
      None, "A local .npz file: required for npz; for mnist, a local mnist.npz "
      "instead of the download.")
  synthetic_examples: int = _field(2048, "Training examples of --dataset=synthetic.",
                                   lower=1)
  synthetic_shape: Sequence[int] = _field(
      (28, 28, 1), "Example shape of --dataset=synthetic, e.g. 28,28,1.", layout=True)
  shuffle: bool = _field(True, "Shuffle the training set each epoch (a stateless "
                         "permutation of (seed, epoch)).")
  # Model.
  model: str = _field("cnn", "cnn (Conv2D(32,3)-MaxPool-Flatten-Dense(64)-Dense), mlp "
                      "or resnet (a small ResNet).", choices=MODELS, layout=True)
  dropout: float = _field(0.0, "Dropout rate before the last layer (0 = none).",
                          lower=0.0, upper=0.95, layout=True)
  l2: float = _field(0.0, "L2 weight regularization factor on kernels.", lower=0.0,
                     layout=True)
  # Devices and distribution.
  strategy: str = _field("mirrored", "mirrored (every local device), one_device, or "
                         "multi_worker (MultiWorkerMirroredStrategy).",
                         choices=STRATEGIES, layout=True)
  cluster_resolver: str = _field(
      "tf_config", "Where multi_worker finds the cluster: tf_config (TF_CONFIG) or "
      "slurm.", choices=CLUSTER_RESOLVERS)
  cross_device_ops: str = _field(
      "auto", "All-reduce implementation: auto, ring or nccl (multi_worker); nccl, "
      "hierarchical_copy or reduce_to_one_device (mirrored). Alias: --communication.",
      choices=CROSS_DEVICE_OPS)
  cpu_devices: int = _field(1, "Split the CPU into this many logical devices (used "
                            "when no GPU is visible).", lower=1, upper=MAX_CPU_DEVICES,
                            layout=True)
  gpus: Optional[Sequence[int]] = _field(
      None, "Indices of the GPUs to use, e.g. 0,1. Default: all.", layout=True)
  memory_growth: bool = _field(True, "Let GPU memory grow instead of taking it all.")
  intra_op_threads: int = _field(0, "TensorFlow intra-op threads (0 = TF's default).",
                                 lower=0)
  inter_op_threads: int = _field(0, "TensorFlow inter-op threads (0 = TF's default).",
                                 lower=0)
  # Steps and batches.
  per_replica_batch_size: int = _field(32, "Examples per replica per step; the global "
                                       "batch is this times the replica count.",
                                       lower=1, layout=True)
  train_steps: int = _field(200, "Total training steps (a rerun resumes up to it).",
                            lower=1)
  steps_per_loop: int = _field(0, "Steps per tf.function call (0 = automatic: about "
                               "one second per call).", lower=0)
  summary_every: int = _field(0, "At most this many steps between summaries (0 = "
                              "once per loop call).", lower=0)
  # Optimization.
  optimizer: str = _field("adam", "adam, sgd or momentum.", choices=OPTIMIZERS,
                          layout=True)
  learning_rate: float = _field(1e-3, "Learning rate.", lower=0.0)
  momentum: float = _field(0.9, "Momentum of --optimizer=momentum.", lower=0.0,
                           upper=1.0)
  mixed_precision: str = _field("none", "none, mixed_bfloat16 or mixed_float16 (with "
                                "loss scaling).", choices=MIXED_PRECISION, layout=True)
  jit_compile: bool = _field(False, "Compile the replica step with XLA.")
  seed: int = _field(0, "Seed of weights, dropout and data order.", lower=0,
                     layout=True)
  deterministic: bool = _field(False, "Enable TensorFlow op determinism (bit-exact "
                               "reruns and resumes).")
  # Evaluation, checkpoints, faults.
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
  # Inspection.
  summaries: bool = _field(True, "Write TensorBoard summaries and progress lines.")
  hparams: Sequence[str] = _field((), "Flag names to record as TensorBoard HParams "
                                  "(sweeps set this).")

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if isinstance(value, list):  # Keep the dataclass hashable and immutable.
        object.__setattr__(self, field.name, tuple(value))
      _check_field(field, getattr(self, field.name))
    if self.dataset == "npz" and not self.data_path:
      raise ConfigError("--dataset=npz needs --data_path=FILE.npz")
    if self.data_path and not os.path.isfile(self.data_path):
      raise ConfigError(f"--data_path={self.data_path}: no such file")
    if len(self.synthetic_shape) not in (1, 2, 3) or min(self.synthetic_shape) < 1:
      raise ConfigError(f"--synthetic_shape={_flag_value(self.synthetic_shape)}: "
                        "must be 1 to 3 positive sizes, e.g. 28,28,1")
    if self.mode == "eval" and not self.model_dir:
      raise ConfigError("--mode=eval needs --model_dir of a trained run")
    if self.strategy == "multi_worker" and not self.model_dir:
      raise ConfigError("--strategy=multi_worker needs --model_dir: every worker "
                        "must name the same directory")
    unknown = sorted(set(self.hparams) - set(field_names()))
    if unknown:
      raise ConfigError(f"--hparams: unknown flag(s) {', '.join(unknown)}")

  def replace(self, **changes) -> "Config":
    """Returns a copy with `changes` applied (and validated)."""
    return dataclasses.replace(self, **changes)

  def with_model_dir(self) -> "Config":
    """Returns a copy whose model_dir is set (a new timestamped folder if unset)."""
    if self.model_dir:
      return self
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return self.replace(model_dir=os.path.join("runs", stamp))

  def to_flags(self) -> list:
    """Returns `--name=value` lines: a flagfile that reproduces this config."""
    return [f"--{name}={_flag_value(value)}"
            for name, value in dataclasses.asdict(self).items() if value is not None]

  def layout_flags(self) -> dict:
    """Returns {name: flag value} of the fields that fix the model and batch layout."""
    return {field.name: _flag_value(getattr(self, field.name))
            for field in dataclasses.fields(self) if field.metadata["layout"]}


def flag_table() -> str:
  """The README's flag table (Markdown), generated from the fields' metadata."""
  rows = ["| Flag | Default | Meaning |", "|---|---|---|"]
  for field in dataclasses.fields(Config):
    default = "" if field.default is None else f"`{_flag_value(field.default)}`"
    rows.append(f"| `--{field.name}` | {default} | {field.metadata['help']} |")
  return "\n".join(rows)


def field_names() -> list:
  """Names of all Config fields, which are also the flag names."""
  return [field.name for field in dataclasses.fields(Config)]


def _field_named(name: str) -> dataclasses.Field:
  """The Config field of flag `name`; KeyError if there is none."""
  return {f.name: f for f in dataclasses.fields(Config)}[name]


def field_kind(name: str) -> type:
  """The type flag `name` holds (str, int, float, bool or list); KeyError if none."""
  return _base_type(_field_named(name))


def field_choices(name: str):
  """The values flag `name` allows, or None when it is not an enum."""
  return _field_named(name).metadata["choices"]


def _flag_value(value) -> str:
  if isinstance(value, (tuple, list)):
    return ",".join(str(v) for v in value)
  if isinstance(value, bool):
    return "true" if value else "false"
  return str(value)


def _check_field(field, value):
  meta = field.metadata
  if value is None:
    return
  if meta["choices"] and value not in meta["choices"]:
    raise ConfigError(f"--{field.name}={value}: must be one of "
                      f"{', '.join(meta['choices'])}")
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


def define_flags(flag_values=None):
  """Defines one absl flag per Config field (on absl's global FLAGS by default)."""
  from absl import flags  # Only the CLI needs absl's flag machinery.
  if flag_values is None:
    flag_values = flags.FLAGS
  for field in dataclasses.fields(Config):
    kind, meta, default = _base_type(field), field.metadata, field.default
    kwargs = dict(name=field.name, default=default, help=meta["help"],
                  flag_values=flag_values)
    if meta["choices"]:
      flags.DEFINE_enum(enum_values=list(meta["choices"]), **kwargs)
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
  # The name MultiWorkerMirroredStrategy's own options use for the same choice.
  flags.DEFINE_alias("communication", "cross_device_ops", flag_values=flag_values)


def from_flags(flag_values=None) -> Config:
  """Builds a Config from parsed absl flags.

  Raises:
    ConfigError: a flag value is invalid.
  """
  from absl import flags
  if flag_values is None:
    flag_values = flags.FLAGS
  values = {}
  for field in dataclasses.fields(Config):
    value = flag_values[field.name].value
    if _base_type(field) is list and value is not None:
      value = tuple(_parse_list_item(field, item) for item in value)
    values[field.name] = value
  return Config(**values)


def from_argv(argv: Sequence[str]) -> Config:
  """Parses trainer flags (`--flagfile=F`, `--name=value`) exactly as the CLI does.

  Uses private FlagValues, so sweeps and scripts can check a trial's command line
  without importing TensorFlow or touching the global FLAGS.

  Raises:
    ConfigError: an unknown or malformed flag, or an invalid value.
  """
  from absl import flags
  flag_values = flags.FlagValues()
  define_flags(flag_values)
  try:
    rest = flag_values(["trainer", *argv])
  except flags.Error as e:
    raise ConfigError(str(e).splitlines()[0]) from None
  if len(rest) > 1:
    raise ConfigError(f"unexpected arguments {' '.join(rest[1:])!r}")
  return from_flags(flag_values)


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
  from absl import flags
  flag_values = flags.FlagValues()
  define_flags(flag_values)
  try:
    flag_values(["trainer", f"--flagfile={path}"])
  except (flags.Error, OSError) as e:
    raise ConfigError(f"{path}: {e}") from None
  return from_flags(flag_values)


def read_flagfile(path: str) -> dict:
  """Reads a flagfile written by `Config.to_flags` into {name: value string}."""
  values = {}
  with open(path) as f:
    for line in f:
      line = line.strip()
      if line.startswith("--") and "=" in line:
        name, value = line[2:].split("=", 1)
        values[name] = value
  return values
