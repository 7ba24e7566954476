"""Layers whose state or randomness is per replica, made to match one device.

Two kinds of layer break "N replicas equal one device" as Keras builds them:

- BatchNormalization normalises with its batch's statistics. Keras computes them
  on the replica's own batch, and updates moving statistics whose variables
  (aggregation "none") each replica keeps on its own, so the copies drift apart.
  `synchronize_batchnorm` makes every BatchNormalization of a model normalise
  with the global batch's moments, masked or not, at any input scale
  (`global_moments`: one all-reduce per layer in the forward pass, and one more
  for its gradient); every replica then computes the same moving statistics. A
  user's subclass with its own `_moments` is left as its author wrote it.
  Layers that normalise per replica (--sync_batchnorm=false, as Keras `fit`
  does it, or such a subclass) have their moving statistics averaged over the
  replicas at every step, in the all-reduce of the gradients (`Averaged`): an
  evaluation, a checkpoint and an export all see one value, and the average is
  a function of the step, so a resume is bit-exact.
- Random layers (Dropout, GaussianNoise, the Random* augmentations, a user's
  `keras.random` call with a SeedGenerator) draw a seed from a SeedGenerator
  whose state is mirrored, so every replica draws the same mask.
  `draw_per_replica` folds the global replica id into every seed drawn inside a
  replica step: each replica draws its own noise, replica 0 draws what one
  device draws, and the state (checkpointed, the same on every replica) stays a
  count of draws: the randomness is a function of (seed, step, global replica),
  so a resume redraws the same.

Both rest on Keras internals (trainer/internals.py); `check_patches` verifies
at start-up that they take effect.
"""

import contextlib
import dataclasses
import functools

import keras
import tensorflow as tf

from trainer import internals
from trainer.errors import TaskError
from trainer.training.global_moments import global_moments

# An odd 31-bit constant (from the golden ratio): replica r's seeds differ from
# replica 0's in many bits.
_REPLICA_MIX = 0x4F1BBCDD
_PER_REPLICA_MARK = "_trainer_per_replica"


def batchnorm_layers(model: keras.Model) -> list:
  """Every BatchNormalization in `model`, however it is nested: Sequential,
  functional, subclassed, inner models, a user's own layer holding one."""
  return [layer for layer in internals.layers_of(model)
          if isinstance(layer, keras.layers.BatchNormalization)]


def synchronize_batchnorm(model: keras.Model) -> list:
  """Makes every BatchNormalization of `model` normalise with the global batch's
  moments while training (see the module docstring). Returns the layers left
  alone: a user's subclass that computes its own `_moments`."""
  _refuse_in_recurrent_cells(model)
  left_alone = []
  for layer in batchnorm_layers(model):
    if internals.moments_overridden(layer):
      left_alone.append(layer)
      continue
    internals.replace_moments(layer, functools.partial(
        _synchronized_moments, layer, type(layer)._moments.__get__(layer)))
  return left_alone


def _in_control_flow(layer) -> TaskError:
  """The error of a BatchNormalization that runs inside control flow."""
  return TaskError(
      f"layer {layer.name!r} (BatchNormalization) runs inside control flow (a "
      "recurrent cell, a loop or a cond), where its statistics cannot be "
      "synchronized over the replicas; use --sync_batchnorm=false (each "
      "replica's own batch, as Keras fit does)")


def _refuse_in_recurrent_cells(model: keras.Model):
  """Raises TaskError for a BatchNormalization in a recurrent layer's cell (it
  runs in the RNN's tf.while_loop), before anything runs."""
  for layer in internals.layers_of(model):
    cell = getattr(layer, "cell", None) if isinstance(
        layer, keras.layers.RNN) and not layer.unroll else None  # Unrolled: no loop.
    if isinstance(cell, keras.layers.Layer):
      for inner in internals.layers_of(cell):
        if isinstance(inner, keras.layers.BatchNormalization):
          raise _in_control_flow(inner)


def is_synchronized(layer) -> bool:
  """Whether `layer` normalises with the global batch's moments: made so by
  `synchronize_batchnorm`, or by Keras (its own `synchronized=True`)."""
  return "_moments" in vars(layer) or bool(getattr(layer, "synchronized", False))


@contextlib.contextmanager
def as_keras_built(model: keras.Model):
  """Within the block, every BatchNormalization of `model` computes its moments
  as Keras built it (one device's reference in the equivalence check)."""
  patched = {id(layer): vars(layer)["_moments"] for layer in batchnorm_layers(model)
             if "_moments" in vars(layer)}
  layers = [layer for layer in batchnorm_layers(model) if id(layer) in patched]
  for layer in layers:
    internals.restore_moments(layer)
  try:
    yield
  finally:
    for layer in layers:
      internals.replace_moments(layer, patched[id(layer)])


@tf.autograph.experimental.do_not_convert
def _synchronized_moments(layer, keras_moments, inputs, mask):
  """`layer`'s moments in training: the global batch's inside a replica step,
  Keras's own elsewhere (building, a one-device call)."""
  context = tf.distribute.get_replica_context()
  if context is None or tf.distribute.in_cross_replica_context() or (
      context.num_replicas_in_sync == 1):
    return keras_moments(inputs, mask)
  try:
    return global_moments(inputs, mask, axes=internals.reduction_axes(layer),
                          context=context)
  except RuntimeError as e:
    if "merge_call" not in str(e):
      raise
    # Inside a tf.while_loop or tf.cond of the replica step (a user's loop), a
    # cross-replica op cannot run.
    raise _in_control_flow(layer) from None


@dataclasses.dataclass(frozen=True)
class Averaged:
  """The moving statistics that replicas update on their own, averaged at every
  step.

  Attributes:
    variables: the tf.Variables whose replica copies are set to their mean.
    derived: (variance, stddev, epsilon) of renormalizing layers: their moving
      variance is Keras's function of the averaged moving stddev
      (relu(stddev² - epsilon)), not an average of its own.
  """
  variables: tuple = ()
  derived: tuple = ()

  def __bool__(self):
    return bool(self.variables)

  @tf.autograph.experimental.do_not_convert
  def local_values(self):
    """This replica's copies as one vector (call in a replica context)."""
    return tf.concat([tf.reshape(v.read_value(), [-1]) for v in self.variables], 0)

  @tf.autograph.experimental.do_not_convert
  def assign_mean(self, summed, num_replicas: int):
    """Sets every copy to `summed` (the replicas' vectors summed) / replicas
    (call in a cross-replica context)."""
    mean = summed / num_replicas
    sizes = [v.shape.num_elements() for v in self.variables]
    for variable, part in zip(self.variables, tf.split(mean, sizes)):
      variable.assign(tf.reshape(part, variable.shape))
    for variance, stddev, epsilon in self.derived:
      variance.assign(tf.nn.relu(tf.square(stddev.read_value()) - epsilon))


def per_replica_statistics(model: keras.Model) -> Averaged:
  """The moving statistics of the BatchNormalization layers that normalise each
  replica's own batch and update them in training: the copies that would
  drift apart."""
  variables, derived = [], []
  for layer in batchnorm_layers(model):
    if not layer.trainable or is_synchronized(layer):
      continue
    variance = getattr(layer, "moving_variance", None) if layer.renorm else None
    for weight in layer.non_trainable_weights:
      if weight is not variance and weight.value.dtype.is_floating:
        variables.append(weight.value)
    if variance is not None:
      derived.append((variance.value, layer.moving_stddev.value, layer.epsilon))
  return Averaged(variables=tuple(variables), derived=tuple(derived))


def seed_generators(model: keras.Model) -> list:
  """Every SeedGenerator the layers of `model` hold, in layer order (their
  states are checkpointed: `checkpoint_files.rng_states`)."""
  return [generator for layer in internals.layers_of(model)
          for generator in internals.seed_generators(layer)]


def draw_per_replica(model: keras.Model) -> int:
  """Makes every SeedGenerator of `model` give each replica its own seeds inside
  a replica step (see the module docstring). Returns how many it changed."""
  generators = [g for g in seed_generators(model)
                if not getattr(g, _PER_REPLICA_MARK, False)]
  for generator in generators:
    generator.next = _per_replica_next(generator.next)
    setattr(generator, _PER_REPLICA_MARK, True)
  return len(generators)


def _per_replica_next(draw):
  """SeedGenerator.next, with the global replica id folded into the seed."""

  @tf.autograph.experimental.do_not_convert
  def next_seed(ordered=True):
    seed = draw(ordered)
    context = tf.distribute.get_replica_context()
    if context is None or tf.distribute.in_cross_replica_context():
      return seed  # Outside a replica step (building, evaluating): as Keras draws.
    replica = tf.cast(context.replica_id_in_sync_group, seed.dtype)
    mixed = tf.bitwise.bitwise_xor(seed[0], replica * _REPLICA_MIX)
    return tf.stack([mixed, seed[1]])

  return next_seed
