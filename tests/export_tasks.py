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
      raise ValueError("serving_outputs has a bug")
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
