"""Tasks with the layers most models have: BatchNormalization (nested every way
Keras allows) and Dropout. Loaded by `--task=layer_tasks:NAME` (tests/ on
PYTHONPATH) or passed to trainer.train."""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

import trainer


def _blobs(count, seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(count, 5)).astype("float32")
  return x, (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")


class NormalizedBlock(keras.layers.Layer):
  """A user's own layer that holds a BatchNormalization."""

  def __init__(self, units, **kwargs):
    super().__init__(**kwargs)
    self.dense = keras.layers.Dense(units)
    self.norm = keras.layers.BatchNormalization(name="block_norm")

  def call(self, inputs, training=None):
    return keras.ops.relu(self.norm(self.dense(inputs), training=training))


class NestedNorms(keras.Model):
  """A subclassed model: a user's layer with a BatchNormalization, then an inner
  Sequential with another."""

  def __init__(self):
    super().__init__()
    self.block = NormalizedBlock(16)
    self.inner = keras.Sequential([keras.layers.Dense(8),
                                   keras.layers.BatchNormalization(),
                                   keras.layers.ReLU()])
    self.out = keras.layers.Dense(2)

  def call(self, inputs, training=None):
    return self.out(self.inner(self.block(inputs, training=training),
                               training=training))


@dataclasses.dataclass
class BatchNormTask(trainer.Task):
  """Dense(16) -> BatchNormalization -> ReLU -> [Dropout] -> Dense(2) (or, nested,
  NestedNorms) on two classes of 5-d blobs."""

  nested: bool = False
  dropout: float = 0.0

  layout_fields = ()

  def build_model(self):
    if self.nested:
      return NestedNorms()
    layers = [keras.layers.Dense(16), keras.layers.BatchNormalization(),
              keras.layers.ReLU()]
    if self.dropout:
      layers.append(keras.layers.Dropout(self.dropout, seed=7))
    return keras.Sequential(layers + [keras.layers.Dense(2)])

  def train_data(self):
    return _blobs(1024, seed=0)

  def eval_data(self):
    return _blobs(203, seed=1)  # Not a multiple of any global batch: padded.

  def loss(self, labels, outputs):
    return keras.losses.sparse_categorical_crossentropy(labels, outputs,
                                                        from_logits=True)

  def metrics(self, labels, outputs):
    predicted = tf.argmax(outputs, axis=-1, output_type=tf.int32)
    return {"accuracy": tf.cast(tf.equal(predicted, labels), tf.float32)}


@dataclasses.dataclass
class InBatchNegatives(trainer.Task):
  """A retrieval-style loss: each example's embedding against every other
  example's of its batch (a softmax over the batch), so an example's loss depends
  on which examples share its replica's batch."""

  layout_fields = ()

  def build_model(self):
    return keras.Sequential([keras.layers.Dense(8)])

  def train_data(self):
    x, _ = _blobs(512, seed=3)
    return x, x[:, :2]  # A paired view of each example.

  def loss(self, labels, outputs):
    queries = outputs[:, :2]
    scores = tf.matmul(queries, labels, transpose_b=True)  # [batch, batch]
    targets = tf.range(tf.shape(scores)[0])
    return tf.nn.sparse_softmax_cross_entropy_with_logits(targets, scores)
