"""Models of every kind a run can train, for the export test: random
augmentation, dropout and seed generators; dict and list outputs; string
inputs; a subclassed model (which Keras cannot load without its code); mixed
precision (with --mixed_precision). Loaded as `--task=export_tasks:Exportable`
with `--task.kind=KIND`."""

import dataclasses

import keras
import numpy as np

import trainer

KINDS = ("augment", "dict_outputs", "list_outputs", "strings", "subclassed",
         "mixed")
WORDS = ["red", "green", "blue", "cyan", "black", "white"]


class Subclassed(keras.Model):
  """Not registered with Keras: its model.keras cannot be loaded without this
  module."""

  def __init__(self):
    super().__init__()
    self.flatten = keras.layers.Flatten()
    self.hidden = keras.layers.Dense(8, activation="relu")
    self.out = keras.layers.Dense(2)

  def call(self, inputs):
    return self.out(self.hidden(self.flatten(inputs)))


def features(kind, count, seed):
  """`count` examples' features for a model of `kind` (what the export takes)."""
  rng = np.random.default_rng(seed)
  if kind == "strings":
    return rng.choice(WORDS, size=(count, 1)).astype(object)
  return rng.normal(size=(count, 6, 6, 1)).astype("float32")


def _labels(kind, x):
  if kind == "strings":
    return np.array([WORDS.index(w) % 2 for w in x[:, 0]], "int32")
  return (x.mean(axis=(1, 2, 3)) > 0).astype("int32")


@dataclasses.dataclass
class Exportable(trainer.Task):
  kind: str = trainer.hyperparameter("augment", "Which model.", choices=KINDS)
  fail_export: bool = False  # A serving method with a bug, fixed by a rerun.

  layout_fields = ("kind",)

  def serving_outputs(self, outputs):
    if self.fail_export:
      raise RuntimeError("serving_outputs has a bug")  # Any error type.
    return outputs

  def build_model(self):
    if self.kind == "subclassed":
      return Subclassed()
    if self.kind == "strings":
      words = keras.Input((1,), dtype="string")
      ids = keras.layers.StringLookup(vocabulary=WORDS)(words)
      hidden = keras.layers.Flatten()(keras.layers.Embedding(len(WORDS) + 1, 4)(ids))
      return keras.Model(words, keras.layers.Dense(2)(hidden))
    images = keras.Input((6, 6, 1))
    hidden = images
    if self.kind == "augment":
      hidden = keras.layers.RandomTranslation(0.2, 0.2)(hidden)
      hidden = keras.layers.RandomFlip()(hidden)
      hidden = keras.layers.GaussianNoise(0.1)(hidden)
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Flatten()(hidden))
    hidden = keras.layers.Dropout(0.3)(hidden)
    logits = keras.layers.Dense(2, dtype="float32")(hidden)
    if self.kind == "dict_outputs":
      return keras.Model(images, {"logits": logits,
                                  "probabilities": keras.layers.Softmax()(logits)})
    if self.kind == "list_outputs":
      return keras.Model(images, [logits, keras.layers.Softmax()(logits)])
    return keras.Model(images, logits)

  def train_data(self):
    x = features(self.kind, 256, seed=0)
    return x, _labels(self.kind, x)

  def loss(self, labels, outputs):
    logits = (outputs["logits"] if isinstance(outputs, dict) else
              outputs[0] if isinstance(outputs, (list, tuple)) else outputs)
    return keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                        from_logits=True)


@dataclasses.dataclass
class NoInput(trainer.Task):
  """The README's kind of model: a Sequential without keras.Input, built by its
  first call (on a probe batch of 8)."""

  layout_fields = ()

  def build_model(self):
    return keras.Sequential([keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1)])

  def train_data(self):
    x = np.random.default_rng(0).normal(size=(256, 3)).astype("float32")
    return x, (x ** 2).sum(axis=1, keepdims=True)

  def loss(self, labels, outputs):
    return keras.ops.mean(keras.ops.square(outputs - labels), axis=-1)


def table(count, seed):
  """Columns as pandas stores them: int64 and float64."""
  rng = np.random.default_rng(seed)
  return {"age": rng.integers(20, 80, size=(count, 1)).astype("int64"),
          "chol": rng.normal(240.0, 40.0, size=(count, 1)).astype("float64")}


@dataclasses.dataclass
class Table(trainer.Task):
  """Dict features stored int64 and float64, normalised in preprocess, and a
  noise Sequential kept on the task for the input pipeline (mapped over the
  training data, never served)."""

  def prepare(self, context):
    del context
    self.augment = keras.Sequential([keras.layers.GaussianNoise(0.01, seed=1)])

  def build_model(self):
    return keras.Sequential([keras.layers.Dense(4, activation="relu"),
                             keras.layers.Dense(1)])

  def preprocess(self, features):
    age = (keras.ops.cast(features["age"], "float32") - 50.0) / 20.0
    chol = keras.ops.cast((features["chol"] - 240.0) / 40.0, "float32")
    return keras.ops.concatenate([age, chol], axis=-1)

  def train_data(self):
    x = table(256, seed=0)
    y = (x["age"] > 50).astype("float32")
    import tensorflow as tf  # After the devices are set up (prepare ran).
    data = tf.data.Dataset.from_tensor_slices((x, y))
    return data.map(lambda f, label: (
        dict(f, chol=self.augment(f["chol"], training=True)), label))

  def loss(self, labels, outputs):
    return keras.ops.mean(keras.ops.square(outputs - labels), axis=-1)


class Scaler:
  """Made in Task.prepare (TensorFlow is up by then): a tf.Module whose own
  tf.function reads a lookup table it does not track, so it cannot be saved
  whole (its variable can)."""

  @staticmethod
  def build():
    import tensorflow as tf

    table = tf.lookup.StaticHashTable(  # Held by the closure only: untracked.
        tf.lookup.KeyValueTensorInitializer(["a"], [1.0]), default_value=0.0)

    class _Scaler(tf.Module):
      def __init__(self):
        super().__init__()
        self.scale = tf.Variable(0.5)

      @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
      def unsaveable(self, words):
        return table.lookup(words)

    return _Scaler()


@dataclasses.dataclass
class Scaled(NoInput):
  """Its preprocess reads Task.scaler's variable (the only part of it that the
  export saves)."""

  def prepare(self, context):
    del context
    self.scaler = Scaler.build()

  def preprocess(self, features):
    return features * self.scaler.scale


@dataclasses.dataclass
class Augmented(trainer.Task):
  """keras-io's image classification recipe: an augmentation Sequential kept on
  the task and mapped over the training images, which the export must leave
  out (it blocked the export: its seed states are captured by its own traced
  functions)."""

  def prepare(self, context):
    del context
    self.augment = keras.Sequential([keras.layers.RandomFlip("horizontal"),
                                     keras.layers.RandomRotation(0.1)])

  def build_model(self):
    images = keras.Input((6, 6, 1))
    hidden = keras.layers.Flatten()(images)
    return keras.Model(images, keras.layers.Dense(2)(hidden))

  def train_data(self):
    import tensorflow as tf  # After the devices are set up (prepare ran).
    x = features("augment", 128, seed=0)
    data = tf.data.Dataset.from_tensor_slices((x, _labels("augment", x)))
    return data.map(lambda image, label: (self.augment(image, training=True), label))

  def loss(self, labels, outputs):
    return keras.losses.sparse_categorical_crossentropy(labels, outputs,
                                                        from_logits=True)


EPOCH = 1.7e9  # Unix seconds (November 2023): float32 spaces them 128 apart.


def timestamps(count, seed):
  """Unix seconds as pandas stores them (float64), with fractions of a second."""
  rng = np.random.default_rng(seed)
  return rng.uniform(EPOCH, EPOCH + 30 * 86400, size=(count, 1))


@dataclasses.dataclass
class Timestamps(trainer.Task):
  """A float64 feature of Unix seconds that preprocess turns into hours since
  EPOCH: float32 would put every timestamp on a 128-second grid."""

  layout_fields = ()

  def build_model(self):
    hours = keras.Input((1,))
    return keras.Model(hours, keras.layers.Dense(1)(hours))

  def preprocess(self, features):
    return keras.ops.cast((features - EPOCH) / 3600.0, "float32")

  def train_data(self):
    x = timestamps(256, seed=0)
    return x, ((x - EPOCH) / 86400.0).astype("float32")

  def loss(self, labels, outputs):
    return keras.ops.mean(keras.ops.square(outputs - labels), axis=-1)


VOCABULARY, SEQUENCE = 50, 8


def token_ids(count, seed):
  """Token ids as keras.utils.pad_sequences returns them (int32)."""
  rng = np.random.default_rng(seed)
  return rng.integers(0, VOCABULARY, size=(count, SEQUENCE)).astype("int32")


@dataclasses.dataclass
class TokenIds(trainer.Task):
  """keras-io's Transformer text classifier's way: int32 token ids into a
  float32 `keras.Input((maxlen,))`, embedded."""

  layout_fields = ()

  def build_model(self):
    ids = keras.Input((SEQUENCE,))  # float32, as keras-io writes it.
    hidden = keras.layers.Embedding(VOCABULARY, 4)(ids)
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    return keras.Model(ids, keras.layers.Dense(2)(hidden))

  def train_data(self):
    x = token_ids(256, seed=0)
    return x, (x[:, 0] % 2).astype("int32")

  def loss(self, labels, outputs):
    return keras.losses.sparse_categorical_crossentropy(labels, outputs,
                                                        from_logits=True)


def records(count, seed):
  """A table of a string and a float64 column."""
  rng = np.random.default_rng(seed)
  return {"color": rng.choice(WORDS, size=(count, 1)).astype(object),
          "size": rng.normal(10.0, 3.0, size=(count, 1))}


@dataclasses.dataclass
class Featured(trainer.Task):
  """keras-io's structured data recipe: a keras.utils.FeatureSpace adapted in
  Task.prepare, kept on the task and applied by preprocess."""

  layout_fields = ()

  def prepare(self, context):
    del context
    import tensorflow as tf  # After the devices are set up.
    space = keras.utils.FeatureSpace
    self.features = space(features={"color": space.string_categorical(),
                                    "size": space.float_normalized()},
                          output_mode="concat")
    self.features.adapt(tf.data.Dataset.from_tensor_slices(records(256, seed=0)))

  def build_model(self):
    return keras.Sequential([keras.layers.Dense(4, activation="relu"),
                             keras.layers.Dense(1)])

  def preprocess(self, features):
    return self.features(features)

  def train_data(self):
    x = records(256, seed=0)
    return x, (x["size"] > 10.0).astype("float32")

  def loss(self, labels, outputs):
    return keras.ops.mean(keras.ops.square(outputs - labels), axis=-1)


@dataclasses.dataclass
class Iterating(NoInput):
  """Its preprocess reads a tf.data iterator kept on the task: an export
  cannot hold one."""

  def prepare(self, context):
    del context
    import tensorflow as tf
    self.offsets = iter(tf.data.Dataset.from_tensors(0.5).repeat())

  def preprocess(self, features):
    return features + next(self.offsets)
