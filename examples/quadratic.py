"""A complete user task: learn y = sum(x**2) from 3 features (the README's example).

  PYTHONPATH=examples python -m trainer.main --task=quadratic:Quadratic \
      --task.hidden=64 --cpu_devices=2 --model_dir=runs/quad
"""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

import trainer


def _examples(count, seed):
  x = np.random.default_rng(seed).normal(size=(count, 3)).astype("float32")
  return x, (x ** 2).sum(axis=1, keepdims=True)


@dataclasses.dataclass
class Quadratic(trainer.Task):
  hidden: int = 32  # A hyperparameter: --task.hidden=64 on the command line.

  layout_fields = ("hidden",)  # A resume with another width is refused.

  def build_model(self):  # Any Keras model: functional, Sequential or subclassed.
    return keras.Sequential([keras.layers.Dense(self.hidden, activation="relu"),
                             keras.layers.Dense(1)])

  def train_data(self):  # Arrays (exact order, exact resume) or a tf.data.Dataset.
    return _examples(4096, seed=0)

  def eval_data(self):  # Every example is evaluated exactly once.
    return _examples(1000, seed=1)

  def loss(self, labels, outputs):  # Per-example losses, shape [batch].
    return tf.reduce_mean(tf.square(outputs - labels), axis=-1)

  def metrics(self, labels, outputs):  # Per-example values; reported as exact means.
    return {"mae": tf.reduce_mean(tf.abs(outputs - labels), axis=-1)}
