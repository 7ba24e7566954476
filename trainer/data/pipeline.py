"""A task's data as tf.data pipelines of global batches, distributed over replicas.

A task's data is arrays (`ArrayData`) or an unbatched tf.data.Dataset
(`StreamData`); `as_task_data` checks it and says what is wrong.

Arrays: the training order is a pure function of (seed, step): global step `s`
reads the positions `[s*B, (s+1)*B)` of an endless stream in which epoch `e` is a
stateless permutation of the training set (`index_shuffle` seeded by (seed, e)),
each epoch dropping its last partial batch. Resuming at step `s` starts the stream
at `s*B` and needs no iterator state.

Streams: the dataset is shuffled with a seeded buffer, repeated and batched, so
its order is a function of the seed (given a dataset that is itself
deterministic); resuming at step `s` skips the first `s` batches, which reads them
again (a cost proportional to `s`).

Evaluation pads the split to whole global batches with weight-0 examples, so every
example counts exactly once on any replica count.
"""

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from trainer.errors import DataError

_ENDLESS = 2**62  # Stream positions: more than any run will read.


@dataclasses.dataclass(frozen=True)
class ArrayData:
  """(features, labels) held in memory: nests of arrays with a common first dim."""
  features: object
  labels: object

  @property
  def num_examples(self) -> int:
    return len(tf.nest.flatten(self.features)[0])

  def first(self, count: int):
    """The first `count` examples as (features, labels) tensors."""
    return tf.nest.map_structure(lambda a: tf.constant(a[:count]),
                                 (self.features, self.labels))


@dataclasses.dataclass(frozen=True)
class StreamData:
  """An unbatched tf.data.Dataset of (features, labels) elements.

  Attributes:
    dataset: the dataset.
    num_examples: its length, when counted (eval splits are counted once).
  """
  dataset: tf.data.Dataset
  num_examples: Optional[int] = None

  def first(self, count: int):
    for batch in self.dataset.batch(count).take(1):
      return batch
    raise AssertionError("as_task_data checked that the stream is not empty")


def check_dataset(dataset: tf.data.Dataset, *, what: str, finite: bool, name: str,
                  kind: str):
  """Checks a task's dataset of (features, labels) elements.

  Args:
    dataset: the dataset.
    what: where it came from, for errors.
    finite: it must be finite (an eval split).
    name: what the errors call it ("the dataset").
    kind: what the error on its elements says must yield pairs.

  Raises:
    DataError: its elements are not pairs, it has none, or (finite) it is
      infinite.
  """
  spec = dataset.element_spec
  if not (isinstance(spec, tuple) and len(spec) == 2):
    raise DataError(f"{what}: {kind} must yield (features, labels) pairs, got "
                    f"elements {spec}")
  if is_batched(dataset):
    raise DataError(
        f"{what}: {name} yields batches (it calls batch(); elements {spec}), but "
        "the framework batches the data itself: return it unbatched, e.g. "
        "timeseries_dataset_from_array(..., batch_size=None) or dataset.unbatch()")
  if not any(True for _ in dataset.take(1)):
    raise DataError(f"{what}: {name} yields no elements")
  if finite and int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY:
    raise DataError(f"{what}: {name} is infinite; evaluation needs a finite split")


_BATCHING = ("BatchDataset", "PaddedBatchDataset", "ParallelBatchDataset",
             "DenseToRaggedBatchDataset", "BucketBySequenceLengthDataset")


def is_batched(dataset: tf.data.Dataset) -> bool:
  """Whether `dataset` batches its elements (a batch() not undone by unbatch()),
  from the chain of datasets it was built from."""
  pending = [dataset]
  while pending:
    current = pending.pop()
    kind = type(current).__name__.lstrip("_")
    if kind == "UnbatchDataset":
      continue
    if kind in _BATCHING:
      return True
    # tf.data keeps the datasets a dataset was built from as these attributes.
    pending += [d for d in [getattr(current, "_input_dataset", None),
                            getattr(current, "_dataset_to_concatenate", None),
                            *getattr(current, "_datasets", ())]
                if isinstance(d, tf.data.Dataset)]
  return False


def count_elements(dataset: tf.data.Dataset) -> int:
  """Reads a finite dataset to count its elements (in-graph, fast)."""
  return int(dataset.reduce(np.int64(0), lambda count, _: count + 1))


def as_task_data(value, *, what: str, finite: bool = False):
  """Checks a task's data: ArrayData, StreamData, TFRecords or PipelineData.

  Args:
    value: `(features, labels)` arrays (or nests of arrays), a tf.data.Dataset
      of `(features, labels)` elements, `TFRecords` files, or a function
      `input_context -> tf.data.Dataset` building one input pipeline's part.
    what: where it came from, for errors (e.g. "Task.train_data()").
    finite: it must be finite (an eval split); a stream is counted now, once.

  Raises:
    DataError: naming `what` and what is wrong.
  """
  # pylint: disable-next=g-import-not-at-top
  from trainer.data import inputs, records  # They build on this module.
  if isinstance(value, records.TFRecords):
    return records.resolve(value, what=what)
  if callable(value) and not isinstance(value, tf.data.Dataset):
    value = inputs.PipelineData(value)
  if isinstance(value, inputs.PipelineData):
    inputs.check_pipeline_data(value, what=what, finite=finite)
    return value
  if isinstance(value, tf.data.Dataset):
    check_dataset(value, what=what, finite=finite, name="the dataset",
                  kind="a tf.data.Dataset")
    if not finite:
      return StreamData(value)
    cardinality = int(value.cardinality())
    if cardinality < 0:  # Unknown: count it.
      cardinality = count_elements(value)
    return StreamData(value, num_examples=cardinality)
  if not (isinstance(value, (tuple, list)) and len(value) == 2):
    raise DataError(f"{what}: must return (features, labels) arrays or a "
                    f"tf.data.Dataset, got {type(value).__name__}")
  try:
    features, labels = tf.nest.map_structure(np.asarray, tuple(value))
  except (TypeError, ValueError) as e:
    raise DataError(f"{what}: features and labels must be arrays or dicts of "
                    f"arrays ({e})") from None
  leaves = tf.nest.flatten((features, labels))
  for leaf in leaves:
    if leaf.ndim == 0:
      raise DataError(f"{what}: every array needs a leading example dimension, got "
                      "a scalar")
    if not (np.issubdtype(leaf.dtype, np.number) or leaf.dtype == np.bool_):
      raise DataError(f"{what}: arrays must be numeric, got dtype {leaf.dtype}")
  sizes = sorted({len(leaf) for leaf in leaves})
  if len(sizes) > 1:
    raise DataError(f"{what}: features and labels have different numbers of "
                    f"examples ({', '.join(map(str, sizes))})")
  if sizes[0] == 0:
    raise DataError(f"{what}: no examples")
  return ArrayData(features, labels)


def feature_spec(data) -> object:
  """Specs of one batch of stored features (leading dimension None)."""
  if not isinstance(data, ArrayData):
    spec = (data.dataset.element_spec if isinstance(data, StreamData)
            else data.element_spec)[0]
    return tf.nest.map_structure(
        lambda s: tf.TensorSpec([None, *s.shape], s.dtype), spec)
  return tf.nest.map_structure(
      lambda a: tf.TensorSpec([None, *a.shape[1:]], tf.as_dtype(a.dtype)),
      data.features)


def dataset_options(shard_policy=tf.data.experimental.AutoShardPolicy.DATA
                    ) -> tf.data.Options:
  """Deterministic order, and the auto-shard policy given explicitly.

  DATA (global batches): each worker takes every n-th global batch element after
  rebatching, so no two workers read the same examples in a step; explicit rather
  than AUTO's guess. Per-pipeline input reads its own part already: OFF.
  """
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_distribute.auto_shard_policy = shard_policy
  return options


def _identity(features):
  return features


def train_dataset(data, *, global_batch_size: int, seed: int, shuffle: bool,
                  start_step: int, preprocess=_identity,
                  shuffle_buffer: int = 10000) -> tf.data.Dataset:
  """The endless training stream of global batches, starting at `start_step`.

  Args:
    data: ArrayData or StreamData.
    global_batch_size: examples per step over all replicas.
    seed: the data-order seed.
    shuffle: whether to shuffle (arrays: each epoch a permutation; streams: a
      seeded buffer).
    start_step: the global step of the first batch.
    preprocess: the task's map from a batch of stored features to model inputs.
    shuffle_buffer: the buffer of a stream's shuffle.

  Returns:
    A dataset of (features, labels) global batches with a static batch dimension.

  Raises:
    DataError: the training set is smaller than one global batch.
  """
  if isinstance(data, StreamData):
    dataset = data.dataset
    if shuffle:
      dataset = dataset.shuffle(shuffle_buffer, seed=seed,
                                reshuffle_each_iteration=True)
    dataset = dataset.repeat().batch(global_batch_size, drop_remainder=True)
    dataset = dataset.skip(start_step).map(
        lambda features, labels: (preprocess(features), labels),
        num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(dataset_options())
  n = data.num_examples
  if n < global_batch_size:
    raise DataError(f"the training set has {n} examples, fewer than one global batch "
                    f"of {global_batch_size}; lower --per_replica_batch_size")
  features, labels = tf.nest.map_structure(tf.constant, (data.features, data.labels))

  def gather(positions):
    index = example_indices(positions, num_examples=n,
                            global_batch_size=global_batch_size, seed=seed,
                            shuffle=shuffle)
    take = lambda a: tf.gather(a, index)  # noqa: E731
    return (preprocess(tf.nest.map_structure(take, features)),
            tf.nest.map_structure(take, labels))

  dataset = tf.data.Dataset.range(start_step * global_batch_size, _ENDLESS)
  dataset = dataset.batch(global_batch_size, drop_remainder=True)
  dataset = dataset.map(gather, num_parallel_calls=tf.data.AUTOTUNE)
  return dataset.prefetch(tf.data.AUTOTUNE).with_options(dataset_options())


@tf.autograph.experimental.do_not_convert
def example_indices(positions, *, num_examples: int, global_batch_size: int,
                    seed: int, shuffle: bool):
  """The training-set indices of the examples at stream `positions` (one global
  batch's, e.g. `range(s*B, (s+1)*B)` for global step s): the order of arrays.

  Args:
    positions: int64 tensor of consecutive positions within one global batch.
    num_examples: the training set's size.
    global_batch_size: examples per step over all replicas.
    seed: the data-order seed.
    shuffle: whether each epoch is a permutation.
  """
  positions = tf.convert_to_tensor(positions, tf.int64)
  steps_per_epoch = num_examples // global_batch_size
  step = positions // global_batch_size
  epoch = step // steps_per_epoch
  index = (step % steps_per_epoch) * global_batch_size + positions % global_batch_size
  if shuffle:
    # A batch never straddles epochs, so one seed serves the whole batch.
    seeds = tf.stack([tf.constant(seed, tf.int64), epoch[0]])
    index = tf.random.experimental.index_shuffle(index, seeds, num_examples - 1)
  return index


def count_examples(data) -> int:
  """The number of examples of arrays or of a counted stream."""
  if data.num_examples is None:
    raise ValueError("the stream was not counted: use as_task_data(..., finite=True)")
  return data.num_examples


def eval_dataset(data, *, global_batch_size: int, preprocess=_identity):
  """The eval split, padded with weight-0 examples to whole global batches.

  Args:
    data: ArrayData or StreamData.
    global_batch_size: examples per step over all replicas.
    preprocess: the task's map from a batch of stored features to model inputs.

  Returns:
    (dataset of (features, labels, weight) global batches, number of batches).
  """
  n = count_examples(data)
  num_batches = -(-n // global_batch_size)
  if isinstance(data, StreamData):
    real = data.dataset.map(lambda f, y: (f, y, tf.constant(1.0)))
    # n + B - 1 elements batched with drop_remainder make exactly ceil(n / B)
    # batches: the last real batch is completed by weight-0 copies.
    # cache(): the padding element is read once, not B - 1 times from the source.
    padding = data.dataset.take(1).cache().map(lambda f, y: (f, y, tf.constant(0.0)))
    dataset = real.concatenate(padding.repeat(global_batch_size - 1))
    dataset = dataset.batch(global_batch_size, drop_remainder=True).map(
        lambda f, y, w: (preprocess(f), y, w), num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(dataset_options()), num_batches
  features, labels = tf.nest.map_structure(tf.constant, (data.features, data.labels))

  def gather(positions):
    index = tf.minimum(positions, n - 1)  # Padding repeats the last example...
    weight = tf.cast(positions < n, tf.float32)  # ...with weight 0.
    take = lambda a: tf.gather(a, index)  # noqa: E731
    return (preprocess(tf.nest.map_structure(take, features)),
            tf.nest.map_structure(take, labels), weight)

  dataset = tf.data.Dataset.range(num_batches * global_batch_size)
  dataset = dataset.batch(global_batch_size, drop_remainder=True)
  dataset = dataset.map(gather, num_parallel_calls=tf.data.AUTOTUNE)
  return dataset.prefetch(tf.data.AUTOTUNE).with_options(dataset_options()), num_batches


def input_options() -> tf.distribute.InputOptions:
  """How distributed input reaches the replicas: prefetched to their devices."""
  return tf.distribute.InputOptions(experimental_fetch_to_device=True)


def distribute(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset):
  """Splits each global batch into one per-replica batch per replica."""
  return strategy.experimental_distribute_dataset(dataset, input_options())
