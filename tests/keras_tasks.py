"""Tasks a Keras user would write with what they already have: metric objects
(`build_metrics`), loss objects, sample weights in the data and class weights.
Loaded by tests through `--task=keras_tasks:NAME` (tests/ on PYTHONPATH) or
passed to trainer.train; each has the plain-Keras twin the tests compare with."""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

import trainer

NUM_FEATURES = 6


class ConfusionMatrix(keras.metrics.Metric):
  """Counts of (true class, predicted class) for a sigmoid output: a metric
  whose state and result are a matrix."""

  def __init__(self, threshold=0.5, name="confusion_matrix", **kwargs):
    super().__init__(name=name, **kwargs)
    self.threshold = threshold
    self.counts = self.add_variable(shape=(2, 2), initializer="zeros",
                                    name="counts")

  def update_state(self, y_true, y_pred, sample_weight=None):
    true = tf.reshape(tf.cast(y_true, tf.int32), [-1])
    predicted = tf.reshape(tf.cast(y_pred > self.threshold, tf.int32), [-1])
    weights = (tf.ones_like(true, tf.float32) if sample_weight is None
               else tf.reshape(tf.cast(sample_weight, tf.float32), [-1]))
    self.counts.assign_add(tf.math.confusion_matrix(
        true, predicted, num_classes=2, weights=weights, dtype=tf.float32))

  def result(self):
    return tf.convert_to_tensor(self.counts)


class LastBatchMean(keras.metrics.Metric):
  """A metric whose state is merged by "mean": it cannot be merged exactly."""

  def __init__(self, name="last_batch_mean", **kwargs):
    super().__init__(name=name, **kwargs)
    self.value = self.add_variable(shape=(), initializer="zeros", name="value",
                                   aggregation="mean")

  def update_state(self, y_true, y_pred, sample_weight=None):
    del y_true, sample_weight
    self.value.assign(tf.reduce_mean(y_pred))

  def result(self):
    return tf.convert_to_tensor(self.value)


def imbalanced_arrays(n, seed, *, weighted=False):
  """Binary labels, about 1 in 8 positive, learnable from the features; with
  `weighted`, a third element of sample weights in [0.5, 2]."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, NUM_FEATURES)).astype("float32")
  score = x @ np.linspace(-1.0, 1.5, NUM_FEATURES) + rng.normal(size=n)
  y = (score > 2.0).astype("float32")[:, None]
  if weighted:
    return x, y, rng.uniform(0.5, 2.0, size=n).astype("float32")
  return x, y


def streaming_metrics():
  """The metrics both the task and its plain-Keras twin compute."""
  return {"auc": keras.metrics.AUC(num_thresholds=200, name="auc"),
          "precision": keras.metrics.Precision(name="precision"),
          "recall": keras.metrics.Recall(name="recall"),
          "f1": keras.metrics.F1Score(threshold=0.5, name="f1"),
          "false_negatives": keras.metrics.FalseNegatives(name="false_negatives"),
          "confusion": ConfusionMatrix(name="confusion")}


def imbalanced_model():
  return keras.Sequential([
      keras.Input((NUM_FEATURES,)),
      keras.layers.Dense(8, activation="relu",
                         kernel_initializer=keras.initializers.GlorotUniform(1)),
      keras.layers.Dense(1, activation="sigmoid",
                         kernel_initializer=keras.initializers.GlorotUniform(2))])


@dataclasses.dataclass
class Imbalanced(trainer.Task):
  """A binary classifier with a Keras loss object and streaming metrics, its
  eval split (203 examples) not a multiple of any global batch."""

  train_examples: int = 512
  eval_examples: int = 203
  eval_weights: bool = False

  loss = keras.losses.BinaryCrossentropy()
  metric_goals = {"auc": "max"}

  def build_model(self):
    return imbalanced_model()

  def build_metrics(self):
    return streaming_metrics()

  def train_data(self):
    return imbalanced_arrays(self.train_examples, seed=0)

  def eval_data(self):
    return imbalanced_arrays(self.eval_examples, seed=1,
                             weighted=self.eval_weights)


@dataclasses.dataclass
class ImbalancedWeighted(Imbalanced):
  """Imbalanced with a sample weight per training example."""

  def train_data(self):
    return imbalanced_arrays(self.train_examples, seed=0, weighted=True)


@dataclasses.dataclass
class ImbalancedClassWeight(Imbalanced):
  """Imbalanced with Keras-style class weights on the training loss."""

  class_weight = {0: 0.6, 1: 4.0}


@dataclasses.dataclass
class UnmergeableMetric(Imbalanced):
  def build_metrics(self):
    return {"last": LastBatchMean()}


@dataclasses.dataclass
class DictOutputs(Imbalanced):
  """A model with dict outputs: each streaming metric names the output it reads;
  finalize_metrics derives a metric from the sums and the example count."""

  def build_model(self):
    inputs = keras.Input((NUM_FEATURES,))
    logits = keras.layers.Dense(1)(keras.layers.Dense(8, activation="relu")(inputs))
    return keras.Model(inputs, {"logits": logits,
                                "probability": keras.layers.Activation(
                                    "sigmoid")(logits)})

  def loss(self, labels, outputs):
    return keras.losses.binary_crossentropy(labels, outputs["logits"],
                                            from_logits=True)

  def metrics(self, labels, outputs):
    return {"positive": tf.cast(labels[:, 0] > 0.5, tf.float32)}

  def build_metrics(self):
    return {"auc": (keras.metrics.AUC(), "probability")}

  def finalize_metrics(self, means, *, sums, examples):
    return dict(means, positives=sums["positive"], counted=float(examples))


class MaxError(keras.metrics.Metric):
  """The largest absolute error seen: a running maximum in a variable Keras
  declares "sum" (its default), so summing the replicas' copies is wrong."""

  def __init__(self, name="max_error", **kwargs):
    super().__init__(name=name, **kwargs)
    self.largest = self.add_variable(shape=(), initializer="zeros", name="largest")

  def update_state(self, y_true, y_pred, sample_weight=None):
    del sample_weight
    error = tf.reduce_max(tf.abs(tf.cast(y_true, tf.float32) - y_pred))
    self.largest.assign(tf.maximum(self.largest, error))

  def result(self):
    return tf.convert_to_tensor(self.largest)


@dataclasses.dataclass
class MaxErrorMetric(Imbalanced):
  def build_metrics(self):
    return {"max_error": MaxError()}


class FailsAfter(keras.metrics.Metric):
  """A mean of the predictions whose update_state fails, in the graph, once it
  has seen `limit` examples (as a user's metric with a bug in a rare case)."""

  def __init__(self, limit=200, name="fails_after", **kwargs):
    super().__init__(name=name, **kwargs)
    self.limit = limit
    self.seen = self.add_variable(shape=(), initializer="zeros", name="seen")

  def update_state(self, y_true, y_pred, sample_weight=None):
    del y_true, sample_weight
    self.seen.assign_add(tf.cast(tf.shape(y_pred)[0], tf.float32))
    tf.debugging.assert_less(self.seen, float(self.limit),
                             message="the bins overflowed")

  def result(self):
    return tf.convert_to_tensor(self.seen)


@dataclasses.dataclass
class FailingMetric(Imbalanced):
  def build_metrics(self):
    return {"fragile": FailsAfter()}


class ExampleCount(keras.metrics.Metric):
  """Counts the examples it is given, ignoring their weights (as many a user's
  metric does)."""

  def __init__(self, name="count", **kwargs):
    super().__init__(name=name, **kwargs)
    self.count = self.add_variable(shape=(), initializer="zeros", name="count")

  def update_state(self, y_true, y_pred, sample_weight=None):
    del y_true, sample_weight
    self.count.assign_add(tf.cast(tf.shape(y_pred)[0], tf.float32))

  def result(self):
    return tf.convert_to_tensor(self.count)


@dataclasses.dataclass
class CountingMetric(Imbalanced):
  """100 eval examples, padded to whole global batches: the count must be 100."""

  eval_examples: int = 100

  def build_metrics(self):
    return {"count": ExampleCount()}
