"""In-memory arrays as a task's data: an order that is a pure function of (seed, step).

Global step `s` reads the positions `[s*B, (s+1)*B)` of an endless stream in
which epoch `e` is a stateless permutation of the training set (`index_shuffle`
seeded by (seed, e)), each epoch dropping its last partial batch. Resuming at step
`s` starts the stream at `s*B` and needs no iterator state.

The replicas either read their batches from a tf.data pipeline split by
`experimental_distribute_dataset`, or gather them in-graph (gather.py, the default
up to 1 GiB), exactly the same examples. Evaluation pads the split to whole global
batches with weight-0 copies of its last example, so every example counts exactly
once on any replica count.
"""
import dataclasses
import functools

import numpy as np
import tensorflow as tf

from trainer.data import base, gather
from trainer.errors import DataError

_ENDLESS = 2**62  # Stream positions: more than any run will read.


@dataclasses.dataclass(frozen=True)
class ArrayData(base.TaskData):
  """(features, labels[, weights]) held in memory: nests of arrays with a common
  first dimension (weights: one float per example)."""
  features: object
  labels: object
  weights: object = None
  what: str = "the arrays"

  @property
  def num_examples(self) -> int:
    return len(tf.nest.flatten(self.features)[0])

  @property
  def _arrays(self) -> tuple:
    """(features, labels) or (features, labels, weights), as the task gave them."""
    return (self.features, self.labels) + (
        () if self.weights is None else (self.weights,))

  @property
  def element_spec(self):
    return tf.nest.map_structure(
        lambda a: tf.TensorSpec(a.shape[1:], tf.as_dtype(a.dtype)), self._arrays)

  def first(self, count: int):
    return tf.nest.map_structure(lambda a: tf.constant(a[:count]), self._arrays)

  def identity(self) -> dict:
    return {"examples": self.num_examples}

  def count(self, cluster) -> int:
    del cluster
    return self.num_examples

  def check_training(self, cluster, global_batch_size: int):
    if self.num_examples < global_batch_size:
      raise DataError(
          f"the training set has {self.num_examples} examples, fewer than one "
          f"global batch of {global_batch_size} "
          f"({global_batch_size // cluster.num_replicas} per replica x "
          f"{cluster.num_replicas} replicas); lower --per_replica_batch_size or "
          "--global_batch_size")

  def _tensors(self) -> tuple:
    """(features, labels, weights or None) as tensors."""
    return (*tf.nest.map_structure(tf.constant, (self.features, self.labels)),
            None if self.weights is None else tf.constant(self.weights, tf.float32))

  def train_dataset(self, order: base.Order, *, start_step: int,
                    preprocess=None) -> tf.data.Dataset:
    """The endless stream of global batches of (features, labels, weights) from
    `start_step` on, each gathered by the indices of its positions."""
    n, batch = self.num_examples, order.global_batch_size
    features, labels, weights = self._tensors()

    def take(positions):
      index = example_indices(positions, num_examples=n, order=order)
      return gather.examples_at(features, labels, weights, index,
                                preprocess=preprocess)

    dataset = tf.data.Dataset.range(start_step * batch, _ENDLESS)
    dataset = dataset.batch(batch, drop_remainder=True)
    dataset = dataset.map(take, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(base.dataset_options())

  def train_input(self, strategy, cluster, order, *, start_step, preprocess):
    del cluster
    return base.distribute(strategy, self.train_dataset(
        order, start_step=start_step, preprocess=preprocess))

  def eval_input(self, strategy, cluster, *, global_batch_size, preprocess):
    del cluster
    n = self.num_examples
    num_batches = -(-n // global_batch_size)
    features, labels, weights = self._tensors()

    def take(positions):
      index, padding = gather.eval_positions(positions, n)
      return (*gather.examples_at(features, labels, weights, index,
                                  preprocess=preprocess), padding)

    dataset = tf.data.Dataset.range(num_batches * global_batch_size)
    dataset = dataset.batch(global_batch_size, drop_remainder=True)
    dataset = dataset.map(take, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.prefetch(tf.data.AUTOTUNE).with_options(base.dataset_options())
    return base.distribute(strategy, dataset), num_batches

  def host_batches(self, order, *, num_replicas, start_step, count):
    del num_replicas  # Global batches split in replica order, as distributed.
    return list(self.train_dataset(order, start_step=start_step).take(count))

  def step_examples(self, order, *, first_step, steps):
    batch = order.global_batch_size
    positions = tf.range(first_step * batch, (first_step + steps) * batch,
                         dtype=tf.int64)
    indices = [example_indices(positions[i * batch:(i + 1) * batch],
                               num_examples=self.num_examples, order=order).numpy()
               for i in range(steps)]
    return {"indices": np.concatenate(indices).tolist()}

  def gather_input(self, strategy, cluster, order, *, per_replica_batch_size,
                   preprocess):
    # order=None: an eval split (gather.EvalGather).
    # Under multi-worker with several replicas per worker the distributed dataset
    # gives worker w's local replica k slice k*W + w, not w*R + k: the gathered
    # order would differ, so those keep the tf.data path.
    if cluster.num_workers > 1 and cluster.num_replicas > cluster.num_workers:
      return None
    if any(_is_text(a) for a in tf.nest.flatten(self._arrays)):
      return None  # Strings stay with tf.data on the host (no copy per device).
    size = sum(np.asarray(a).nbytes for a in tf.nest.flatten(self._arrays))
    if size > gather.MAX_GATHER_BYTES:
      return None
    held = dict(strategy=strategy, data=self, preprocess=preprocess,
                per_replica_batch_size=per_replica_batch_size)
    if order is None:
      return gather.EvalGather(**held)
    return gather.ArrayOrderGather(index_of=functools.partial(
        example_indices, num_examples=self.num_examples, order=order), **held)


@tf.autograph.experimental.do_not_convert
def example_indices(positions, *, num_examples: int, order: base.Order):
  """The training-set indices of the examples at stream `positions` (within one
  global batch, e.g. `range(s*B, (s+1)*B)` for global step s): the arrays' order.

  Args:
    positions: int64 tensor of consecutive positions within one global batch.
    num_examples: the training set's size.
    order: the seed, whether to shuffle, and the global batch.
  """
  global_batch_size = order.global_batch_size
  positions = tf.convert_to_tensor(positions, tf.int64)
  steps_per_epoch = num_examples // global_batch_size
  step = positions // global_batch_size
  epoch = step // steps_per_epoch
  index = (step % steps_per_epoch) * global_batch_size + positions % global_batch_size
  if order.shuffle:
    # A batch never straddles epochs, so one seed serves the whole batch.
    seeds = tf.stack([tf.constant(order.seed, tf.int64), epoch[0]])
    index = tf.random.experimental.index_shuffle(index, seeds, num_examples - 1)
  return index


def read_into_memory(dataset: tf.data.Dataset, *, what: str) -> ArrayData:
  """A finite dataset of (features, labels[, weight]) elements as arrays, in its
  order (read in batches).

  Raises:
    DataError: its elements change shape (base.changing_shapes).
  """
  try:
    parts = [tf.nest.map_structure(lambda t: t.numpy(), batch)
             for batch in dataset.batch(4096)]
  except tf.errors.InvalidArgumentError as e:
    error = base.changing_shapes(e, what=what, split="reading it into memory",
                                 step=None)
    if error is None:
      raise
    raise error from None
  return ArrayData(*tf.nest.map_structure(lambda *a: np.concatenate(a), *parts),
                   what=what)


def check_arrays(value, *, what: str) -> ArrayData:
  """`(features, labels[, weights])` arrays (or nests of arrays) as ArrayData.

  Raises:
    DataError: not two or three arrays, a scalar, non-numeric values, unequal
      example counts, weights that are not one number per example, or no
      examples.
  """
  if not (isinstance(value, (tuple, list)) and len(value) in (2, 3)):
    raise DataError(f"{what}: must return (features, labels) arrays, (features, "
                    f"labels, weights), or a tf.data.Dataset, got "
                    f"{type(value).__name__}")
  try:
    arrays = tf.nest.map_structure(np.asarray, tuple(value))
  except (TypeError, ValueError) as e:
    raise DataError(f"{what}: features and labels must be arrays or dicts of "
                    f"arrays ({e})") from None
  leaves = tf.nest.flatten(arrays)
  for leaf in leaves:
    if leaf.ndim == 0:
      raise DataError(f"{what}: every array needs a leading example dimension, got "
                      "a scalar")
    if not (np.issubdtype(leaf.dtype, np.number) or leaf.dtype == np.bool_ or
            _is_text(leaf)):
      raise DataError(f"{what}: arrays must be numbers or strings, got dtype "
                      f"{leaf.dtype}")
  sizes = sorted({len(leaf) for leaf in leaves})
  if len(sizes) > 1:
    raise DataError(f"{what}: features, labels and weights have different numbers "
                    f"of examples ({', '.join(map(str, sizes))})")
  if sizes[0] == 0:
    raise DataError(f"{what}: no examples")
  if len(arrays) == 3 and not (isinstance(arrays[2], np.ndarray) and
                               arrays[2].ndim == 1):
    raise DataError(f"{what}: weights must be one number per example, shape "
                    f"({sizes[0]},)")
  if len(arrays) == 3 and not (np.issubdtype(arrays[2].dtype, np.number) or
                               arrays[2].dtype == np.bool_):
    raise DataError(f"{what}: weights must be numbers, got dtype "
                    f"{arrays[2].dtype} (e.g. {arrays[2][0]!r})")
  return ArrayData(*arrays, what=what)


def _is_text(array: np.ndarray) -> bool:
  """Whether an array holds strings (str or bytes; an object array of them)."""
  if array.dtype.kind in ("U", "S"):
    return True
  return array.dtype == object and all(isinstance(v, (str, bytes))
                                       for v in array.ravel())
