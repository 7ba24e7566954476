"""Streamed data: a task's tf.data.Dataset (`StreamData`), and the stream and
eval-padding helpers it shares with per-pipeline data (pipelines.py: pipeline
functions and TFRecord files).

A stream is repeated, shuffled with a seeded buffer and batched, so its order is
a function of the seed (given a dataset that is itself deterministic); a resume
at step `s` skips the examples of the first `s` batches, which reads them again
(a cost proportional to `s`).

A single dataset is batched to global batches that
`experimental_distribute_dataset` splits over the replicas, or, where it can be,
held in memory and gathered in-graph in the same order.

Evaluation reads every example once and pads with weight-0 copies of a real
example to whole batches.
"""

import dataclasses
from typing import Optional

import tensorflow as tf

from trainer.data import arrays, base, elastic, gather
from trainer.data.dataset_graph import ELEMENTS, read_variation
from trainer.data.examples import as_examples
from trainer.errors import DataError

OFF = tf.data.experimental.AutoShardPolicy.OFF


# The most a stream's shuffle buffer holds: --shuffle_buffer's default of 10,000
# decoded 180x180 images would be 3.9 GB.
MAX_SHUFFLE_BYTES = 256 * 2**20


def shuffle_buffer(element_spec, buffer: int) -> int:
  """`buffer` elements of `element_spec`, or fewer where they would take more
  than MAX_SHUFFLE_BYTES (elements of unknown size: `buffer`)."""
  specs = tf.nest.flatten(element_spec)
  if any(s.dtype == tf.string or not s.shape.is_fully_defined() for s in specs):
    return buffer
  size = max(1, sum(s.shape.num_elements() * s.dtype.size for s in specs))
  return max(1, min(buffer, MAX_SHUFFLE_BYTES // size))


def shuffled_stream(dataset: tf.data.Dataset, order: base.Order, *,
                    shuffle_seed: int, position: int, element_spec=None,
                    shares: int = 1) -> tf.data.Dataset:
  """The endless stream of a dataset's examples, from example `position` on:
  repeated, then shuffled with a seeded buffer of --shuffle_buffer elements (at
  most MAX_SHUFFLE_BYTES of `element_spec`'s: default, the dataset's own; ids
  that stand for held elements pass theirs, so both orders agree), or its part
  for one of `shares` input shards. The buffer fills once, at the start: a
  shuffle before the repeat refills it at every epoch, and training waits while
  it reads that many elements (decoding images, say) before the epoch's first."""
  if element_spec is None:
    element_spec = dataset.element_spec
  dataset = dataset.repeat()
  if order.shuffle:
    dataset = dataset.shuffle(
        elastic.share(shuffle_buffer(element_spec, order.buffer), shares),
        seed=shuffle_seed)
  return dataset.skip(position)


def stream_batches(dataset: tf.data.Dataset, order: base.Order, *, shuffle_seed: int,
                   batch_size: int, position: int,
                   element_spec=None) -> tf.data.Dataset:
  """The endless batches of `shuffled_stream(dataset, ...)`."""
  return shuffled_stream(dataset, order, shuffle_seed=shuffle_seed,
                         position=position, element_spec=element_spec).batch(
                             batch_size, drop_remainder=True)


def padded(dataset: tf.data.Dataset, *, padding: int) -> tf.data.Dataset:
  """(features, labels, weights, padding) elements: `dataset`'s with padding 1,
  then `padding` copies of its first element with padding 0 (zeros if it has
  none): they count for nothing."""
  dataset = dataset.map(lambda *e: base.weighted(*e, batched=False))
  spec = dataset.element_spec
  source = dataset.take(1)
  if all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec)):
    source = source.concatenate(tf.data.Dataset.from_tensors(
        tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), spec))).take(1)
  real = dataset.map(lambda f, y, w: (f, y, w, tf.constant(1.0)))
  # cache(): the padding element is read once, not `padding` times.
  pad = source.cache().map(lambda f, y, w: (f, y, w, tf.constant(0.0)))
  return real.concatenate(pad.repeat(padding))


def preprocessed(preprocess):
  """The map from a batch, with or without weights, to (model inputs, labels,
  weights)."""

  def batch_map(*batch):
    features, labels, weights = base.weighted(*batch, batched=True)
    return preprocess(features), labels, weights

  return batch_map


def max_over_workers(strategy, cluster, value: int) -> int:
  """The largest of every worker's `value` (a collective under multi-worker)."""
  if cluster.num_pipelines == 1:
    return value
  # Each worker's value at its pipeline's index, from each of its replicas,
  # summed: collectives sum.
  mine = tf.one_hot(cluster.pipeline_id, cluster.num_pipelines) * float(value)
  total = tf.function(lambda: strategy.reduce(
      tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(mine)),
      axis=None))()
  return int(round(float(tf.reduce_max(total)) / cluster.local_replicas))


@dataclasses.dataclass(frozen=True)
class StreamData(base.TaskData):
  """An unbatched tf.data.Dataset of (features, labels) elements.

  Attributes:
    dataset: the dataset.
    num_examples: its length, when counted (eval splits are counted once).
    what: where it came from, for errors.
  """
  dataset: tf.data.Dataset
  num_examples: Optional[int] = None
  what: str = "the dataset"
  note: Optional[str] = None

  @property
  def element_spec(self):
    return self.dataset.element_spec

  def first(self, count: int):
    return next(iter(self.dataset.batch(count).take(1)))

  def count(self, cluster) -> int:
    del cluster
    return self.num_examples

  def _batches(self, order: base.Order, *, start_step: int) -> tf.data.Dataset:
    return stream_batches(self.dataset, order, shuffle_seed=order.seed,
                          batch_size=order.global_batch_size,
                          position=start_step * order.global_batch_size)

  def train_input(self, strategy, cluster, order, *, start_step, preprocess):
    del cluster
    dataset = self._batches(order, start_step=start_step).map(
        preprocessed(preprocess), num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.prefetch(tf.data.AUTOTUNE).with_options(base.dataset_options())
    return base.distribute(strategy, dataset)

  def eval_input(self, strategy, cluster, *, global_batch_size, preprocess):
    del cluster
    n = self.num_examples
    num_batches = -(-n // global_batch_size)
    dataset = padded(self.dataset, padding=num_batches * global_batch_size - n)
    dataset = dataset.batch(global_batch_size, drop_remainder=True).map(
        lambda f, y, w, p: (preprocess(f), y, w, p),
        num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.prefetch(tf.data.AUTOTUNE).with_options(base.dataset_options())
    return base.distribute(strategy, dataset), num_batches

  def host_batches(self, order, *, num_replicas, start_step, count):
    del num_replicas  # Global batches split in replica order, as distributed.
    return list(self._batches(order, start_step=start_step).take(count))

  def gather_input(self, strategy, cluster, order, *, per_replica_batch_size,
                   preprocess):
    """The dataset read once into memory and gathered in-graph, in the order its
    stream would give (`order`: the seeded shuffle of its indices; None: an eval
    split, in order); or None unless one pipeline reads it, its length is known,
    its elements fit (gather.fits_in_memory) and reading it again gives the same
    elements (`read_variation`). A dataset that only reorders its elements (a
    shuffle in its chain, as image_dataset_from_directory's) is held too: its
    elements are decoded once, and the order is the framework's seeded one, not
    its own shuffle's."""
    count = self.num_examples if order is None else int(self.dataset.cardinality())
    if (cluster.num_pipelines > 1 or count < 0 or
        not gather.fits_in_memory(self.element_spec, count) or
        read_variation(self.dataset) == ELEMENTS):
      return None
    held = arrays.read_into_memory(self.dataset, what=self.what)
    if order is None:
      return gather.EvalGather(strategy=strategy, data=held,
                               per_replica_batch_size=per_replica_batch_size,
                               preprocess=preprocess)

    def ids(start_step):
      # A seeded shuffle orders indices as it would the elements.
      return stream_batches(
          tf.data.Dataset.range(count), order, shuffle_seed=order.seed,
          batch_size=order.global_batch_size,
          position=start_step * order.global_batch_size,
          element_spec=self.element_spec).prefetch(tf.data.AUTOTUNE)

    return gather.StreamedIdsGather(strategy=strategy, data=held,
                                    per_replica_batch_size=per_replica_batch_size,
                                    preprocess=preprocess, ids=ids,
                                    local_replicas=strategy.num_replicas_in_sync)


def check_dataset(dataset: tf.data.Dataset, *, what: str, finite: bool,
                  name: str = "the dataset", kind: str = "a tf.data.Dataset"):
  """Checks a task's dataset of (features, labels) elements (unbatched: see
  `as_examples`).

  Raises:
    DataError: its elements are not pairs, it has none, or (`finite`: an eval
      split) it is infinite.
  """
  spec = dataset.element_spec
  if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
    raise DataError(f"{what}: {kind} must yield (features, labels) pairs or "
                    f"(features, labels, weights), got elements {spec}")
  if len(spec) == 3 and not (isinstance(spec[2], tf.TensorSpec) and
                             spec[2].shape.rank == 0 and
                             (spec[2].dtype.is_floating or spec[2].dtype.is_integer
                              or spec[2].dtype == tf.bool)):
    raise DataError(f"{what}: an element's weight must be one number, got {spec[2]}")
  if not any(True for _ in dataset.take(1)):
    raise DataError(f"{what}: {name} yields no elements")
  if finite and int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY:
    raise DataError(f"{what}: {name} is infinite; evaluation needs a finite split")


def one_shape(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` with every element held to its first element's shapes where its
  spec leaves them unknown: the framework batches the elements, so they must
  have one shape, and one that changes mid-run (a whole batch of the new one
  reaching the model) fails in the input naming the shapes (base.changing_shapes),
  not in the model."""
  spec = dataset.element_spec
  if all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec)
         if isinstance(s, tf.TensorSpec)):
    return dataset
  first = next(iter(dataset.take(1)))
  shapes = tf.nest.map_structure(lambda t: t.shape, first)

  @tf.autograph.experimental.do_not_convert
  def held(*element):
    return tf.nest.map_structure(
        lambda t, shape: tf.ensure_shape(t, shape) if isinstance(
            t, tf.Tensor) else t, element, tuple(shapes))

  return dataset.map(held)


def check_stream(value: tf.data.Dataset, *, what: str, finite: bool) -> StreamData:
  """A task's tf.data.Dataset as StreamData (an eval split counted now, once)."""
  value, note = as_examples(value, what=what)
  check_dataset(value, what=what, finite=finite)
  value = one_shape(value)
  if not finite:
    return StreamData(value, what=what, note=note)
  cardinality = int(value.cardinality())
  if cardinality < 0:  # Unknown: count it.
    cardinality = base.count_elements(value)
  return StreamData(value, num_examples=cardinality, what=what, note=note)
