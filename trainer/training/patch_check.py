"""The start-up check that the Keras patches of replica_layers take effect.

Synchronized BatchNormalization, per-replica seeds and the checkpointed seed
states rest on Keras internals (trainer/internals.py). A Keras release that
renamed one would silently bring back what they fix: every replica drawing the
same Dropout mask, a resume that redraws other masks, per-replica statistics.
Before anything is written, `check_patches` runs a tiny BatchNormalization and
a Dropout once, eagerly, through the same accesses the patches use: the layer
must normalise with (and update its moving statistics from) the moments its
replaced `_moments` gives, and the Dropout must draw its mask through its seed
generator's `next`, found where the patches look for it. If not, the run is
refused in one line naming the Keras version and the supported range. (The
all-reduce itself is TensorFlow's public API, which the test suite covers.)
"""

import keras
import numpy as np
import tensorflow as tf

from trainer import internals
from trainer.errors import ConfigError


def check_patches():
  """Raises ConfigError unless the patches' accesses work in this Keras (a few
  milliseconds, no collective)."""
  try:
    problem = _batchnorm_problem() or _dropout_problem()
  except (AttributeError, TypeError, ValueError) as e:  # An internal gone.
    problem = f"{type(e).__name__}: {e}"
  if problem is not None:
    raise ConfigError(
        f"Keras {internals.keras_version()} is not supported: {problem}, so "
        "BatchNormalization and random layers would no longer equal one device "
        f"(trainer needs keras{internals.SUPPORTED_KERAS}, checked with "
        f"{internals.CHECKED_WITH['keras']}; pip install "
        f"'keras{internals.SUPPORTED_KERAS}')")


def _batchnorm_problem():
  """What a BatchNormalization with replaced moments does not do, or None."""
  norm = keras.layers.BatchNormalization(momentum=0.0, epsilon=0.0)
  model = keras.Sequential([keras.Input((1,)), norm])
  if norm not in internals.layers_of(model):
    return "the layers of a model cannot be listed"
  if internals.moments_overridden(norm) or internals.reduction_axes(norm) != [0]:
    return "BatchNormalization no longer computes its moments in _moments"
  calls = []

  def moments(inputs, mask):
    del inputs, mask
    calls.append(1)
    return tf.constant([5.0]), tf.constant([4.0])

  internals.replace_moments(norm, moments)
  outputs = norm(tf.constant([[1.0], [3.0]]), training=True)
  internals.restore_moments(norm)
  if not calls or not np.allclose(np.ravel(outputs), [-2.0, -1.0]) or not (
      np.allclose(norm.moving_mean.numpy(), 5.0)):
    return "BatchNormalization no longer normalises with the moments of _moments"
  return None


def _dropout_problem():
  """What a Dropout's seed generator does not do where the patches look for
  it, or None."""
  dropout = keras.layers.Dropout(0.5, seed=1)
  generators = internals.seed_generators(dropout)
  if len(generators) != 1 or not isinstance(generators[0],
                                            keras.random.SeedGenerator):
    return "a Dropout layer's seed generator cannot be found"
  generator = generators[0]
  draw, draws = generator.next, []

  def counted(*args, **kwargs):
    draws.append(1)
    return draw(*args, **kwargs)

  before = np.asarray(generator.state.numpy()).copy()
  generator.next = counted
  try:
    dropout(tf.ones([1, 8]), training=True)
  finally:
    generator.next = draw
  if not draws:
    return "a Dropout layer no longer draws its seeds through next()"
  if np.array_equal(before, generator.state.numpy()):
    return "a seed generator's state no longer counts its draws"
  return None
