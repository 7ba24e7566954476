"""Epochs on the run's steps: the action that gives Keras callbacks their logs.

Loop calls end at every epoch's last step (this action's `next_stop`). Before a
loop call, the callbacks hear `on_train_begin` (once), `on_epoch_begin` (at an
epoch's first step) and `on_train_batch_begin`; after it, `on_train_batch_end`
(at loop-call boundaries, with the epoch's running logs) and, at an epoch's last
step, `on_epoch_end` with Keras's logs: the epoch's train values, the
evaluation's as `val_*` (the framework evaluated at that step), and the learning
rate where a learning-rate callback would log it. A callback that sets
`model.stop_training` stops the run at that step (trainer.STOP).

Each epoch is one loop call unless --steps_per_loop is shorter, so its train
values are Keras's: the mean loss over its steps and each metric's result over
its examples. Over several loop calls, they are the calls' steps-weighted means
(the sum of the calls' values for counts: TruePositives, Sum...): still
Keras's for the loss, counts and metrics that are means (accuracy,
crossentropy, MAE...) of equal batches, close to it for others (AUC,
precision...).
"""

import keras

from trainer.actions.user import STOP
from trainer.errors import user_code
from trainer.keras_fit import files
from trainer.keras_fit.history import FitRecord


class EpochCallbacks:
  """The action of a trainer.fit run (see the module docstring)."""

  def __init__(self, *, task, plan, epochs: int, steps_per_epoch: int,
               verbose: bool, params: dict, lines=(), say=print):
    """Args:
      task: the FitTask (its model, compiled metrics and record).
      plan: the callbacks' CallbackPlan.
      epochs: fit()'s epochs.
      steps_per_epoch: steps per epoch.
      verbose: say one line per epoch.
      params: the callbacks' params (Keras's {"verbose", "epochs", "steps"}).
      lines: what the chief says after the first loop call (where callbacks'
        directories went).
      say: the chief's output.
    """
    self._task, self._plan = task, plan
    self._epochs, self._steps = epochs, steps_per_epoch
    self._verbose, self._params, self._say = verbose, params, say
    self._lines = list(lines)
    self._started = False
    self._begun = None  # The epoch whose on_epoch_begin was called last.
    self._call_start = None  # The step the current loop call started at.

  @property
  def record(self) -> FitRecord:
    return self._task.record

  def _call(self, hook: str, *args, **kwargs):
    for callback in self._plan.generic:
      with user_code(f"callback {type(callback).__qualname__}.{hook}"):
        getattr(callback, hook)(*args, **kwargs)

  def next_stop(self, step: int) -> int:
    """Before the loop call from `step`: the callbacks' hooks; the call ends at
    the epoch's last step."""
    model = self._task.model
    if not self._started:
      self._started = True
      model.stop_training = False
      for callback in self._plan.generic:
        callback.set_model(model)
        callback.set_params(dict(self._params))
      self._call("on_train_begin", logs={})
    epoch, batch = divmod(step, self._steps)
    if self._begun != epoch:
      self._begun = epoch
      self._call("on_epoch_begin", epoch, logs={})
    self._call("on_train_batch_begin", batch, logs={})
    self._call_start = step
    return (epoch + 1) * self._steps

  def __call__(self, context):
    if context.is_chief:
      for line in self._lines:
        self._say(line)
    self._lines = []
    state = self.record.read()
    steps = context.step - self._call_start
    state["steps"] += steps
    running = {}
    for key in self._task.train_keys:
      adds_up = self._task.adds_up(key)
      state["sums"][key] = state["sums"].get(key, 0.0) + float(
          context.metrics[key]) * (1 if adds_up else steps)
      running[key] = state["sums"][key] / (1 if adds_up else state["steps"])
    epoch, batch = divmod(context.step - 1, self._steps)
    if context.step % self._steps:
      self.record.write(state)
      self._call("on_train_batch_end", batch, logs=dict(running))
      return self._stop()
    logs = dict(running)
    if context.eval_metrics is not None:
      penalty = _weight_penalty(context.model)
      logs.update({f"val_{key}": float(context.eval_metrics[key]) +
                   (penalty if key == "loss" else 0.0)
                   for key in self._task.train_keys})
    if self._plan.logs_learning_rate:
      logs["learning_rate"] = self._learning_rate(context.model, epoch)
    state["epochs"][str(epoch)] = logs
    state["steps"], state["sums"] = 0, {}
    self.record.write(state)
    self._call("on_train_batch_end", batch, logs=dict(running))
    if context.is_chief:
      self._write_files(context.model, state, epoch)
      if self._verbose:
        self._say(files.epoch_line(epoch, self._epochs, logs))
    self._call("on_epoch_end", epoch, logs=dict(logs))
    return self._stop()

  def _stop(self):
    return STOP if getattr(self._task.model, "stop_training", False) else None

  def _write_files(self, model, state: dict, epoch: int):
    for logger in self._plan.csv_loggers:
      with user_code(f"CSVLogger({logger.filename!r})"):
        files.write_csv(logger, state, epoch)
    for checkpoint in self._plan.checkpoints:
      goal = checkpoint.mode if checkpoint.mode != "auto" else (
          self._task.direction(checkpoint.monitor) or "min")
      with user_code(f"ModelCheckpoint({checkpoint.filepath!r})"):
        files.save_checkpoint(checkpoint, model, state, epoch, goal=goal,
                              say=self._say)

  def _learning_rate(self, model, epoch: int) -> float:
    """The epoch's learning rate: the schedule's, else the optimizer's now (the
    rate of the epoch's last step: a reduction takes effect from the next)."""
    if self._task.learning_rates is not None:
      return float(self._task.learning_rates[epoch])
    return float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))

  def on_train_end(self, logs: dict):
    """After the run: the callbacks' on_train_end with the last epoch's logs."""
    if self._started:
      self._call("on_train_end", logs=dict(logs))


def _weight_penalty(model) -> float:
  """The weights' regularization penalty, which Keras's val_loss includes (the
  framework's evaluation loss is the compiled loss alone)."""
  total = 0.0
  for variable in model.trainable_weights:
    regularizer = getattr(variable, "regularizer", None)
    if regularizer is not None:
      total += float(keras.ops.convert_to_numpy(regularizer(variable)))
  return total
