"""`trainer.fit`: Keras's `model.fit`, as the framework's run.

    def build():  # Called by the framework, under the strategy's scope.
      model = keras.Sequential([...])
      model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                    metrics=["accuracy"])
      return model

    history = trainer.fit(build, x_train, y_train, batch_size=64, epochs=10,
                          validation_split=0.2,
                          callbacks=[keras.callbacks.EarlyStopping(patience=3)],
                          model_dir="runs/fit1")

The same run as `trainer.train` (no second loop): a Task made from the compiled
model (task.py), the callbacks as the framework's settings and one action
(callbacks.py, epochs.py). fit() is a program's training job: a bad argument, a
refused callback or a failed run is one line on stderr and the framework's exit
code (SystemExit); a run that stopped before its end (a signal, --max_time, a
SLURM requeue) exits with its code too, so that the rest of the program never
runs on a half-trained model: rerunning the program resumes it.
"""

import os
import re
import sys
import traceback

import trainer
from trainer import tf_loader
from trainer.config import Config, flag_names
from trainer.distribute import devices
from trainer.errors import (ConfigError, RunStatus, TrainerError, UserCodeError,
                            one_line)
from trainer.keras_fit import callbacks as callbacks_lib
from trainer.keras_fit import command_line, program
from trainer.keras_fit.data import fit_data
from trainer.keras_fit.epochs import EpochCallbacks
from trainer.keras_fit.history import History, epoch_logs
from trainer.keras_fit.task import task_class

# Config fields that fit()'s own arguments set, and which argument sets each.
OWNED = {
    "train_steps": "epochs (and steps_per_epoch)",
    "global_batch_size": "batch_size", "per_replica_batch_size": "batch_size",
    "eval_every": "validation_freq",
    "mode": "validation_data or validation_split",
    "shuffle": "shuffle", "class_weight": "class_weight",
    "task": "build", "task_params": "build",
    "optimizer": "model.compile(optimizer=...)",
    "learning_rate": "model.compile(optimizer=...)",
    "momentum": "model.compile(optimizer=...)",
    "weight_decay": "model.compile(optimizer=...)",
    "fused_optimizer": "model.compile(optimizer=...)",
    "early_stopping_patience": "keras.callbacks.EarlyStopping",
    "early_stopping_min_delta": "keras.callbacks.EarlyStopping",
    "reduce_lr_patience": "keras.callbacks.ReduceLROnPlateau",
    "reduce_lr_factor": "keras.callbacks.ReduceLROnPlateau",
    "best_metric": "the monitor of EarlyStopping or ModelCheckpoint",
    "best_goal": "the mode of EarlyStopping or ModelCheckpoint",
}
VERBOSE = ("auto", 0, 1, 2)


def fit(build, x=None, y=None, batch_size=None, epochs=1, verbose="auto",
        callbacks=None, validation_split=0.0, validation_data=None, shuffle=True,
        class_weight=None, sample_weight=None, initial_epoch=0,
        steps_per_epoch=None, validation_steps=None, validation_batch_size=None,
        validation_freq=1, **config_fields) -> History:
  """Trains `build()`'s compiled model as Keras's `model.fit` would, as a run of
  the framework (every guarantee of `trainer.train`). docs/keras.md lists what
  each argument and callback maps to.

  Args:
    build: a function returning a new compiled Keras model.
    x ... validation_freq: as Keras's `Model.fit`.
    **config_fields: any other Config field (model_dir, cpu_devices, seed,
      deterministic, max_time, ...); the program's command line may give them
      too (`--cpu_devices=2`), and wins.

  Returns:
    A keras.callbacks.History: `history` (Keras's keys), `epoch`, `params`,
    `model` (the trained model, compiled), `model_dir`, `results`.

  Raises:
    SystemExit: with the framework's exit code, after one line on stderr (bad
      input: 2), or after the run stopped before its end (rerun to resume).
  """
  try:
    return _fit(build, x, y, batch_size=batch_size, epochs=epochs,
                verbose=verbose, callbacks=callbacks,
                validation_split=validation_split, validation_data=validation_data,
                shuffle=shuffle, class_weight=class_weight,
                sample_weight=sample_weight, initial_epoch=initial_epoch,
                steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                validation_batch_size=validation_batch_size,
                validation_freq=validation_freq, config_fields=config_fields)
  except UserCodeError as e:
    # The user's own code raised: its traceback, then the line naming it.
    cause = e.__cause__
    traceback.print_exception(type(cause), cause, cause.__traceback__,
                              file=sys.stderr)
    _exit(f"{e} (the checkpoints written so far are kept)", e.exit_code)
  except TrainerError as e:
    _exit(str(e), e.exit_code)


def _exit(message: str, code):
  message = re.sub(r"--global_batch_size=(\d+)", r"fit(batch_size=\1)", message)
  print(f"error: {one_line(message, limit=None)}", file=sys.stderr, flush=True)
  raise SystemExit(int(code))


def _check(name: str, value, valid: bool, what: str):
  if not valid:
    raise ConfigError(f"fit({name}={value!r}): {what}")


def _check_arguments(*, build, epochs, verbose, shuffle, initial_epoch,
                     validation_freq, validation_batch_size, class_weight):
  """Checks fit()'s arguments that are not its data's.

  Raises:
    ConfigError: naming the argument and what is valid.
  """
  _check("build", build, callable(build), "must be a function returning a new "
         "compiled keras.Model")
  _check("epochs", epochs, isinstance(epochs, int) and epochs >= 1,
         "must be an int >= 1")
  _check("verbose", verbose, verbose in VERBOSE, "must be 'auto', 0, 1 or 2")
  _check("shuffle", shuffle, isinstance(shuffle, bool), "must be True or False "
         "(shuffle='batch' is not supported)")
  _check("initial_epoch", initial_epoch, initial_epoch == 0, "trainer.fit "
         "resumes from its model_dir's checkpoint by itself (rerun the program): "
         "leave initial_epoch at 0")
  _check("validation_freq", validation_freq,
         isinstance(validation_freq, int) and validation_freq >= 1,
         "must be an int >= 1")
  _check("validation_batch_size", validation_batch_size,
         validation_batch_size is None or (isinstance(validation_batch_size, int)
                                           and validation_batch_size >= 1),
         "must be an int >= 1")
  _check("class_weight", class_weight,
         class_weight is None or isinstance(class_weight, dict),
         "must be a dict {class id: weight}")


def _fit(build, x, y, *, epochs, verbose, callbacks, shuffle, class_weight,
         initial_epoch, validation_freq, validation_batch_size, config_fields,
         **data_arguments) -> History:
  _check_arguments(build=build, epochs=epochs, verbose=verbose, shuffle=shuffle,
                   initial_epoch=initial_epoch, validation_freq=validation_freq,
                   validation_batch_size=validation_batch_size,
                   class_weight=class_weight)
  data = fit_data(x, y, validation_batch_size=validation_batch_size,
                  **data_arguments)
  fields = _config_fields(config_fields)
  import keras  # The program's: imported already.
  policy = keras.mixed_precision.global_policy().name
  if policy in ("mixed_float16", "mixed_bfloat16"):
    # The program's own policy: the framework builds and scales the loss for it.
    fields.setdefault("mixed_precision", policy)
  validation = data.validation is not None
  plan = callbacks_lib.plan(callbacks, steps_per_epoch=data.steps_per_epoch,
                            validation=validation)
  clashes = sorted(set(plan.config) & set(fields))
  if clashes:
    raise ConfigError(
        f"{clashes[0]}: set by the callbacks ({clashes[0]}="
        f"{plan.config[clashes[0]]!r}); give it to the callback instead")
  config = _config(fields, plan, data=data, epochs=epochs, shuffle=shuffle,
                   validation_freq=validation_freq)
  monitors = [m for m in (plan.patience_monitor, plan.best_monitor) if m] + [
      callbacks_lib.Monitor(key=c.monitor, mode=c.mode,
                            owner=f"keras.callbacks.ModelCheckpoint({c.filepath!r})")
      for c in plan.checkpoints if c.save_best_only]
  task = task_class()(build, data, class_weight=class_weight,
                      schedule=plan.schedule, plateau=plan.plateau,
                      epochs=epochs, monitors=monitors)
  params = {"verbose": 1 if verbose == "auto" else verbose, "epochs": epochs,
            "steps": data.steps_per_epoch}
  action = EpochCallbacks(
      task=task, plan=plan, epochs=epochs, steps_per_epoch=data.steps_per_epoch,
      verbose=bool(params["verbose"]), params=params,
      lines=plan.lines(config.model_dir))
  if _needs_its_own_start(config):
    program.restart({name: getattr(config, name)
                     for name in devices.STRATEGY_FIELDS})
  results = trainer.train(config, task=task, actions=[action])
  status = RunStatus(results["status"])
  if not status.finished:
    raise SystemExit(int(status.exit_code))  # The run said why, and how to go on.
  logs = epoch_logs(task.record.read())
  action.on_train_end(logs[-1][1] if logs else {})
  best = plan.restore_best and bool(results.get("export_best_dir"))
  return History(logs=logs, params=params, model_dir=config.model_dir,
                 results=results, task=task,
                 load=lambda: trainer.load(config.model_dir, best=best,
                                           task=task)[1])


def _needs_its_own_start(config: Config) -> bool:
  """Whether TensorFlow started before trainer.fit, and this run's devices need
  setting up before that: a MultiWorkerMirroredStrategy, or a CPU split into
  more replicas than it was."""
  if not tf_loader.is_started() or devices.started(config.distribute):
    return False
  if config.strategy == "multi_worker":
    return True
  import tensorflow as tf
  return (config.strategy == "mirrored" and config.cpu_devices > 1 and
          not tf.config.list_physical_devices("GPU") and
          len(tf.config.list_logical_devices("CPU")) < config.cpu_devices)


def _config_fields(keywords: dict) -> dict:
  """The Config fields given as keywords (those fit() sets itself are refused)
  and on the program's command line (command_line.RUNNING_FLAGS; it wins)."""
  arguments = command_line.flag_arguments(sys.argv[1:])
  names = set(flag_names())
  for name in keywords:
    if name in OWNED:
      raise ConfigError(
          f"fit({name}=...): trainer.fit sets it from {OWNED[name]}")
    if name not in names:
      raise ConfigError(
          f"fit({name}=...): not an argument of Keras's fit nor a Config field "
          "(python -m trainer.main --helpfull lists them)")
  return {**keywords, **command_line.parse(arguments)}


def _config(fields: dict, plan, *, data, epochs: int, shuffle: bool,
            validation_freq: int) -> Config:
  """The run's Config: fit()'s arguments, the callbacks' settings and the
  caller's own fields."""
  steps = data.steps_per_epoch
  validation = data.validation is not None
  settings = dict(
      train_steps=epochs * steps, global_batch_size=data.batch_size,
      # As Keras: a dataset is read in its own order (shuffle is for arrays).
      shuffle=shuffle and not data.is_dataset,
      mode="train_and_eval" if validation else "train",
      eval_every=steps * validation_freq if validation else 0,
      checkpoint_every=steps, steps_per_loop=steps)  # An epoch per loop call.
  if os.environ.get("TF_CONFIG") and "strategy" not in fields:
    settings["strategy"] = "multi_worker"
  monitor = plan.patience_monitor or plan.best_monitor
  if monitor is not None and monitor.key.startswith("val_"):
    settings["best_metric"] = f"eval/{monitor.key.removeprefix('val_')}"
    if monitor.mode != "auto":
      settings["best_goal"] = monitor.mode
  if plan.default_model_dir() and not fields.get("model_dir"):
    settings["model_dir"] = plan.default_model_dir()
  return Config(**{**settings, **plan.config, **fields}).with_model_dir()
