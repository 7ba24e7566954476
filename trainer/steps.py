"""The tf.function train and eval loops, and the per-replica ledger that audits them.

One step is one `next(iterator)` on the distributed iterator and one `strategy.run`:
every replica gets exactly one batch, asserted in-graph. Gradients come back from the
replicas unreduced; the outer function all-reduces them once (`batch_reduce_to`, SUM,
which equals single-device gradients because the loss is averaged over the global
batch), takes their global norm and applies them. K steps run per call, K a tensor,
so changing K never retraces.
"""

import re

import keras
import numpy as np
import tensorflow as tf

from trainer.errors import ReplicaBatchError

_BATCH_CHECK = "per-replica batch check failed"
_SUM = tf.distribute.ReduceOp.SUM


def _on_read_zeros(shape, name):
  """A variable each replica adds to locally, summed over replicas when read."""
  return tf.Variable(tf.zeros(shape), trainable=False, name=name,
                     synchronization=tf.VariableSynchronization.ON_READ,
                     aggregation=tf.VariableAggregation.SUM)


class ReplicaLedger:
  """Counts, per replica, the batches and examples it received.

  Create it inside `strategy.scope()`. Each replica adds a one-hot row at its own
  index; reading sums the replicas (all workers' under multi-worker), giving one
  count per replica in sync. The variables count one loop call (reset at its
  start, so float32 counts stay exact); the host checks each call's counts and
  keeps the run's totals as integers.
  """

  def __init__(self, *, num_replicas: int, name: str):
    self.num_replicas = num_replicas
    self.name = name
    self.batches = _on_read_zeros([num_replicas], f"{name}_ledger_batches")
    self.examples = _on_read_zeros([num_replicas], f"{name}_ledger_examples")
    self.total_batches = np.zeros(num_replicas, np.int64)
    self.total_examples = np.zeros(num_replicas, np.int64)

  def reset(self):
    """Zeroes this replica's counts (call through strategy.run)."""
    self.batches.assign(tf.zeros_like(self.batches))
    self.examples.assign(tf.zeros_like(self.examples))

  def record(self, batch_size):
    """Records one batch of `batch_size` examples for the calling replica."""
    replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
    row = tf.one_hot(replica_id, self.num_replicas)
    self.batches.assign_add(row)
    self.examples.assign_add(row * tf.cast(batch_size, tf.float32))

  def read(self):
    """Returns this loop call's (batches, examples) per replica, as float arrays."""
    return self.batches.numpy(), self.examples.numpy()

  def check(self, *, expected_batches: int, per_replica_batch_size: int,
            counts=None):
    """Raises ReplicaBatchError unless every replica got exactly the expected batches.

    Args:
      expected_batches: batches every replica must have received in the call.
      per_replica_batch_size: examples in each of those batches.
      counts: (batches, examples) arrays already read (e.g. returned by the train
        loop); read from the variables when None.

    Returns:
      The run's batch counts per replica so far, this call included.
    """
    batches, examples = self.read() if counts is None else counts
    expected_examples = expected_batches * per_replica_batch_size
    for replica, (got_batches, got_examples) in enumerate(zip(batches, examples)):
      if got_batches != expected_batches or got_examples != expected_examples:
        raise ReplicaBatchError(
            f"{self.name} ledger: replica {replica} received {got_batches:g} batches "
            f"and {got_examples:g} examples in a loop call, expected "
            f"{expected_batches} and {expected_examples}")
    self.total_batches += expected_batches
    self.total_examples += expected_examples
    return self.total_batches.copy()


class Totals:
  """Named ON_READ sums, reset at the start of each loop call."""

  def __init__(self, *names):
    self.variables = {n: _on_read_zeros([], f"total_{n}") for n in names}

  def reset(self):
    """Zeroes this replica's parts (call through strategy.run)."""
    for variable in self.variables.values():
      variable.assign(tf.zeros_like(variable))

  def add(self, **values):
    for name, value in values.items():
      self.variables[name].assign_add(tf.cast(value, tf.float32))

  def read(self) -> dict:
    return {n: float(v.numpy()) for n, v in self.variables.items()}

  def values(self) -> dict:
    """The sums as tensors (in a cross-replica tf.function: reduced in-graph)."""
    return {n: v.read_value() for n, v in self.variables.items()}


def _check_batch(x, per_replica_batch_size):
  """Asserts in-graph that this replica's batch has exactly the expected size."""
  batch_size = tf.shape(x)[0]
  replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
  tf.debugging.Assert(
      tf.equal(batch_size, per_replica_batch_size),
      [f"{_BATCH_CHECK}: expected {per_replica_batch_size} examples;", "replica",
       replica_id, "got", batch_size])
  return batch_size


def replica_batch_error(error: tf.errors.InvalidArgumentError):
  """Turns the in-graph batch assertion into a ReplicaBatchError, else None."""
  message = str(error)
  if _BATCH_CHECK not in message:
    return None
  match = re.search(r"replica\D*(\d+)\D+got\D*(\d+)", message)
  detail = (f"replica {match.group(1)} got {match.group(2)} examples"
            if match else "a replica got a batch of the wrong size")
  expected = re.search(r"expected (\d+) examples", message)
  return ReplicaBatchError(
      f"per-replica batch check failed: {detail}, expected "
      f"{expected.group(1) if expected else '?'} (a data set or global batch whose "
      "size is not per_replica_batch_size x replicas)")


def _loss_scale(optimizer):
  return getattr(optimizer, "dynamic_scale", None) if isinstance(
      optimizer, keras.optimizers.LossScaleOptimizer) else None


def make_train_loop(*, strategy, model, optimizer, global_step, ledger, totals,
                    per_replica_batch_size, global_batch_size, jit_compile=False):
  """Builds `train_loop(iterator, num_steps) -> dict of tensors`.

  The dict holds everything the host needs after a call, reduced in-graph, so one
  call costs one dispatch and no eager ops (which cost ~0.1 ms each, many per
  call): "loss" (sum of the steps' losses), "correct" and "examples" (sums over
  the call), "ledger_batches" and "ledger_examples" (per replica, this call),
  "gradient_norm" (of the last step), "all_finite" (every step's loss
  and gradients), "step" and "learning_rate" (after the call).

  Args:
    strategy: the tf.distribute strategy the variables live under.
    model: a Keras model returning logits.
    optimizer: a Keras optimizer built on `model.trainable_variables`.
    global_step: int64 variable, incremented once per step.
    ledger: a ReplicaLedger for training batches.
    totals: Totals("loss", "correct", "examples").
    per_replica_batch_size: examples each replica must receive per step.
    global_batch_size: examples per step over all replicas (the loss denominator).
    jit_compile: compile the replica's forward and backward pass with XLA.

  Returns:
    A tf.function.
  """
  variables = model.trainable_variables

  def forward_backward(x, y):
    with tf.GradientTape() as tape:
      logits = model(x, training=True)
      per_example = keras.losses.sparse_categorical_crossentropy(
          y, logits, from_logits=True)
      loss = tf.nn.compute_average_loss(per_example,
                                        global_batch_size=global_batch_size)
      if model.losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
      scaled_loss = optimizer.scale_loss(loss)
    gradients = tape.gradient(scaled_loss, variables)
    correct = tf.reduce_sum(tf.cast(
        tf.equal(tf.argmax(logits, -1, output_type=y.dtype), y), tf.float32))
    return gradients, loss, correct

  if jit_compile:
    forward_backward = tf.function(forward_backward, jit_compile=True)

  def replica_step(x, y):
    batch_size = _check_batch(x, per_replica_batch_size)
    ledger.record(batch_size)
    gradients, loss, correct = forward_backward(x, y)
    totals.add(loss=loss, correct=correct, examples=batch_size)
    return gradients

  def train_step(iterator):
    x, y = next(iterator)
    per_replica_gradients = strategy.run(replica_step, args=(x, y))
    gradients = strategy.extended.batch_reduce_to(
        _SUM, [(g, v.value) for g, v in zip(per_replica_gradients, variables)])
    norm = tf.linalg.global_norm(gradients)
    scale = _loss_scale(optimizer)
    if scale is not None:
      norm = norm / tf.cast(scale, norm.dtype)
    optimizer.apply(gradients, variables)
    global_step.assign_add(1)
    return norm

  @tf.function
  def train_loop(iterator, num_steps):
    strategy.run(totals.reset)
    strategy.run(ledger.reset)
    norm, all_finite = tf.constant(0.0), tf.constant(True)
    for _ in tf.range(num_steps):
      norm = train_step(iterator)
      all_finite = tf.logical_and(all_finite, tf.math.is_finite(norm))
    outputs = dict(totals.values(), gradient_norm=norm, step=global_step.read_value(),
                   learning_rate=tf.cast(optimizer.learning_rate, tf.float32),
                   ledger_batches=ledger.batches.read_value(),
                   ledger_examples=ledger.examples.read_value())
    # A NaN loss with finite gradients is possible (e.g. inf logits): check both.
    outputs["all_finite"] = tf.logical_and(all_finite,
                                           tf.math.is_finite(outputs["loss"]))
    return outputs

  return train_loop


def make_eval_loop(*, strategy, model, ledger, totals, per_replica_batch_size):
  """Builds `eval_loop(iterator, num_steps)` accumulating weighted sums in `totals`.

  Args:
    strategy: the tf.distribute strategy.
    model: a Keras model returning logits.
    ledger: a ReplicaLedger for eval batches.
    totals: Totals("loss", "correct", "examples"), sums weighted by example weight.
    per_replica_batch_size: examples each replica must receive per step.

  Returns:
    A tf.function.
  """

  def replica_step(x, y, weight):
    ledger.record(_check_batch(x, per_replica_batch_size))
    logits = model(x, training=False)
    per_example = keras.losses.sparse_categorical_crossentropy(
        y, logits, from_logits=True)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=y.dtype), y),
                      tf.float32)
    totals.add(loss=tf.reduce_sum(per_example * weight),
               correct=tf.reduce_sum(correct * weight),
               examples=tf.reduce_sum(weight))

  @tf.function
  def eval_loop(iterator, num_steps):
    strategy.run(totals.reset)
    strategy.run(ledger.reset)
    for _ in tf.range(num_steps):
      strategy.run(replica_step, args=next(iterator))

  return eval_loop


def make_stop_vote(strategy):
  """Builds `stop_vote(stopping) -> whether any worker is stopping`.

  Workers of a multi-worker run receive signals at different moments; voting after
  every loop call makes them all stop after the same step (a collective that one
  worker skipped would hang the others). Outside multi-worker it is the identity.
  """
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return lambda stopping: stopping

  @tf.function
  def stop_vote(stopping):
    votes = strategy.run(lambda s: tf.cast(s, tf.float32), args=(stopping,))
    return strategy.reduce(_SUM, votes, axis=None) > 0

  return lambda stopping: bool(stop_vote(tf.constant(stopping)))
