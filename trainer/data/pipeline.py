"""tf.data pipelines of global batches, and their distribution over replicas.

The training order is a pure function of (seed, step): global step `s` reads the
positions `[s*B, (s+1)*B)` of an endless stream in which epoch `e` is a stateless
permutation of the training set (`index_shuffle` seeded by (seed, e)), each epoch
dropping its last partial batch. Resuming at step `s` therefore starts the stream at
`s*B` and needs no iterator state.
"""

import tensorflow as tf

from trainer.data.sources import Source
from trainer.errors import DataError

_ENDLESS = 2**62  # Stream positions: more than any run will read.


def _options() -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = True
  # Each worker takes every n-th global batch element after rebatching, so no two
  # workers read the same examples in a step; explicit rather than AUTO's guess.
  options.experimental_distribute.auto_shard_policy = (
      tf.data.experimental.AutoShardPolicy.DATA)
  return options


def _to_inputs(x, scale):
  x = tf.cast(x, tf.float32)
  return x * scale if scale != 1.0 else x


def train_dataset(source: Source, *, global_batch_size: int, seed: int,
                  shuffle: bool, start_step: int) -> tf.data.Dataset:
  """The endless training stream of global batches, starting at `start_step`.

  Args:
    source: the data set.
    global_batch_size: examples per step over all replicas.
    seed: the data-order seed.
    shuffle: whether each epoch is a permutation (else the stored order).
    start_step: the global step of the first batch.

  Returns:
    A dataset of (x, y) global batches with a static batch dimension.

  Raises:
    DataError: the training set is smaller than one global batch.
  """
  n = len(source.x_train)
  if n < global_batch_size:
    raise DataError(f"the training set has {n} examples, fewer than one global batch "
                    f"of {global_batch_size}; lower --per_replica_batch_size")
  steps_per_epoch = n // global_batch_size
  x_all, y_all = tf.constant(source.x_train), tf.constant(source.y_train)

  def gather(positions):
    step = positions // global_batch_size
    epoch = step // steps_per_epoch
    index = (step % steps_per_epoch) * global_batch_size + positions % global_batch_size
    if shuffle:
      # A batch never straddles epochs, so one seed serves the whole batch.
      seeds = tf.stack([tf.constant(seed, tf.int64), epoch[0]])
      index = tf.random.experimental.index_shuffle(index, seeds, n - 1)
    return _to_inputs(tf.gather(x_all, index), source.scale), tf.gather(y_all, index)

  dataset = tf.data.Dataset.range(start_step * global_batch_size, _ENDLESS)
  dataset = dataset.batch(global_batch_size, drop_remainder=True)
  dataset = dataset.map(gather, num_parallel_calls=tf.data.AUTOTUNE)
  return dataset.prefetch(tf.data.AUTOTUNE).with_options(_options())


def eval_dataset(source: Source, *, global_batch_size: int):
  """The test split, padded with weight-0 examples to whole global batches.

  Args:
    source: the data set.
    global_batch_size: examples per step over all replicas.

  Returns:
    (dataset of (x, y, weight) global batches, number of batches).
  """
  n = len(source.x_test)
  num_batches = -(-n // global_batch_size)
  x_all, y_all = tf.constant(source.x_test), tf.constant(source.y_test)

  def gather(positions):
    index = tf.minimum(positions, n - 1)  # Padding repeats the last example...
    weight = tf.cast(positions < n, tf.float32)  # ...with weight 0.
    x = _to_inputs(tf.gather(x_all, index), source.scale)
    return x, tf.gather(y_all, index), weight

  dataset = tf.data.Dataset.range(num_batches * global_batch_size)
  dataset = dataset.batch(global_batch_size, drop_remainder=True)
  dataset = dataset.map(gather, num_parallel_calls=tf.data.AUTOTUNE)
  return dataset.prefetch(tf.data.AUTOTUNE).with_options(_options()), num_batches


def distribute(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset):
  """Splits each global batch into one per-replica batch per replica."""
  return strategy.experimental_distribute_dataset(
      dataset, tf.distribute.InputOptions(experimental_fetch_to_device=True))

