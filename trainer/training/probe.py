"""The task's model and objective, built and checked on a few training examples
before the first step: what a task gets wrong is one line naming the method,
not an error deep inside a traced step."""

import re

import keras
import tensorflow as tf

from trainer.data import TaskData
from trainer.data.base import weighted
from trainer.errors import TaskError, user_code
from trainer.tasks import Task
from trainer.tasks.base import METRIC_NAME
from trainer.training import metric_merge
from trainer.training import objective as objectives
from trainer.training.steps import float32_outputs
from trainer.training.train_loop import ROW_STATE

# Totals every run keeps, and the other columns of the train loop's summary rows
# (TrainLoop.history_columns, with replica_0, replica_1, ...).
RESERVED = ("loss", "examples", "weight", "step", *ROW_STATE)
_LEDGER_COLUMN = re.compile(r"^replica_\d+$")


def probe_size(per_replica_batch_size: int) -> int:
  """Examples the probe runs on: up to 8, as a replica's batch has, and at least
  4, so that the metrics' merge is checked (on two parts of two) however small
  the per-replica batch."""
  return max(4, min(per_replica_batch_size, 8))


def model_and_objective(task: Task, train_data: TaskData, size: int, *,
                        class_weight=None, replicas: int = 1) -> tuple:
  """Builds the task's model and streaming metrics (call inside the strategy's
  scope) and runs them, the loss and the metrics once on the first `size`
  training examples: a subclassed model's weights and a lazily built metric's
  state are created here, eagerly.

  Args:
    task: the task.
    train_data: its training data.
    size: how many examples to probe with.
    class_weight: --class_weight ({class id: weight}), or None: the task's.
    replicas: the replicas in sync (the streaming metrics' merge is checked on
      more than one).

  Returns:
    (the model, its Objective, the names of the task's per-example metrics, the
    scalar names a call or an evaluation reports: "loss", the metrics and
    streaming metrics after `Task.finalize_metrics`; a confusion matrix is
    reported too, but cannot be a best metric or a sweep's objective).

  Raises:
    TaskError: build_model's result is not a Keras model; the loss or a metric
      is not one value per example; a metric name cannot be a tag; a streaming
      metric's state does not merge over replicas.
  """
  features, labels, weights = weighted(*train_data.first(size), batched=True)
  model, outputs = built_model(task, features)
  batch = int(tf.shape(tf.nest.flatten(features)[0])[0])

  metrics = _task_metrics(task, labels, outputs)
  streaming = objectives.streaming_metrics(task, reserved=(*RESERVED, *metrics))
  objective = objectives.Objective(task, streaming=streaming,
                                   class_weight=class_weight)
  objective.check_class_labels(labels)
  with user_code("Task.loss"):
    loss = objective.per_example_loss(labels, outputs)
  for name, values in {"loss": loss, **metrics}.items():
    _check_per_example(name, values, batch)
  loss = objective.loss(labels, outputs, weights, training=False)

  with user_code("Task.build_metrics' metrics (update_state)"):
    objective.update_streaming(labels, outputs, weights)
  sums = {name: float(value) for name, value in
          objective.metric_sums(labels, outputs, weights).items()}
  weight, loss_sum = float(tf.reduce_sum(weights)), float(tf.reduce_sum(loss))
  results = objective.streaming_results()
  objective.scalar_streaming = tuple(name for name, value in results.items()
                                     if value.shape.num_elements() == 1)
  reported = objective.report(
      {"loss": loss_sum / batch,
       **{name: value / weight if weight else 0.0 for name, value in sums.items()}},
      sums=dict(sums, loss=loss_sum, weight=weight), examples=batch,
      streaming=results)
  for metric, _ in streaming.values():
    metric.reset_state()
  if replicas > 1:  # After the report: it leaves the metrics reset.
    metric_merge.check_merge(streaming, labels, outputs, weights)
  scalars = tuple(name for name, value in reported.items()
                  if not isinstance(value, list))
  return model, objective, tuple(metrics), scalars


def _task_metrics(task: Task, labels, outputs) -> dict:
  """Task.metrics on a probe batch, its names checked.

  Raises:
    TaskError: it is not a dict, or a name cannot be a metric's.
  """
  with user_code("Task.metrics"):
    metrics = task.metrics(labels, outputs)
  if not isinstance(metrics, dict):
    raise TaskError(f"Task.metrics() must return a dict of per-example values, got "
                    f"{type(metrics).__name__}")
  for name in metrics:
    if (not isinstance(name, str) or name in RESERVED or _LEDGER_COLUMN.match(name)
        or not METRIC_NAME.match(name)):
      raise TaskError(f"Task.metrics(): {name!r} cannot be a metric name (use "
                      f"letters, digits, _ . -; not {', '.join(RESERVED)} or "
                      "replica_N)")
  return metrics


def built_model(task: Task, features) -> tuple:
  """(the task's new model, its float32 outputs on `features`): called once, so
  a subclassed model has its weights.

  Raises:
    TaskError: build_model's result is not a Keras model.
  """
  with user_code("Task.build_model"):
    model = task.build_model()
  if not isinstance(model, keras.Model):
    raise TaskError(f"Task.build_model() must return a keras.Model, got "
                    f"{type(model).__name__}")
  with user_code("Task.preprocess"):
    inputs = task.preprocess(features)
  with user_code(f"the model's call ({type(model).__name__})"):
    outputs = float32_outputs(model(inputs, training=False))
  return model, outputs


def _check_per_example(name: str, values, batch: int):
  """Raises TaskError unless `values` (the loss or metric `name`) is one value per
  example, with a hint for the usual mistake: a reduced Keras loss or metric."""
  shape = tuple(tf.convert_to_tensor(values).shape)
  if shape == (batch,):
    return
  what = "Task.loss" if name == "loss" else f"Task.metrics()[{name!r}]"
  hint = ""
  if shape == ():
    hint = ("; a Keras loss object reduces: make Task.loss the object itself "
            "(loss = keras.losses.X()) or call it with reduction=None"
            if name == "loss" else
            "; a keras.metrics.Metric belongs in Task.build_metrics(), which the "
            "framework updates and merges over replicas")
  raise TaskError(f"{what} must return one value per example, shape ({batch},) for "
                  f"a batch of {batch}, got shape {shape}{hint}")
