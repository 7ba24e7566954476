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


def _padded_sequences(count, seed):
  """Sequences of 12 steps x 4 features whose tails (random lengths, 3 to 12
  steps kept) are zero padding; the class is the sign of the first feature's
  sum over the kept steps."""
  rng = np.random.default_rng(seed)
  x = rng.normal(loc=1.0, scale=2.0, size=(count, 12, 4)).astype("float32")
  lengths = rng.integers(3, 13, size=count)
  x[np.arange(12)[None, :] >= lengths[:, None]] = 0.0
  return x, (x[:, :, 0].sum(axis=1) > lengths).astype("int32")


@dataclasses.dataclass
class MaskedNormTask(BatchNormTask):
  """Masking(0.0) -> BatchNormalization -> GlobalAveragePooling1D -> Dense(2):
  the BatchNormalization's statistics count only the unmasked steps (with
  `embedding`, the mask comes from an Embedding(mask_zero=True) of token ids)."""

  embedding: bool = False

  def build_model(self):
    if self.embedding:
      front = [keras.Input((12,), dtype="int32"),
               keras.layers.Embedding(20, 4, mask_zero=True)]
    else:
      front = [keras.Input((12, 4)), keras.layers.Masking(0.0)]
    return keras.Sequential(front + [keras.layers.BatchNormalization(),
                                     keras.layers.GlobalAveragePooling1D(),
                                     keras.layers.Dense(2)])

  def _data(self, count, seed):
    x, y = _padded_sequences(count, seed)
    if self.embedding:  # Token ids 1..19, 0 where padded.
      return np.where(x[:, :, 0] == 0, 0, 1 + (np.abs(x[:, :, 1]) * 5).astype(
          "int32") % 19).astype("int32"), y
    return x, y

  def train_data(self):
    return self._data(1024, seed=0)

  def eval_data(self):
    return self._data(203, seed=1)


@dataclasses.dataclass
class RawFeatureNormTask(BatchNormTask):
  """Raw features (mean `scale`, spread 1, as tabular data often is) straight
  into BatchNormalization -> Dense(16) -> ReLU -> Dense(2)."""

  scale: float = 1e3

  def build_model(self):
    return keras.Sequential([keras.Input((8,)), keras.layers.BatchNormalization(),
                             keras.layers.Dense(16), keras.layers.ReLU(),
                             keras.layers.Dense(2)])

  def _data(self, count, seed):
    rng = np.random.default_rng(seed)
    noise = rng.normal(size=(count, 8))
    return ((self.scale + noise).astype("float32"),
            (noise[:, 0] + noise[:, 1] > 0).astype("int32"))

  def train_data(self):
    return self._data(1024, seed=0)

  def eval_data(self):
    return self._data(203, seed=1)


class SelectedNorm(keras.layers.Layer):
  """A BatchNormalization of the rows whose first feature is positive only
  (`tf.boolean_mask`): each replica normalises another number of rows, none in
  some batches; the other rows pass through."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.norm = keras.layers.BatchNormalization()

  def build(self, input_shape):
    self.norm.build((None, input_shape[-1]))

  def call(self, inputs, training=None):
    rows = tf.where(inputs[:, 0] > 0.0)
    normalized = self.norm(tf.gather_nd(inputs, rows), training=training)
    return tf.tensor_scatter_nd_update(inputs, rows, normalized)


@dataclasses.dataclass
class SelectedRowsNormTask(BatchNormTask):
  """SelectedNorm -> Dense(2). The data comes in blocks of 16 whose first 3 rows
  are selected (first feature positive): with --shuffle=false and 8 examples per
  replica, replica 1 selects no row at all."""

  def build_model(self):
    return keras.Sequential([keras.Input((5,)), SelectedNorm(),
                             keras.layers.Dense(2)])

  def train_data(self):
    x, y = _blobs(1024, seed=0)
    x[:, 0] = np.where(np.arange(1024) % 16 < 3, np.abs(x[:, 0]) + 2.0,
                       -np.abs(x[:, 0]))
    return x, y


class NormalizedCell(keras.layers.Layer):
  """A recurrent cell with a BatchNormalization inside: it runs in the RNN's
  tf.while_loop."""

  def __init__(self, units=4, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.state_size = units
    self.dense = keras.layers.Dense(units)
    self.norm = keras.layers.BatchNormalization(name="cell_norm")

  def call(self, inputs, states, training=None):
    output = keras.ops.tanh(self.norm(self.dense(inputs) + states[0],
                                      training=training))
    return output, [output]


@dataclasses.dataclass
class RecurrentNormTask(BatchNormTask):
  """RNN(NormalizedCell) -> Dense(2) on the padded sequences; with `hidden`, the
  cell is inside a user's layer's tf.cond, where no structure shows it."""

  hidden: bool = False

  def build_model(self):
    return keras.Sequential([keras.Input((12, 4)),
                             keras.layers.RNN(NormalizedCell()),
                             keras.layers.Dense(2)])

  def train_data(self):
    return _padded_sequences(256, seed=0)

  def eval_data(self):
    return None


@dataclasses.dataclass
class RenormTask(RawFeatureNormTask):
  """BatchNormalization(renorm=True) -> Dense(2) on features of spread 1."""

  scale: float = 1.0

  def build_model(self):
    return keras.Sequential([keras.Input((8,)),
                             keras.layers.BatchNormalization(renorm=True),
                             keras.layers.Dense(2)])


class OwnMoments(keras.layers.BatchNormalization):
  """A user's BatchNormalization with its own moments (about a fixed shift)."""

  def _moments(self, inputs, mask):
    mean, variance = super()._moments(inputs + 1.0, mask)
    return mean - 1.0, variance


@dataclasses.dataclass
class OwnMomentsTask(RawFeatureNormTask):
  scale: float = 1.0

  def build_model(self):
    return keras.Sequential([keras.Input((8,)), OwnMoments(name="own_norm"),
                             keras.layers.Dense(2)])
