"""What a step computes from a task's outputs, in-graph, on every replica.

The per-example loss (`Task.loss`, a function or a `keras.losses.Loss`), weighted
by each example's sample weight and, in training, its class weight
(`Task.class_weight`); the task's per-example metrics as weighted sums; and its
streaming Keras metrics (`Task.build_metrics`), updated on each replica with the
weights and merged across replicas and workers when read, each variable by its
declared aggregation (sum, mean or only_first_replica); metric_merge.py refuses,
before the first step, a metric whose state does not merge exactly.
"""

import inspect
import math

import keras
import numpy as np
import tensorflow as tf

from trainer.autograph import graph_code
from trainer.errors import ConfigError, TaskError, user_code
from trainer.tasks.base import METRIC_NAME
from trainer.training import blame


@tf.autograph.experimental.do_not_convert
def per_example(values):
  """A task's per-example loss or metric as float32 (shapes were checked on a
  probe batch before the first step: see trainer.py)."""
  return tf.cast(values, tf.float32)


class Objective:
  """A task's loss and metrics as a step computes them."""

  def __init__(self, task, *, streaming: dict, class_weight=None):
    """Args:
      task: the task.
      streaming: {name: (keras.metrics.Metric, output key or None)}, built under
        the strategy's scope (see `streaming_metrics`).
      class_weight: {class id: weight} applied to the training loss (classes not
        in it weigh 1), or None: the task's `class_weight`.

    Raises:
      TaskError: a class weight that is not {int >= 0: finite number}.
    """
    self._task = task
    loss = task.loss
    if isinstance(loss, keras.losses.Loss):
      loss = loss.call  # Per-example values, not their reduction.
    # The loops are traced without AutoGraph; the task's code is converted.
    self._loss, self._metrics = graph_code(loss), graph_code(task.metrics)
    # Task.preprocess as the gathered input calls it inside the loops.
    preprocess = graph_code(task.preprocess)

    def scoped_preprocess(features):
      with blame.scope("preprocess"):
        return preprocess(features)

    self.preprocess = scoped_preprocess
    self.streaming = streaming
    self._updates = [(graph_code(metric.update_state), key)
                     for metric, key in streaming.values()]
    self._results = {name: graph_code(metric.result)
                     for name, (metric, _) in streaming.items()}
    # The streaming metrics with one value (not a matrix): set by the probe.
    self.scalar_streaming = ()
    self.class_weight_source = ("Task.class_weight" if class_weight is None
                                else "--class_weight")
    self._class_weight = class_weight_table(
        task.class_weight if class_weight is None else class_weight,
        source=self.class_weight_source)
    parameters = inspect.signature(task.finalize_metrics).parameters
    self._finalize_takes = {
        name for name in ("sums", "examples")
        if name in parameters or any(p.kind == p.VAR_KEYWORD
                                     for p in parameters.values())}

  def per_example_loss(self, labels, outputs):
    """The task's loss of each example, unweighted."""
    with blame.scope("loss"):
      return per_example(self._loss(labels, outputs))

  def loss(self, labels, outputs, weights, *, training: bool):
    """Per-example losses times their weights (and, in training, their class's)."""
    values = self.per_example_loss(labels, outputs) * weights
    if training and self._class_weight is not None:
      values *= _class_weights(self._class_weight, _class_ids(labels))
    return values

  def check_class_labels(self, labels):
    """Refuses class weights on labels that are not class ids (checked on a
    probe batch): integers >= 0, one-hot rows, or soft binary labels in [0, 1].

    Raises:
      ConfigError: naming where the class weights came from and the labels.
    """
    if self._class_weight is None:
      return
    labels = np.asarray(tf.nest.flatten(labels)[0])
    if labels.ndim > 1 and labels.shape[-1] != 1:
      return  # One-hot (or soft) rows: the argmax is the class.
    if not (np.issubdtype(labels.dtype, np.number) or labels.dtype == np.bool_):
      raise ConfigError(f"{self.class_weight_source}: class weights need class "
                        "labels (integers >= 0, one-hot rows, or soft binary labels "
                        f"in [0, 1]), but Task.train_data()'s labels are "
                        f"{labels.dtype} (e.g. {labels.ravel()[0]!r})")
    values = labels.astype(np.float64).ravel()
    soft = values != np.round(values)
    if (values.size and (values.min() < 0 or
                         (soft.any() and values[soft].max() > 1.0))):
      raise ConfigError(
          f"{self.class_weight_source}: class weights need class labels (integers "
          ">= 0, one-hot rows, or soft binary labels in [0, 1]), but "
          f"Task.train_data()'s labels include {_odd_label(values, soft)}; weigh "
          "examples with sample weights instead (a third array or element)")

  def metric_sums(self, labels, outputs, weights) -> dict:
    """{name: weighted sum} of the task's per-example metrics."""
    with blame.scope("metrics"):
      metrics = self._metrics(labels, outputs)
    return {name: tf.reduce_sum(per_example(values) * weights)
            for name, values in metrics.items()}

  def update_streaming(self, labels, outputs, weights):
    """Updates every streaming metric with this replica's batch (call in a replica
    context)."""
    for name, (update, key) in zip(self.streaming, self._updates):
      with blame.scope("metric", name):
        update(labels, outputs if key is None else outputs[key],
               sample_weight=weights)

  @tf.autograph.experimental.do_not_convert
  def reset_streaming(self):
    """Zeroes this replica's streaming state (call through strategy.run)."""
    for metric, _ in self.streaming.values():
      metric.reset_state()

  def streaming_results(self) -> dict:
    """{name: result()} of the streaming metrics, merged over every replica (in a
    cross-replica context: under multi-worker, a collective)."""
    return {name: tf.cast(result(), tf.float32)
            for name, result in self._results.items()}

  def report(self, means: dict, *, sums: dict, examples, streaming: dict) -> dict:
    """What a loop call or an evaluation reports: `Task.finalize_metrics` of the
    means and the streaming metrics' results (plain floats, or nested lists for
    a non-scalar result such as a confusion matrix).

    Args:
      means: {"loss": mean, metric: weighted mean}.
      sums: {metric: weighted sum, "weight": the weights' sum}.
      examples: the number of examples (padding excluded).
      streaming: {name: result} of the streaming metrics.
    """
    values = dict(means)
    values.update({name: plain(value) for name, value in streaming.items()})
    extra = {"sums": sums, "examples": examples}
    with user_code("Task.finalize_metrics"):
      reported = self._task.finalize_metrics(
          values, **{k: v for k, v in extra.items() if k in self._finalize_takes})
    if not isinstance(reported, dict):
      raise TaskError(f"Task.finalize_metrics() must return a dict, got "
                      f"{type(reported).__name__}")
    return {name: plain(value) for name, value in reported.items()}


def plain(value):
  """A metric's value as a float (one value, as F1Score's of one class), or
  nested lists of floats (a confusion matrix)."""
  array = np.asarray(value, dtype=np.float64)
  return float(array.ravel()[0]) if array.size == 1 else array.tolist()


def class_weight_table(class_weight, *, source: str = "Task.class_weight"):
  """{class id: weight} as (class ids, weights) constants, or None. Classes not
  named weigh 1; no table as large as the largest id is built.

  Raises:
    TaskError: not a dict of int >= 0 to finite numbers >= 0, as --class_weight.
  """
  if not class_weight:
    return None
  if not isinstance(class_weight, dict) or not all(
      isinstance(k, (int, np.integer)) and k >= 0 and
      isinstance(v, (int, float, np.number)) and math.isfinite(v) and v >= 0
      for k, v in class_weight.items()):
    raise TaskError(f"{source} must be a dict of class ids (int >= 0) to finite "
                    f"weights >= 0, got {class_weight!r}"[:300])
  ids = sorted(class_weight)
  return (tf.constant(ids, tf.int64),
          tf.constant([float(class_weight[i]) for i in ids], tf.float32))


@tf.autograph.experimental.do_not_convert
def _class_weights(table, ids):
  """Each example's class weight: its class's, 1 where the class is not named."""
  class_ids, weights = table
  matches = tf.equal(tf.cast(ids, tf.int64)[:, None], class_ids[None, :])
  named = tf.reduce_any(matches, axis=1)
  return tf.where(named, tf.reduce_sum(tf.cast(matches, tf.float32) * weights,
                                       axis=1), 1.0)


@tf.autograph.experimental.do_not_convert
def _class_ids(labels):
  """Class ids of a batch of labels, as Keras fit takes them for class weights:
  one column (ints, or floats rounded: a soft label of 0.9 is class 1), or the
  argmax of one-hot (or soft) rows."""
  labels = tf.convert_to_tensor(tf.nest.flatten(labels)[0])
  if labels.shape.rank and labels.shape.rank > 1 and labels.shape[-1] != 1:
    return tf.argmax(labels, axis=-1, output_type=tf.int64)
  labels = tf.reshape(labels, [-1])
  if labels.dtype.is_floating:
    labels = tf.round(labels)
  return tf.cast(labels, tf.int64)


def _odd_label(values, soft) -> str:
  """The first label that is no class id, for the error."""
  bad = values[(values < 0) | (soft & (values > 1.0))]
  return f"{bad[0]:g}" if bad.size else f"{values[0]:g}"


def streaming_metrics(task, *, reserved) -> dict:
  """The task's streaming metrics, {name: (metric, output key or None)}; call
  inside the strategy's scope.

  Raises:
    TaskError: not a dict of keras.metrics.Metric (or (metric, output key)), or a
      name that another metric or the loss has.
  """
  with user_code("Task.build_metrics"):
    built = task.build_metrics() or {}
  if not isinstance(built, dict):
    raise TaskError(f"Task.build_metrics() must return a dict of "
                    f"keras.metrics.Metric, got {type(built).__name__}")
  metrics = {}
  for name, value in built.items():
    metric, key = value if isinstance(value, tuple) else (value, None)
    if not isinstance(metric, keras.metrics.Metric):
      raise TaskError(f"Task.build_metrics()[{name!r}] must be a keras.metrics."
                      f"Metric (or (metric, output key)), got {type(metric).__name__}")
    if not isinstance(name, str) or not METRIC_NAME.match(name):
      raise TaskError(f"Task.build_metrics(): {name!r} cannot be a metric name (use "
                      "letters, digits, _ . -)")
    if name in reserved:
      raise TaskError(f"Task.build_metrics(): {name!r} is already a metric name "
                      "(loss, examples, weight or one of Task.metrics())")
    metrics[name] = (metric, key)
  return metrics
