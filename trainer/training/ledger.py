"""Per-replica counters summed in-graph: the replica ledger and the loop totals."""

import numpy as np
import tensorflow as tf

from trainer.errors import ReplicaBatchError


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

  @tf.autograph.experimental.do_not_convert
  def reset(self):
    """Zeroes this replica's counts (call through strategy.run)."""
    self.batches.assign(tf.zeros_like(self.batches))
    self.examples.assign(tf.zeros_like(self.examples))

  @tf.autograph.experimental.do_not_convert
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

  def totals(self) -> tuple:
    """(batches, examples) per replica over the run, as lists for the record."""
    return self.total_batches.tolist(), self.total_examples.tolist()

  def set_totals(self, batches=None, examples=None):
    """Sets the run's totals (zeros where None), e.g. from a checkpoint."""
    zeros = np.zeros(self.num_replicas, np.int64)
    self.total_batches = zeros if batches is None else np.array(batches, np.int64)
    self.total_examples = (zeros.copy() if examples is None else
                           np.array(examples, np.int64))


class Totals:
  """Named ON_READ sums, reset at the start of each loop call."""

  def __init__(self, *names):
    self.variables = {n: _on_read_zeros([], f"total_{n}") for n in names}

  @tf.autograph.experimental.do_not_convert
  def reset(self):
    """Zeroes this replica's parts (call through strategy.run)."""
    for variable in self.variables.values():
      variable.assign(tf.zeros_like(variable))

  @tf.autograph.experimental.do_not_convert
  def add(self, values: dict):
    for name, value in values.items():
      self.variables[name].assign_add(tf.cast(value, tf.float32))

  def read(self) -> dict:
    return {n: float(v.numpy()) for n, v in self.variables.items()}

  @tf.autograph.experimental.do_not_convert
  def values(self) -> dict:
    """The sums as tensors (in a cross-replica tf.function: reduced in-graph)."""
    return {n: v.read_value() for n, v in self.variables.items()}
