"""The mean and variance of the global batch, exactly, with one all-reduce.

A synchronized BatchNormalization must normalise every replica's batch with the
moments of the whole global batch, whatever its mask, its input's scale and
each replica's number of examples. Keras's own synchronized moments sum x and
x² over the replicas and take E[x²] - E[x]², which cancels catastrophically in
float32 when the mean is large against the spread (raw features of mean 1e3 and
spread 1 lose every digit), ignore a mask, and count the local shape times the
replicas.

Here each replica describes its (unmasked) examples by four numbers per
channel: their count n, a center c (their float32 mean), the sum of their
deviations from it E = Σ(x - c) (the mean's rounding error, times n) and the
sum of squared deviations S = Σ(x - c)², each a sum of small numbers, as one
device's two-pass moments are. One all-reduce gathers the replicas' rows: each
replica writes its row into its own slot of an otherwise zero
[replicas, 4, C] tensor, and a sum of zeros with one row is that row, exactly.
Every replica then combines the rows in the same order, around a shift s that
all of them share (the center of the replica with the most examples), so that
no large numbers cancel:

    d_r = c_r - s      μ' = Σ (n_r d_r + E_r) / n      mean = s + μ'
    M2 = Σ [S_r + 2 E_r (d_r - μ') + n_r (d_r - μ')²]    variance = M2 / n

which is Σ(x - mean)² over the global batch, exactly in exact arithmetic, for
any centers. A replica without examples contributes nothing (every division is
`divide_no_nan`). The gradient flows through the all-reduce (its gradient is
another all-reduce: two per layer and step in all). The all-reduce carries
replicas x 4 x channels numbers: small for a few dozen replicas (256 channels
on 8 replicas: 32 KB), growing with the replica count.
"""

import tensorflow as tf

_SUM = tf.distribute.ReduceOp.SUM


@tf.autograph.experimental.do_not_convert
def local_row(inputs, mask, axes: list):
  """(count, center, deviations' sum, squared deviations' sum) of this replica's
  (unmasked) examples, per channel, with the reduced axes kept."""
  if mask is None:
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), axes)), inputs.dtype)
    total = tf.reduce_sum(inputs, axis=axes, keepdims=True)
    count = tf.ones_like(total) * count
    center = tf.math.divide_no_nan(total, count)
    deviations = inputs - center
  else:
    # As Keras broadcasts a mask: one value per position, over the channels.
    weights = tf.cast(tf.broadcast_to(tf.expand_dims(tf.cast(mask, tf.bool), -1),
                                      tf.shape(inputs)), inputs.dtype)
    count = tf.reduce_sum(weights, axis=axes, keepdims=True)
    center = tf.math.divide_no_nan(
        tf.reduce_sum(inputs * weights, axis=axes, keepdims=True), count)
    deviations = (inputs - center) * weights
  return (count, center, tf.reduce_sum(deviations, axis=axes, keepdims=True),
          tf.reduce_sum(tf.square(deviations), axis=axes, keepdims=True))


@tf.autograph.experimental.do_not_convert
def combine(counts, centers, sums, squares):
  """The global (mean, variance) of per-replica rows stacked on axis 0 (see the
  module docstring)."""
  count = tf.reduce_sum(counts, axis=0)
  # The shared shift: the center of the replica with the most examples.
  shift = _center_of_largest(counts, centers)
  offsets = centers - shift
  mean_offset = tf.math.divide_no_nan(
      tf.reduce_sum(counts * offsets + sums, axis=0), count)
  apart = offsets - mean_offset
  spread = tf.reduce_sum(squares + 2.0 * sums * apart + counts * tf.square(apart),
                         axis=0)
  return shift + mean_offset, tf.math.divide_no_nan(spread, count)


@tf.autograph.experimental.do_not_convert
def _center_of_largest(counts, centers):
  """Per channel, the center of the replica with the most examples."""
  largest = tf.one_hot(tf.argmax(counts, axis=0), tf.shape(counts)[0], axis=0,
                       dtype=centers.dtype)
  return tf.reduce_sum(largest * centers, axis=0)


@tf.autograph.experimental.do_not_convert
def global_moments(inputs, mask, *, axes: list, context):
  """The global batch's (mean, variance) over `axes`, in a replica context.

  Args:
    inputs: this replica's inputs (floats: BatchNormalization casts float16
      and bfloat16 to float32).
    mask: None, or a mask of inputs' shape without the channel axis (Keras's).
    axes: the axes to reduce (all but the channel axes).
    context: the replica context (tf.distribute.get_replica_context()).

  Returns:
    (mean, variance), each of the shape of the channel axes.
  """
  row = local_row(inputs, mask, axes)
  kept = tf.shape(row[0])
  local = tf.stack([tf.reshape(part, [-1]) for part in row])  # [4, C]
  replicas = context.num_replicas_in_sync
  own_slot = tf.one_hot(context.replica_id_in_sync_group, replicas,
                        dtype=inputs.dtype)
  rows = context.all_reduce(_SUM, own_slot[:, None, None] * local[None])
  mean, variance = combine(*tf.unstack(rows, axis=1))
  squeeze = lambda t: tf.squeeze(tf.reshape(t, kept), axes)
  return squeeze(mean), squeeze(variance)
