"""Keras callbacks as the framework's own mechanisms, checked before training.

Each built-in callback maps to what the framework already does, so that its
state is the run's (checkpointed, exact on resume, the same on every worker):

  EarlyStopping        --early_stopping_patience, --best_metric (val_X: eval/X)
  ReduceLROnPlateau    --reduce_lr_patience, --reduce_lr_factor, --min_learning_rate
  ModelCheckpoint      --best_metric (checkpoints/best, export_best) and its file,
                       written by the chief at epoch ends (epochs.FileWriters)
  TensorBoard          the run's own events (MODEL_DIR/train, eval), histograms,
                       profile
  CSVLogger            its file, from the run's History (epochs.FileWriters)
  LearningRateScheduler  the rate of each epoch, as the optimizer's schedule
  TerminateOnNaN       --on_nan=stop (the framework's NaN guard, always on)
  BackupAndRestore     the run's own resume from its model_dir

`LambdaCallback`, `History` and a user's own `keras.callbacks.Callback` run as
they are (epochs.EpochCallbacks). Anything else, or an option the framework
cannot honour, is refused in one line before training.
"""

import dataclasses
import numbers
from typing import Callable, Optional

import keras

from trainer import internals
from trainer.errors import ConfigError

C = keras.callbacks
MAPPED = ("EarlyStopping", "ReduceLROnPlateau", "ModelCheckpoint", "TensorBoard",
          "CSVLogger", "LearningRateScheduler", "TerminateOnNaN", "BackupAndRestore")
# Hooks a generic callback may have: the rest (validation's, prediction's) are
# never called by trainer.fit.
_HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
          "on_train_batch_begin", "on_train_batch_end", "on_batch_begin",
          "on_batch_end")
_UNCALLED = ("on_test_begin", "on_test_end", "on_test_batch_begin",
             "on_test_batch_end", "on_predict_begin", "on_predict_end",
             "on_predict_batch_begin", "on_predict_batch_end")


@dataclasses.dataclass
class Monitor:
  """A value Keras's logs hold that a callback watches.

  Attributes:
    key: its name in the logs ("val_loss", "accuracy").
    mode: "max", "min" or "auto" (the metric's own direction, resolved once the
      compiled metrics are known).
    owner: the callback, for messages.
  """
  key: str
  mode: str
  owner: str


@dataclasses.dataclass
class CallbackPlan:
  """What the callbacks ask of the run.

  Attributes:
    config: Config fields they set.
    patience_monitor: the monitor of EarlyStopping / ReduceLROnPlateau (the
      run's --best_metric), or None.
    best_monitor: the monitor of the run's best checkpoint (the patience one, or
      a ModelCheckpoint(save_best_only=True)'s), or None.
    restore_best: EarlyStopping(restore_best_weights=True): the History's model
      holds the best epoch's weights.
    schedule: LearningRateScheduler's `schedule(epoch, lr)`, or None.
    plateau: ReduceLROnPlateau is on (the compiled rate must be a number).
    checkpoints: the ModelCheckpoint callbacks (their files).
    csv_loggers: the CSVLogger callbacks (their files).
    generic: the callbacks run as they are.
    backup_dirs: BackupAndRestore's backup_dir (the run resumes from its
      model_dir: without one given, the first of these).
    tensorboard_log_dirs: TensorBoard's log_dir (the events go to the
      model_dir: without one given, the first of these, after backup_dirs).
    logs_learning_rate: logs hold "learning_rate" (as Keras's LR callbacks add).
  """
  config: dict = dataclasses.field(default_factory=dict)
  patience_monitor: Optional[Monitor] = None
  best_monitor: Optional[Monitor] = None
  restore_best: bool = False
  schedule: Optional[Callable] = None
  plateau: bool = False
  checkpoints: list = dataclasses.field(default_factory=list)
  csv_loggers: list = dataclasses.field(default_factory=list)
  generic: list = dataclasses.field(default_factory=list)
  backup_dirs: list = dataclasses.field(default_factory=list)
  tensorboard_log_dirs: list = dataclasses.field(default_factory=list)
  logs_learning_rate: bool = False

  def default_model_dir(self) -> Optional[str]:
    """The model_dir the callbacks name when fit() is given none."""
    return next(iter(self.backup_dirs + self.tensorboard_log_dirs), None)

  def lines(self, model_dir: str) -> list:
    """What to say at start: where the callbacks' directories went."""
    said = [f"BackupAndRestore(backup_dir={d!r}): the run resumes from its own "
            f"checkpoints in {model_dir} (rerun the same program)"
            for d in self.backup_dirs if d != model_dir]
    return said + [f"TensorBoard(log_dir={d!r}): the run writes its TensorBoard "
                   f"events to {model_dir}/train and {model_dir}/eval: tensorboard "
                   f"--logdir {model_dir}" for d in self.tensorboard_log_dirs]


def _refuse(callback, message: str):
  raise ConfigError(f"callbacks: {_name(callback)}: {message}")


def _name(callback) -> str:
  return f"keras.callbacks.{type(callback).__name__}" if _is_keras(callback) else (
      type(callback).__qualname__)


def _is_keras(callback) -> bool:
  return type(callback).__module__.split(".")[0] == "keras"


def _epoch_frequency(callback, value, *, argument: str, steps_per_epoch: int) -> int:
  """A save_freq / update_freq: "epoch", "batch" (update_freq) or a number of
  batches, as steps."""
  if value == "epoch":
    return steps_per_epoch
  if value == "batch" and argument == "update_freq":
    return 1
  if isinstance(value, numbers.Integral) and value >= 1:
    return int(value)
  return _refuse(callback, f"{argument}={value!r}: must be 'epoch' or a number of "
                 "batches >= 1")


def plan(callbacks, *, steps_per_epoch: int, validation: bool) -> CallbackPlan:
  """Maps the callbacks to the run.

  Args:
    callbacks: fit()'s `callbacks`.
    steps_per_epoch: the run's steps per epoch.
    validation: whether the run evaluates at epoch ends.

  Raises:
    ConfigError: a callback, or an option of one, that the framework cannot
      honour; two callbacks that ask for different values of one setting.
  """
  result = CallbackPlan()
  for callback in list(callbacks or ()):
    kind = type(callback).__name__ if _is_keras(callback) else None
    if kind in MAPPED:
      _MAPPERS[kind](callback, result, steps_per_epoch=steps_per_epoch,
                     validation=validation)
    elif isinstance(callback, (C.LambdaCallback, C.History)) or (
        isinstance(callback, C.Callback) and not _is_keras(callback)):
      _check_generic(callback)
      result.generic.append(callback)
    elif isinstance(callback, C.Callback):
      _refuse(callback, "trainer.fit does not support it; it supports "
              f"{', '.join(MAPPED)}, LambdaCallback and your own "
              "keras.callbacks.Callback subclasses")
    else:
      raise ConfigError(f"callbacks: {callback!r} is not a keras.callbacks."
                        "Callback")
  return result


def _check_generic(callback):
  """Refuses a callback whose hooks trainer.fit never calls."""
  overridden = [hook for hook in _UNCALLED if hook in vars(callback) or (
      getattr(type(callback), hook, None) is not getattr(C.Callback, hook))]
  if overridden:
    _refuse(callback, f"{overridden[0]} is never called: trainer.fit evaluates "
            "exactly, in its own loop, and calls on_train_*, on_epoch_* and "
            "on_train_batch_* (the latter at loop-call boundaries)")


def _monitor(callback, *, validation: bool, needs_validation: bool) -> Monitor:
  key, mode = callback.monitor, callback.mode
  if mode not in ("auto", "min", "max"):
    _refuse(callback, f"mode={mode!r}: must be 'auto', 'min' or 'max'")
  if needs_validation and not key.startswith("val_"):
    _refuse(callback, f"monitor={key!r}: the framework acts on evaluations: "
            "monitor a validation value (val_loss, val_<metric>)")
  if key.startswith("val_") and not validation:
    _refuse(callback, f"monitor={key!r} needs validation data (validation_data or "
            "validation_split)")
  return Monitor(key=key, mode=mode, owner=_name(callback))


def _agree(result: CallbackPlan, callback, monitor: Monitor, min_delta: float):
  """EarlyStopping and ReduceLROnPlateau share the run's one patience count."""
  if result.patience_monitor is None:
    result.patience_monitor = result.best_monitor = monitor
    result.config["early_stopping_min_delta"] = float(min_delta)
    return
  theirs = result.patience_monitor
  if (theirs.key, theirs.mode) != (monitor.key, monitor.mode):
    _refuse(callback, f"monitor={monitor.key!r}, mode={monitor.mode!r}, but "
            f"{theirs.owner} watches {theirs.key!r} ({theirs.mode}); trainer.fit "
            "counts both on one evaluation metric: give them the same monitor")
  if float(min_delta) != result.config["early_stopping_min_delta"]:
    _refuse(callback, f"min_delta={min_delta}, but {theirs.owner}'s differs; "
            "trainer.fit counts both on one patience count: give them the same "
            "min_delta (e.g. min_delta=1e-4 on both)")


def _early_stopping(callback, result, *, validation, **_):
  if callback.baseline is not None:
    _refuse(callback, f"baseline={callback.baseline}: not supported; leave it "
            "None")
  if callback.start_from_epoch:
    _refuse(callback, f"start_from_epoch={callback.start_from_epoch}: not "
            "supported; leave it 0")
  monitor = _monitor(callback, validation=validation, needs_validation=True)
  _agree(result, callback, monitor, callback.min_delta)
  # Keras counts the epoch before comparing: patience 0 stops as 1 does.
  result.config["early_stopping_patience"] = max(1, int(callback.patience))
  result.restore_best = result.restore_best or bool(callback.restore_best_weights)


def _reduce_lr_on_plateau(callback, result, *, validation, **_):
  if callback.cooldown:
    _refuse(callback, f"cooldown={callback.cooldown}: not supported; leave it 0")
  if result.schedule is not None:
    _refuse(callback, "with a LearningRateScheduler: the scheduler sets every "
            "epoch's rate; use one of them")
  if not 0.0 < callback.factor < 1.0:
    _refuse(callback, f"factor={callback.factor}: must be in (0, 1)")
  monitor = _monitor(callback, validation=validation, needs_validation=True)
  _agree(result, callback, monitor, callback.min_delta)
  result.plateau = True
  result.config.update(reduce_lr_patience=max(1, int(callback.patience)),
                       reduce_lr_factor=float(callback.factor),
                       min_learning_rate=float(callback.min_lr))
  result.logs_learning_rate = True


def _model_checkpoint(callback, result, *, validation, **_):
  if callback.save_freq != "epoch":
    _refuse(callback, f"save_freq={callback.save_freq!r}: trainer.fit writes the "
            "file at epoch ends (save_freq='epoch'); the run's own checkpoints "
            "are every checkpoint_every steps")
  if callback.save_best_only:
    monitor = _monitor(callback, validation=validation, needs_validation=False)
    if result.best_monitor is None and monitor.key.startswith("val_"):
      result.best_monitor = monitor
  result.checkpoints.append(callback)


def _tensorboard(callback, result, *, steps_per_epoch, **_):
  if callback.write_images or callback.embeddings_freq:
    _refuse(callback, "write_images and embeddings_freq are not supported; the "
            "run writes its scalars, histograms and profiles")
  if callback.histogram_freq:
    result.config["histogram_every"] = int(callback.histogram_freq) * steps_per_epoch
  if callback.update_freq != "epoch":
    result.config["summary_every"] = _epoch_frequency(
        callback, callback.update_freq, argument="update_freq",
        steps_per_epoch=steps_per_epoch)
  # Keras keeps profile_batch only parsed, as these (its one reach into Keras
  # internals outside compiled.py).
  start, stop = internals.profiled_batches(callback)
  if start or stop:
    result.config["profile_steps"] = (int(start), int(stop))
  result.tensorboard_log_dirs.append(callback.log_dir)


def _csv_logger(callback, result, **_):
  result.csv_loggers.append(callback)


def _learning_rate_scheduler(callback, result, **_):
  if result.config.get("reduce_lr_patience"):
    _refuse(callback, "with ReduceLROnPlateau: the scheduler sets every epoch's "
            "rate; use one of them")
  if result.schedule is not None:
    _refuse(callback, "given twice: one schedule sets the rate")
  result.schedule = callback.schedule
  result.logs_learning_rate = True


def _terminate_on_nan(callback, result, **_):
  del callback, result  # The framework's NaN guard (--on_nan=stop) is always on.


def _backup_and_restore(callback, result, *, steps_per_epoch, **_):
  result.config["checkpoint_every"] = _epoch_frequency(
      callback, callback.save_freq, argument="save_freq",
      steps_per_epoch=steps_per_epoch)
  result.backup_dirs.append(callback.backup_dir)


_MAPPERS = {
    "EarlyStopping": _early_stopping, "ReduceLROnPlateau": _reduce_lr_on_plateau,
    "ModelCheckpoint": _model_checkpoint, "TensorBoard": _tensorboard,
    "CSVLogger": _csv_logger, "LearningRateScheduler": _learning_rate_scheduler,
    "TerminateOnNaN": _terminate_on_nan, "BackupAndRestore": _backup_and_restore,
}
