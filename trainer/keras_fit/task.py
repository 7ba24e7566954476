"""The Task of a `trainer.fit` run: made from the user's `build()` (a compiled
Keras model) and fit()'s data, so that the run keeps every guarantee of a task.

Its loss is the compiled loss of each example (compiled.CompiledModel), its
streaming metrics the compiled metrics, named as Keras's logs name them; several
outputs add each output's loss (`OUTPUT_loss`) as a per-example metric,
reported as Keras reports it (the weighted sum over the examples). Its
optimizer is the compiled one (with LearningRateScheduler's rates as its
schedule). Its checkpoint item is the run's History (history.FitRecord).
"""

import keras
import numpy as np

from trainer.errors import ConfigError, TaskError, user_code
from trainer.keras_fit.compiled import CompiledModel
from trainer.keras_fit.data import INPUT
from trainer.keras_fit.history import FitRecord
from trainer.tasks.base import Task

_COUNTS = (keras.metrics.TruePositives, keras.metrics.FalsePositives,
           keras.metrics.TrueNegatives, keras.metrics.FalseNegatives,
           keras.metrics.Sum)
NOT_REBUILDABLE = (
    "this run was made by trainer.fit(build, ...), whose build() and data live in "
    "the program that trained it: load its model with keras.models.load_model("
    "'MODEL_DIR/export/model.keras'), or in that program with trainer.load("
    "MODEL_DIR, task=history.task) (history.model does)")


class FitTask(Task):
  """A Task made from a compiled Keras model (see the module docstring).

  Make one with `task_class()`: each fit() run has its own class, whose
  metric_goals it learns from the compiled metrics.
  """

  layout_fields = ()
  metric_goals = {}  # Each run's class has its own (task_class).

  def __init__(self, build=None, data=None, *, class_weight=None, schedule=None,
               plateau: bool = False, epochs: int = 1, monitors=()):
    """Args:
      build: the user's build(): a new compiled model (None: a task rebuilt from
        the run's flags alone, which cannot train or load; NOT_REBUILDABLE).
      data: fit()'s data (data.FitData).
      class_weight: fit()'s class_weight.
      schedule: LearningRateScheduler's `schedule(epoch, lr)`, or None.
      plateau: ReduceLROnPlateau lowers the compiled rate (a number, then).
      epochs: fit()'s epochs (the schedule's length).
      monitors: the callbacks' monitors (callbacks.Monitor): each must be a key
        of the logs, and "auto" must be a direction Keras can tell.
    """
    self._build, self._data = build, data
    self.class_weight = class_weight
    self._schedule, self._epochs, self._monitors = schedule, epochs, monitors
    self._plateau = plateau
    self.model = None  # The model being trained (the latest build).
    self.compiled = None
    self.train_keys = ()  # The logs' train keys, once built.
    self.learning_rates = None  # The schedule's rate of each epoch.
    self._record = None

  def _fit_data(self):
    if self._data is None:
      raise TaskError(NOT_REBUILDABLE)
    return self._data

  def build_model(self):
    data = self._fit_data()
    with user_code("build()"):
      model = self._build()
    if not isinstance(model, keras.Model):
      raise TaskError(f"build() must return a compiled keras.Model, got "
                      f"{type(model).__name__}")
    compiled = CompiledModel(model)
    features, labels = _first_examples(data.train)
    with user_code(f"the model's call ({type(model).__name__})"):
      outputs = model(self.preprocess(features), training=False)
    compiled.bind(model, labels, outputs, positional_labels=data.positional_labels)
    if self.class_weight and len(compiled.outputs.names) > 1:
      raise ConfigError("fit(class_weight=...): only for a model of one output "
                        "(as Keras's fit)")
    self.model, self.compiled = model, compiled
    self.train_keys = self._train_keys(compiled)
    self._check_monitors()
    type(self).metric_goals.update(
        {name: goal for name in (*self.train_keys, *compiled.metrics)
         if (goal := self.direction(name))})
    return model

  @staticmethod
  def _train_keys(compiled) -> tuple:
    """The logs' train keys, in Keras's order: the loss, the compiled metrics
    (those of one value), each output's loss (several outputs)."""
    scalar = tuple(name for name, metric in compiled.metrics.items()
                   if np.size(metric.result()) == 1)
    return ("loss", *scalar, *compiled.output_losses)

  def adds_up(self, key: str) -> bool:
    """Whether a train key's value over several loop calls is their sum (a
    count: TruePositives, Sum...) rather than their steps-weighted mean (the
    loss, a mean such as accuracy; approximate for others, e.g. AUC)."""
    metric = getattr(self.compiled.metrics.get(key), "metric", None)
    return isinstance(metric, _COUNTS)

  def direction(self, key: str):
    """"max" or "min" for a key of the logs (val_ or not), or None."""
    return self.compiled.direction(key.removeprefix("val_"))

  def _check_monitors(self):
    keys = list(self.train_keys)
    if self._data.validation is not None:
      keys += [f"val_{key}" for key in self.train_keys]
    for monitor in self._monitors:
      if monitor.key not in keys:
        raise ConfigError(f"callbacks: {monitor.owner}: monitor={monitor.key!r} "
                          f"is not in the logs, which hold {', '.join(keys)}")
      if monitor.mode == "auto" and self.direction(monitor.key) is None:
        raise ConfigError(f"callbacks: {monitor.owner}: monitor={monitor.key!r}: "
                          "Keras cannot tell whether it should go up or down; "
                          "give mode='max' or mode='min'")

  def train_data(self):
    return self._fit_data().train

  def eval_data(self):
    return self._fit_data().validation

  def preprocess(self, features):
    if self._data is not None and self._data.positional_features:
      return [features[f"{INPUT}_{i}"] for i in range(len(features))]
    return features

  def loss(self, labels, outputs):
    return self.compiled.per_example_loss(labels, outputs)

  def metrics(self, labels, outputs) -> dict:
    return {f"{name}_loss": self.compiled.output_loss(name, labels, outputs)
            for name in self.compiled.outputs.names
            if f"{name}_loss" in self.compiled.output_losses}

  def build_metrics(self) -> dict:
    return dict(self.compiled.metrics)

  def finalize_metrics(self, means: dict, *, sums: dict, examples: int) -> dict:
    # Keras logs an output's loss as the weighted losses' sum over the examples.
    for name in self.compiled.output_losses:
      means[name] = sums[name] / examples if examples else 0.0
    return means

  def build_optimizer(self):
    optimizer = self.model.optimizer
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
      optimizer = optimizer.inner_optimizer  # The framework scales the loss.
    if getattr(optimizer, "use_ema", False):
      raise ConfigError(
          "model.compile(optimizer=...(use_ema=True)): the framework keeps the "
          "moving averages of the weights itself: compile without use_ema and "
          "give trainer.fit ema_decay=... (--ema_decay; evaluations and the "
          "export use the averages)")
    if self._plateau and _has_schedule(optimizer):
      raise ConfigError("callbacks: keras.callbacks.ReduceLROnPlateau: the "
                        "compiled optimizer's learning rate is a schedule, which "
                        "it cannot lower; compile a number, or leave it out")
    if self._schedule is not None:
      # A new optimizer of the same kind, its rate the schedule of the epochs'
      # rates (a function of its iterations, so a resume goes on at the rate
      # its checkpoint had); Keras's own rate variable cannot be swapped for a
      # schedule once tracked.
      self.learning_rates = _scheduled_rates(self._schedule, optimizer,
                                             self._epochs)
      steps = self._fit_data().steps_per_epoch
      rates = keras.optimizers.schedules.PiecewiseConstantDecay(
          boundaries=[(e + 1) * steps - 1 for e in range(self._epochs - 1)],
          values=list(self.learning_rates)) if self._epochs > 1 else (
              self.learning_rates[0])
      optimizer = type(optimizer).from_config(
          dict(optimizer.get_config(), learning_rate=rates))
      self.model.optimizer = optimizer  # What the callbacks' model holds.
    return optimizer

  @property
  def record(self) -> FitRecord:
    if self._record is None:
      self._record = FitRecord()
    return self._record

  def checkpoint_items(self) -> dict:
    return {"fit_history": self.record.variable}


def task_class() -> type:
  """A FitTask class of one fit() run: its own metric_goals, filled once the
  compiled metrics are known."""
  return type("FitTask", (FitTask,), {"metric_goals": {},
                                      "__module__": FitTask.__module__,
                                      "__qualname__": FitTask.__qualname__})


def _first_examples(train, count: int = 8) -> tuple:
  """(features, labels) of the first `count` training examples (arrays, or a
  dataset's examples)."""
  if isinstance(train, tuple):
    return tuple(_head(part, count) for part in train[:2])
  for element in train.batch(count).take(1):
    return element[0], element[1]
  raise TaskError("fit(x=...): the dataset is empty")


def _head(value, count: int):
  if isinstance(value, dict):
    return {key: array[:count] for key, array in value.items()}
  return value[:count]


def _scheduled_rates(schedule, optimizer, epochs: int) -> list:
  """LearningRateScheduler's rate of each epoch, as Keras sets it at the epoch's
  start: schedule(epoch, the rate so far) (or schedule(epoch)), as float32."""
  if _has_schedule(optimizer):
    raise ConfigError("callbacks: keras.callbacks.LearningRateScheduler: the "
                      "compiled optimizer has a LearningRateSchedule already; use "
                      "one of them")
  rate, rates = float(keras.ops.convert_to_numpy(optimizer.learning_rate)), []
  for epoch in range(epochs):
    with user_code("LearningRateScheduler's schedule"):
      try:
        value = schedule(epoch, rate)
      except TypeError:
        value = schedule(epoch)
    if not isinstance(value, (float, np.floating, int)):
      raise ConfigError(f"callbacks: keras.callbacks.LearningRateScheduler: its "
                        f"schedule returned {value!r} for epoch {epoch}; it must "
                        "return a float")
    rate = float(np.float32(value))
    rates.append(rate)
  return rates


def _has_schedule(optimizer) -> bool:
  """Whether the optimizer's learning rate is a schedule (serialized: a dict)."""
  return isinstance(optimizer.get_config().get("learning_rate"), dict)
