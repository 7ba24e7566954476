"""Array data with no iterator: each replica gathers its own batch in-graph.

A distributed iterator costs every step a host round of `get_next` across the
replicas' devices (a third of a small model's step on CPUs, see the README's
Performance section). Arrays need none of it: their order is a pure function of
(seed, step) (pipeline.example_indices). `GatherInput` copies the arrays once to
every replica's device (per-replica values, made on each worker), and inside
`strategy.run` replica r of micro-step s gathers positions
`[s*B + r*b, s*B + (r+1)*b)` of the (seed, epoch)-permuted stream, where B is the
global and b the per-replica batch: exactly the examples
`experimental_distribute_dataset` gives replica r, so the two paths train
bit-identically (tests/test_gather.py). The batch assertion and the ledger run on
the gathered batch as on an iterator's.
"""

import numpy as np
import tensorflow as tf

from trainer.data.pipeline import ArrayData, example_indices

MAX_BYTES = 2**30  # Larger arrays keep the tf.data path (one copy per device).


def fits(data, strategy) -> bool:
  """Whether `data` can be gathered in-graph: arrays of at most MAX_BYTES, and a
  strategy whose replica ids follow the distributed dataset's slices. (Under
  multi-worker with several replicas per worker the dataset gives worker w's
  local replica k slice k*W + w, not w*R + k: those keep the tf.data path.)"""
  workers = getattr(strategy.extended, "_num_workers", 1)
  if workers > 1 and strategy.num_replicas_in_sync > workers:
    return False
  return isinstance(data, ArrayData) and sum(
      np.asarray(a).nbytes for a in tf.nest.flatten((data.features, data.labels))
  ) <= MAX_BYTES


class GatherInput:
  """Array data on every replica's device, read by (seed, step, replica)."""

  def __init__(self, *, strategy, data: ArrayData, global_batch_size: int,
               per_replica_batch_size: int, seed: int, shuffle: bool, preprocess):
    """Copies the arrays to every replica's device.

    Args:
      strategy: the run's strategy (its scope mirrors the copies).
      data: the training arrays.
      global_batch_size: examples per micro-step over all replicas.
      per_replica_batch_size: examples per replica per micro-step.
      seed: the data-order seed.
      shuffle: whether each epoch is a permutation.
      preprocess: the task's map from a batch of stored features to model inputs.
    """
    self._global_batch_size = global_batch_size
    self._per_replica = per_replica_batch_size
    self._num_examples = data.num_examples
    self._seed, self._shuffle, self._preprocess = seed, shuffle, preprocess
    # One copy per replica device, made locally on every worker (each has the
    # same arrays): not variables, which multi-worker would broadcast (and
    # collectives have no uint8).
    arrays, devices = (data.features, data.labels), strategy.extended.worker_devices

    def on_replica_device(context):  # Not placed by the strategy itself.
      with tf.device(devices[context.replica_id_in_sync_group % len(devices)]):
        return tf.nest.map_structure(tf.constant, arrays)

    self.arrays = strategy.experimental_distribute_values_from_function(
        on_replica_device)

  def replica_batch(self, micro_step, arrays):
    """This replica's (features, labels) of global micro-step `micro_step`, from
    its copy `arrays` of the data (`self.arrays`, passed through strategy.run);
    call in a replica context."""
    replica = tf.cast(
        tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
    first = (tf.cast(micro_step, tf.int64) * self._global_batch_size
             + replica * self._per_replica)
    index = example_indices(tf.range(first, first + self._per_replica),
                            num_examples=self._num_examples,
                            global_batch_size=self._global_batch_size,
                            seed=self._seed, shuffle=self._shuffle)
    features, labels = tf.nest.map_structure(lambda a: tf.gather(a, index), arrays)
    return self._preprocess(features), labels
