"""In-graph gathering: data held in memory, copied to every replica's device, each
replica gathering its own batch inside `strategy.run`.

A distributed iterator costs every step a host round of `get_next` across the
replicas' devices (a third of a small model's step on CPUs); data held in memory
needs none of it. Replica r of micro-step s gathers the positions
`[s*B + r*b, s*B + (r+1)*b)` of the data's order, where b is the per-replica
batch: exactly the examples `experimental_distribute_dataset` (or, per worker,
`distribute_datasets_from_function`) gives replica r, so both paths train
bit-identically (tests/test_gather.py). The batch assertion and the ledger run on
the gathered batch as on an iterator's.

Three orders, three classes over one `GatherInput` (the copies and the gather):
- `ArrayOrderGather`: computed in-graph (arrays: a stateless permutation of
  (seed, epoch));
- `StreamedIdsGather`: the ids of a tf.data stream of indices, read on the host
  before each loop call (decoded TFRecords, a dataset held in memory: a seeded
  shuffle and an interleave order indices as they would the elements);
- `EvalGather`: an eval split in its own order, padded to whole global batches
  with weight-0 copies.
"""

import abc
from typing import Callable

import numpy as np
import tensorflow as tf

ID_CHUNK = 256  # Micro-steps of ids per host get_next (StreamedIdsGather).
_CHUNKS_AHEAD = 16
MAX_GATHER_BYTES = 2**30  # Larger data keeps the tf.data path (a copy per device).


class GatherInput(abc.ABC):
  """Data held in memory on every replica's device, each replica gathering its
  batch of a micro-step in `strategy.run` (`replica_batch`). The order is the
  subclass's: `ArrayOrderGather` (computed in-graph), `StreamedIdsGather` (ids
  from the host), `EvalGather` (an eval split's, padded)."""

  def __init__(self, *, strategy, data, per_replica_batch_size: int, preprocess):
    """Copies the arrays to every replica's device.

    Args:
      strategy: the run's strategy (its scope mirrors the copies).
      data: an ArrayData: the training examples, or an eval split's.
      per_replica_batch_size: examples per replica per micro-step.
      preprocess: the task's map from a batch of stored features to model inputs.
    """
    self._per_replica = per_replica_batch_size
    self._global_batch = per_replica_batch_size * strategy.num_replicas_in_sync
    self._num_examples = data.num_examples
    self._preprocess = preprocess
    # One copy per replica device, made locally on every worker (each has the
    # same arrays): not variables, which multi-worker would broadcast (and
    # collectives have no uint8).
    arrays, devices = data._arrays, strategy.extended.worker_devices  # noqa: SLF001

    def on_replica_device(context):  # Not placed by the strategy itself.
      with tf.device(devices[context.replica_id_in_sync_group % len(devices)]):
        return tf.nest.map_structure(tf.constant, arrays)

    self.arrays = strategy.experimental_distribute_values_from_function(
        on_replica_device)

  def iterator(self, start_step: int):
    """What the trainer holds as its iterator from `start_step`: here None (the
    order needs no host reader)."""
    del start_step
    return None

  def loop_input(self, reader, micro_steps: int):
    """What a loop call of `micro_steps` takes as its iterator: None."""
    del reader, micro_steps
    return None

  def step_input(self, iterator, micro_step):
    """What `replica_batch` reads micro-step `micro_step` by, in the loop's
    cross-replica context: here the micro-step itself."""
    del iterator  # None: the loop call needs none.
    return micro_step

  @abc.abstractmethod
  def replica_batch(self, step_input, arrays):
    """This replica's batch of one micro-step (its `step_input`), from its copy
    `arrays` of the data (`self.arrays`, passed through strategy.run); call in a
    replica context."""

  def _positions(self, step_input):
    """This replica's positions in the order: `[s*B + r*b, s*B + (r+1)*b)`."""
    replica = tf.cast(
        tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
    first = (tf.cast(step_input, tf.int64) * self._global_batch
             + replica * self._per_replica)
    return tf.range(first, first + self._per_replica)

  def _batch(self, arrays, index) -> tuple:
    """(preprocessed features, labels, weights) of the examples at `index`."""
    weights = None if len(arrays) == 2 else tf.cast(arrays[2], tf.float32)
    return examples_at(arrays[0], arrays[1], weights, index,
                       preprocess=self._preprocess)


class ArrayOrderGather(GatherInput):
  """Training arrays in an order computed in-graph from the micro-step: the
  arrays' stateless permutation of (seed, epoch)."""

  def __init__(self, *, index_of: Callable, **kwargs):
    """Copies the arrays to every replica's device.

    Args:
      index_of: `positions -> indices into data` of the training order.
      **kwargs: GatherInput's.
    """
    super().__init__(**kwargs)
    self._index_of = index_of

  def replica_batch(self, step_input, arrays):
    """This replica's (features, labels, weights) of micro-step `step_input`."""
    return self._batch(arrays, self._index_of(self._positions(step_input)))


class StreamedIdsGather(GatherInput):
  """Training data whose order is a tf.data stream of ids into it (decoded
  TFRecords, a dataset held in memory: a seeded shuffle and an interleave order
  ids as they would the elements), read on the host before each loop call."""

  def __init__(self, *, ids: Callable, local_replicas: int, **kwargs):
    """Copies the arrays to every replica's device.

    Args:
      ids: `start_step -> dataset` of each micro-step's ids into the data for
        this worker's replicas, `local_replicas` x per_replica_batch_size each.
      local_replicas: this worker's replicas.
      **kwargs: GatherInput's.
    """
    super().__init__(**kwargs)
    self._ids, self._local_replicas = ids, local_replicas
    # The ids of a loop call's micro-steps, set from the host before the call
    # (`loop_input`): the loop reads them in-graph with no get_next (which
    # costs about a fifth of a small model's step). This worker's own, not
    # checkpointed: a resume builds a new iterator from its step.
    per_step = local_replicas * self._per_replica
    self._call_ids = tf.Variable(tf.zeros([0, per_step], tf.int64),
                                 shape=[None, per_step], trainable=False,
                                 name="call_ids")
    self._cursor = tf.Variable(0, dtype=tf.int64, trainable=False,
                               name="call_ids_cursor")

  def iterator(self, start_step: int):
    """The host's reader of micro-step ids from `start_step`."""
    return _IdReader(self._ids(start_step))

  def loop_input(self, reader, micro_steps: int):
    """None, after setting the call's ids from `reader`."""
    self._call_ids.assign(reader.take(micro_steps))
    self._cursor.assign(0)
    return None

  def step_input(self, iterator, micro_step):
    """The ids of the call's next micro-step (its next row)."""
    del iterator, micro_step  # The ids were set before the call.
    row = self._cursor.assign_add(1) - 1
    ids = self._call_ids.read_value()
    # A call past the ids set for it would gather nothing on some devices.
    tf.debugging.assert_less(row, tf.shape(ids, out_type=tf.int64)[0],
                             message="a loop call read more steps than loop_input set")
    return tf.gather(ids, row)

  def replica_batch(self, step_input, arrays):
    """This replica's (features, labels, weights) of the micro-step's ids."""
    # distribute_datasets_from_function's order: a worker's local replica k
    # takes the k-th per-replica batch of its pipeline's step.
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    local = replica % self._local_replicas
    return self._batch(
        arrays, step_input[local * self._per_replica:(local + 1) * self._per_replica])


class EvalGather(GatherInput):
  """An eval split in its own order: global step s reads its positions
  [s*B, (s+1)*B), those past its end as weight-0 copies of its last example."""

  @property
  def eval_steps(self) -> int:
    """Global steps that read the split once (the last one padded)."""
    return -(-self._num_examples // self._global_batch)

  def replica_batch(self, step_input, arrays):
    """This replica's (features, labels, weights, padding) of global step
    `step_input`: padding is 1 for a real example, 0 for a copy."""
    index, padding = eval_positions(self._positions(step_input), self._num_examples)
    return (*self._batch(arrays, index), padding)


class _IdReader:
  """Micro-steps' ids from a tf.data stream, read on the host ID_CHUNK at a
  time (one eager get_next per chunk)."""

  def __init__(self, dataset: tf.data.Dataset):
    # Up to a long loop call ahead (16 x 256 micro-steps): tf.data makes them in
    # its own threads while the previous call trains, not when this one starts.
    self._chunks = iter(dataset.batch(ID_CHUNK).prefetch(_CHUNKS_AHEAD))
    self._pending = None

  def take(self, micro_steps: int) -> np.ndarray:
    """The next `micro_steps` rows of ids."""
    parts, have = [], 0
    while have < micro_steps:
      if self._pending is None or not len(self._pending):
        self._pending = next(self._chunks).numpy()
      part = self._pending[:micro_steps - have]
      self._pending = self._pending[len(part):]
      parts.append(part)
      have += len(part)
    return np.concatenate(parts)


def fits_in_memory(element_spec, count: int) -> bool:
  """Whether `count` elements of `element_spec` are numbers of known shapes that
  take at most MAX_GATHER_BYTES."""
  specs = tf.nest.flatten(element_spec)
  if any(s.dtype == tf.string or not s.shape.is_fully_defined() for s in specs):
    return False
  return count * sum(s.shape.num_elements() * s.dtype.size
                     for s in specs) <= MAX_GATHER_BYTES


@tf.autograph.experimental.do_not_convert
def examples_at(features, labels, weights, index, *, preprocess=None) -> tuple:
  """(features, labels, weights) of the examples at `index`: the features
  through `preprocess` (when given), the weights ones where there are none."""
  taken = tf.nest.map_structure(lambda a: tf.gather(a, index), (features, labels))
  weights = (tf.ones(tf.shape(index)[:1], tf.float32) if weights is None
             else tf.gather(weights, index))
  return (taken[0] if preprocess is None else preprocess(taken[0]), taken[1],
          weights)


@tf.autograph.experimental.do_not_convert
def eval_positions(positions, num_examples: int) -> tuple:
  """(index, padding) of an eval split's stream `positions`: past its end, copies
  of its last example with padding 0 (they count for nothing), else 1."""
  return (tf.minimum(positions, num_examples - 1),
          tf.cast(positions < num_examples, tf.float32))
