"""The order of per-pipeline data over a fixed number of input shards, so that
any number of workers that divides them reads the same examples at every step.

Per-pipeline data (TFRecord files, a task's pipeline function) is split into V
*input shards* (`Order.input_shards`), fixed when a run first starts and recorded
in each of its checkpoints. Each shard is its own stream of examples, ordered by
(seed, shard, epoch) and resumable at any position: a shard of files is the files
v, v+V, ... (shards.py); a shard of a pipeline function is the dataset it builds
for input context (V, v), shuffled with a seed per shard (pipelines.py). Global step
S holds B/V consecutive examples of each shard's stream, shard 0's first: a
function of (seed, S, the data) alone, whatever the worker count.

W workers read it exactly where W divides V (and V divides the global batch B,
as it does from the start): worker w reads shards w*V/W to (w+1)*V/W - 1, only
its own part of the data, B/V examples of each per step, and its replicas take
consecutive per-replica batches of those B/W examples. Each shard resumes at its
own position (step S: S x B/V), with the bounded cost of its kind.

A run's first start picks V (`first_input_shards`): the largest multiple of its
worker count that divides B, at most MAX_INPUT_SHARDS (or the worker count, where
that is more), whose shards each get their fair part of the data (`shardable`: a
shard of files needs files of its own). Resources that a single input pipeline
had are shared by the shards: the shuffle buffer and the block of files read
together (`share`), so one process holds what it did before, whatever V is.
A worker count that cannot read the recorded V (3 workers, 8 shards) picks a new V
the same way, and the run says that its examples change from there on.
"""

import dataclasses

import tensorflow as tf

from trainer.data.base import Order

# The most input shards a run picks for itself: one process builds as many
# input pipelines, and 1, 2, 4 and 8 workers divide it.
MAX_INPUT_SHARDS = 8


def exact(input_shards: int, *, pipelines: int, global_batch_size: int) -> bool:
  """Whether `pipelines` input pipelines read `input_shards` shards exactly: each
  a whole number of shards, each shard a whole number of examples per step."""
  return (input_shards > 0 and input_shards % pipelines == 0 and
          global_batch_size % input_shards == 0)


def first_input_shards(*, pipelines: int, global_batch_size: int,
                       shardable) -> int:
  """The input shards of a run's first start (or of a worker count that cannot
  read the recorded ones): the largest multiple of `pipelines` that divides the
  global batch, is at most MAX_INPUT_SHARDS and for which `shardable(shards)`;
  else `pipelines` (one shard per pipeline).

  Args:
    pipelines: the input pipelines (workers) of this invocation.
    global_batch_size: examples per (micro-)step over all replicas.
    shardable: `shards -> bool`, whether the data splits into that many shards
      that each get their fair part of it.
  """
  for shards in range(MAX_INPUT_SHARDS // pipelines * pipelines, pipelines,
                      -pipelines):
    if global_batch_size % shards == 0 and shardable(shards):
      return shards
  return pipelines


def read_by(order: Order, pipelines: int) -> Order:
  """`order` with the input shards `pipelines` pipelines read it over: its own
  (0, an order of no run: one per pipeline).

  Raises:
    ValueError: they cannot read its shards exactly (the run picks others first:
      first_input_shards).
  """
  if not order.input_shards:
    return dataclasses.replace(order, input_shards=pipelines)
  if not exact(order.input_shards, pipelines=pipelines,
               global_batch_size=order.global_batch_size):
    raise ValueError(f"{pipelines} input pipeline(s) cannot read "
                     f"{order.input_shards} input shards of a global batch of "
                     f"{order.global_batch_size} exactly")
  return order


def pipeline_shards(order: Order, *, pipelines: int, pipeline_id: int) -> range:
  """The input shards that pipeline `pipeline_id` of `pipelines` reads (of
  `read_by(order, pipelines)`)."""
  mine = order.input_shards // pipelines
  return range(pipeline_id * mine, (pipeline_id + 1) * mine)


def said(shards: range, input_shards: int) -> str:
  """A pipeline's input shards as a line says them: "input shard(s) 2-3 of 4"."""
  first, last = shards[0], shards[-1]
  return (f"input shard(s) {first}" + (f"-{last}" if last > first else "") +
          f" of {input_shards}")


def per_shard(order: Order) -> int:
  """Examples of each input shard in a global batch."""
  return order.global_batch_size // order.input_shards


def share(amount: int, shards: int) -> int:
  """One input shard's part of a resource of one pipeline's size (a shuffle
  buffer, a block of files): at least 1."""
  return max(1, -(-amount // max(1, shards)))


def interleaved(streams: list, *, per_shard: int) -> tf.data.Dataset:
  """The elements of endless `streams` (a pipeline's input shards, in shard
  order) taken `per_shard` from each in turn: a step's examples of each shard,
  shard by shard. A parallel interleave of the streams as elements reads each
  in its own thread (a choice of one stream per element, read in turn, gave
  half of one stream's ids per second over 8, and a third of its records)."""
  if len(streams) == 1:
    return streams[0]
  nested = tf.data.Dataset.from_tensors(streams[0])
  for stream in streams[1:]:
    nested = nested.concatenate(tf.data.Dataset.from_tensors(stream))
  return nested.interleave(lambda stream: stream, cycle_length=len(streams),
                           block_length=per_shard, num_parallel_calls=len(streams),
                           deterministic=True)
