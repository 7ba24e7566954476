"""Opening a trained run: its task, model and weights, from its directory alone.

`open_run` rebuilds a run from MODEL_DIR/flags.txt (or, when that file is damaged,
from the flags its newest checkpoint records) with this process's device flags,
and restores a checkpoint: the latest, the best, or the newest before a step. It
is shared by `--mode=eval`, `python -m trainer.replay` and `trainer.load`, and
opens the directory read-only: it never renames, rewrites or saves anything
there, so it can watch a live run.
"""

import os
from typing import Optional

import keras
import tensorflow as tf

from trainer import config as config_lib
from trainer.config import DistributeConfig
from trainer.errors import ConfigError, ModelDirError, one_line
from trainer.outputs import run_dir
from trainer.tasks import Task
from trainer.training import checkpoint_files, probe, setup
from trainer.training.setup import Built

# This process's own: where it runs and what it prints, never the run's.
DEVICE_FIELDS = tuple(f for f in DistributeConfig.__dataclass_fields__) + (
    "summaries",)


# Flags whose default changed what training does, with the value a run whose
# flags.txt predates them trained as: its evaluation, replay and load rebuild it so.
PREDATED_FLAGS = {"fused_optimizer": False, "sync_batchnorm": False}


def run_config(model_dir: str, *, say=print) -> config_lib.Config:
  """The configuration the run in `model_dir` trained with.

  From its flags.txt; when that file cannot be parsed (a truncated write), from
  the flags its newest checkpoint records, saying so.

  Raises:
    ModelDirError: not a trainer run, or no readable flags.
  """
  flags_path = os.path.join(model_dir, run_dir.FLAGS_FILE)
  if not os.path.isfile(flags_path):
    raise ModelDirError(f"--model_dir={model_dir}: no {run_dir.FLAGS_FILE}, not a "
                        "trainer run")
  try:
    config = config_lib.load_flagfile(flags_path)
    named = config_lib.read_flagfile(flags_path) or {}
  except ConfigError as e:
    recorded = _recorded_flags(model_dir)
    if recorded is None:
      raise
    say(f"note: {flags_path} does not parse ({e}); using the flags its newest "
        "checkpoint recorded")
    config = config_lib.from_argv(recorded)
    named = {line[2:].split("=", 1)[0] for line in recorded}
  # A run older than a flag trained as the flag's old behaviour, not its default.
  return config.replace(**{name: value for name, value in PREDATED_FLAGS.items()
                           if name not in named})


def _recorded_flags(model_dir: str) -> Optional[list]:
  """The flag lines the newest checkpoint's record holds, or None."""
  directory = os.path.join(model_dir, checkpoint_files.CHECKPOINT_SUBDIR)
  for step in reversed(checkpoint_files.checkpoint_steps(directory)):
    try:
      record = checkpoint_files.read_record(checkpoint_files.path_of(directory, step))
    except Exception:  # noqa: BLE001 (an unreadable checkpoint: try the previous)
      continue
    if record.flags:
      return list(record.flags)
  return None


def open_run(model_dir: str, *, invocation: config_lib.Config = None,
             task: Task = None, mode: str = "eval", loading: bool = False,
             **changes) -> Built:
  """Builds the run in `model_dir` read-only, nothing restored yet.

  Args:
    model_dir: the run directory.
    invocation: this process's config: its device flags replace the run's.
    task: the run's task instance (a Python caller's); default: built from the
      run's flags.
    mode: the mode to build for ("eval": no training input; "train": a replay).
    loading: for `load`: the task needs no eval data.
    **changes: more config fields to replace (e.g. a replay's global batch).

  Raises:
    TrainerError: not a run, bad flags, or devices that do not fit.
  """
  config = run_config(model_dir)
  devices = {name: getattr(invocation, name) for name in DEVICE_FIELDS} if (
      invocation is not None) else {}
  # What only a training run acts on (its evaluations' patience) is off here: a
  # run opened to evaluate or replay neither evaluates on a schedule nor stops.
  config = config.replace(model_dir=model_dir, mode=mode, **devices,
                          **dict.fromkeys(config_lib.Config.PATIENCE_FIELDS, 0),
                          **changes)
  config, task = setup.resolve_task(config, task)
  return setup.build(config, task, read_only=True, loading=loading)


def load(model_dir: str, *, best: bool = False, task: Task = None) -> tuple:
  """`trainer.load`: the task and model of a trained run, for prediction.

  The model holds the latest checkpoint's weights (with `best`, the best
  evaluation's), as evaluations and the export use them (the moving averages
  with --ema_decay and --eval_with_ema). It is built outside any strategy: a
  plain Keras model, ready for `compile`, `evaluate` and `predict`.

  Example:
    >>> task, model = trainer.load("runs/q1")  # doctest: +SKIP
    >>> logits = model(task.preprocess(images))  # doctest: +SKIP

  Args:
    model_dir: the run directory.
    best: the best evaluation's weights instead of the latest checkpoint's.
    task: the run's task instance (one its flags cannot rebuild); default:
      built from the run's flags.

  Returns:
    (task, keras model).

  Raises:
    ModelDirError: not a run, or no checkpoint (or no best one) to load.
  """
  built = open_run(model_dir, invocation=config_lib.Config(strategy="one_device",
                                                           summaries=False),
                   task=task, loading=True)
  trainer, checkpoints = built.trainer, built.checkpoints
  if checkpoints.restore() is None:
    raise ModelDirError(f"{model_dir}: no checkpoint to load")
  if best:
    path = checkpoints.best_path()
    if path is None:
      raise ModelDirError(f"{model_dir}: no best checkpoint (it is kept by "
                          "--mode=train_and_eval runs)")
    try:
      trainer.weights.read(path)
    except (tf.errors.OpError, ValueError) as e:  # A damaged file, not a bug.
      raise ModelDirError(f"{path}: the best checkpoint cannot be read "
                          f"({one_line(e)}); load the latest (best=False), or "
                          "rerun the evaluations") from None
  trainer.weights.use_evaluated()
  return built.task, _outside_the_strategy(built)


def _outside_the_strategy(built: Built):
  """A copy of the run's model built outside any strategy, holding its weights:
  Keras' own compile, evaluate and predict work on it as on any model (one built
  under the run's strategy takes only metrics built under that strategy)."""
  previous = keras.mixed_precision.global_policy()
  if built.config.mixed_precision != "none":
    keras.mixed_precision.set_global_policy(built.config.mixed_precision)
  try:
    keras.utils.set_random_seed(built.config.seed)
    model, _ = probe.built_model(built.task, built.train_data.first(1)[0])
  finally:
    keras.mixed_precision.set_global_policy(previous)
  model.set_weights(built.trainer.model.get_weights())
  return model
