"""Layers whose state or randomness is per replica, made to match one device.

Two kinds of layer break "N replicas equal one device" as Keras builds them:

- BatchNormalization normalises with its batch's statistics. Keras computes them
  on the replica's own batch, and updates moving statistics whose variables
  (aggregation "none") each replica keeps on its own, so the copies drift apart.
  `synchronize_batchnorm` makes every BatchNormalization of a model use the
  global batch's statistics (Keras's own `synchronized=True`: an all-reduce of
  the sums inside the forward pass, the one cross-replica op inside a replica
  step, since the forward pass needs it mid-step). Then every replica computes
  the same moving statistics. Without it (--sync_batchnorm=false, as Keras `fit`
  does it), `average_statistics` averages the copies after every loop call, so an
  evaluation, a checkpoint and an export all see one value: the moving
  statistics are a linear recursion, so their average equals the moving average
  of the replicas' averaged batch statistics.
- Random layers (Dropout, GaussianNoise, the Random* augmentations, a user's
  `keras.random` call with a SeedGenerator) draw a seed from a SeedGenerator
  whose state is mirrored, so every replica draws the same mask.
  `draw_per_replica` folds the global replica id into every seed drawn inside a
  replica step: each replica draws its own noise, replica 0 draws what one
  device draws, and the state (checkpointed, the same on every replica) stays a
  count of draws: the randomness is a function of (seed, step, global replica),
  so a resume redraws the same.
"""

import functools

import keras
import tensorflow as tf

_MEAN = tf.distribute.ReduceOp.MEAN
# An odd 31-bit constant (from the golden ratio): replica r's seeds differ from
# replica 0's in many bits.
_REPLICA_MIX = 0x4F1BBCDD


def batchnorm_layers(model: keras.Model) -> list:
  """Every BatchNormalization in `model`, however it is nested: Sequential,
  functional, subclassed, inner models, a user's own layer holding one."""
  return [layer for layer in model._flatten_layers(include_self=True)  # Keras has
          if isinstance(layer, keras.layers.BatchNormalization)]  # no public list.


def synchronize_batchnorm(model: keras.Model) -> list:
  """Makes every BatchNormalization of `model` normalise with the global batch's
  statistics while training. Returns the layers that were not synchronized (to
  give back their user's setting with `as_built`)."""
  changed = [layer for layer in batchnorm_layers(model) if not layer.synchronized]
  for layer in batchnorm_layers(model):
    layer.synchronized = True
    # Not tracked by Keras: a method of this instance only.
    object.__setattr__(layer, "_moments", functools.partial(
        _global_moments, layer, type(layer)._moments.__get__(layer)))
  return changed


@tf.autograph.experimental.do_not_convert
def _global_moments(layer, keras_moments, inputs, mask):
  """The mean and variance of the global batch, as Keras's synchronized moments
  computes them, with one all-reduce (Keras makes three: the sums, the sums of
  squares and the counts). Every replica's batch has the same size (the batch
  assertion), so the count is this replica's times the replicas. With a mask,
  Keras's own moments (computed on this replica)."""
  context = tf.distribute.get_replica_context()
  if mask is not None or context is None or tf.distribute.in_cross_replica_context():
    return keras_moments(inputs, mask)
  axes = layer._reduction_axes
  local = tf.concat([tf.reduce_sum(inputs, axis=axes),
                     tf.reduce_sum(tf.square(inputs), axis=axes)], 0)
  total = context.all_reduce(tf.distribute.ReduceOp.SUM, local)
  count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), axes)), inputs.dtype)
  count *= context.num_replicas_in_sync
  mean, squares = tf.split(total / count, 2)
  return mean, tf.maximum(squares - tf.square(mean), 0.0)


class as_built:  # noqa: N801 (a context manager, named for what it gives)
  """Within it, the layers `synchronize_batchnorm` changed are as the task built
  them: the model.keras file records the user's own configuration."""

  def __init__(self, changed: list):
    self._changed = changed

  def __enter__(self):
    for layer in self._changed:
      layer.synchronized = False
    return self

  def __exit__(self, *exc):
    for layer in self._changed:
      layer.synchronized = True
    return False


def unsynchronized_statistics(model: keras.Model) -> list:
  """The moving statistics (TensorFlow variables) of the BatchNormalization
  layers that normalise per replica and update them in training: the copies that
  drift apart."""
  return [weight.value for layer in batchnorm_layers(model)
          if layer.trainable and not layer.synchronized
          for weight in layer.non_trainable_weights]


@tf.autograph.experimental.do_not_convert
def average_statistics(strategy, variables: list):
  """Sets every replica's copy of each variable to the mean over all replicas
  (of every worker: one all-reduce). Call in a cross-replica context, inside a
  tf.function."""
  if not variables:
    return
  local = strategy.run(lambda: tf.concat(
      [tf.reshape(v.read_value(), [-1]) for v in variables], 0))
  mean = strategy.reduce(_MEAN, local, axis=None)
  sizes = [v.shape.num_elements() for v in variables]
  for variable, part in zip(variables, tf.split(mean, sizes)):
    variable.assign(tf.reshape(part, variable.shape))


def seed_generators(model: keras.Model) -> list:
  """Every SeedGenerator the layers of `model` hold (their checkpointed states
  are `checkpoint_files.rng_states`)."""
  return [generator for layer in model._flatten_layers(include_self=True)
          for generator in getattr(layer, "_seed_generators", [])]


def draw_per_replica(model: keras.Model) -> int:
  """Makes every SeedGenerator of `model` give each replica its own seeds inside
  a replica step (see the module docstring). Returns how many it changed."""
  generators = [g for g in seed_generators(model)
                if not getattr(g, "_trainer_per_replica", False)]
  for generator in generators:
    generator.next = _per_replica_next(generator.next)
    generator._trainer_per_replica = True
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
