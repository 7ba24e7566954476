"""Simulated Keras releases that moved what trainer's patches rest on
(trainer/internals.py). `--task=keras_changes:RenamedSeedGenerators` or
`--task=keras_changes:MomentsElsewhere` imports this module, which makes the
change before the run starts."""

import dataclasses
import os

import keras

import trainer
from layer_tasks import BatchNormTask

_CHANGE = os.environ.get("KERAS_CHANGE", "")

if _CHANGE == "seed_generators":
  # A Keras that keeps a layer's seed generators under another name: the
  # framework's accessor finds none.
  trainer.internals._SEED_GENERATORS = "_seed_generators_before_the_rename"
elif _CHANGE == "moments":
  # A Keras whose BatchNormalization computes its moments without calling
  # `_moments`: the synchronized moments are never used.
  _keras_moments = keras.layers.BatchNormalization._moments

  def _call(self, inputs, training=None, mask=None):
    if training and self.trainable:
      mean, variance = _keras_moments(self, keras.ops.cast(inputs, "float32"), mask)
      self.moving_mean.assign(self.moving_mean * self.momentum
                              + mean * (1.0 - self.momentum))
      self.moving_variance.assign(self.moving_variance * self.momentum
                                  + variance * (1.0 - self.momentum))
    else:
      mean, variance = self.moving_mean, self.moving_variance
    return keras.ops.batch_normalization(inputs, mean, variance, axis=self.axis,
                                         offset=self.beta, scale=self.gamma,
                                         epsilon=self.epsilon)

  keras.layers.BatchNormalization.call = _call


@dataclasses.dataclass
class Dropout(BatchNormTask):
  dropout: float = 0.5
