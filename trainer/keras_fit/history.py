"""The run's History: Keras's epoch logs, kept in the checkpoint (so a resumed
run's History holds every epoch once, and its epoch in progress goes on from the
steps already counted), and the `keras.callbacks.History` fit() returns."""

import json
from typing import Optional

import keras
import tensorflow as tf


class FitRecord:
  """The epochs' logs and the epoch in progress, as JSON in a string variable
  (a checkpoint item of the task).

  The state: {"epochs": {"E": logs}, "steps": steps counted in the epoch in
  progress, "sums": {train key: steps-weighted sum of its loop calls' values}}.
  """

  def __init__(self):
    # Outside any strategy scope (Task.checkpoint_items is asked for it there):
    # a string variable cannot be mirrored to a GPU.
    self.variable = tf.Variable("{}", dtype=tf.string, trainable=False,
                                name="fit_history")

  def read(self) -> dict:
    state = json.loads(self.variable.numpy().decode() or "{}")
    state.setdefault("epochs", {})
    state.setdefault("steps", 0)
    state.setdefault("sums", {})
    return state

  def write(self, state: dict):
    self.variable.assign(json.dumps(state))


def epoch_logs(state: dict) -> list:
  """[(epoch, logs)] of the recorded epochs, in order."""
  return sorted((int(e), logs) for e, logs in state["epochs"].items())


class History(keras.callbacks.History):
  """What `trainer.fit` returns: Keras's History (`history`, `epoch`, `params`),
  with the run's directory, results and model.

  Attributes:
    history: {key: [one value per epoch]}, Keras's keys ("loss", "accuracy",
      "val_loss", ...), over every epoch the run trained (a resumed run's too).
    epoch: the epochs recorded (0-based).
    params: {"verbose", "epochs", "steps"} (steps: per epoch).
    model_dir: the run directory.
    results: the run's results.json.
    task: the run's task (trainer.load(model_dir, task=history.task)).
  """

  def __init__(self, *, logs: list, params: dict, model_dir: str, results: dict,
               task=None, load=None):
    """Args:
      logs: [(epoch, logs)] of the run's epochs.
      params: Keras's params.
      model_dir: the run directory.
      results: the run's results.json.
      task: the run's task.
      load: `() -> model` (the `model` property's, on first use).
    """
    super().__init__()
    self.set_params(params)
    self.model_dir = model_dir
    self.results = results
    self.task = task
    self._load = load
    self._loaded = None
    self.epoch = []
    for epoch, values in logs:
      self.epoch.append(epoch)
      for key, value in values.items():
        self.history.setdefault(key, []).append(value)

  @property
  def model(self) -> Optional[keras.Model]:
    """The trained model, compiled as build() compiles it (`evaluate` and
    `predict` work on it), holding the final weights, or the best epoch's under
    EarlyStopping(restore_best_weights=True): `trainer.load`'s, loaded on first
    use."""
    if self._loaded is None and self._load is not None:
      self._loaded = self._load()
    return self._loaded

  @model.setter
  def model(self, value):
    self._loaded = value
