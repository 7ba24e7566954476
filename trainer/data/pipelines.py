"""Per-pipeline data: what each input pipeline reads of the input shards that
order it (`PerPipeline`, for TFRecord files and pipeline functions), and a task's
function that builds one input pipeline's dataset (`PipelineData`).

Training reads through `distribute_datasets_from_function`: each input pipeline
(one per worker) reads only its own input shards (elastic.py), a step's examples
of each in turn, and each of its replicas takes one per-replica batch per step.
Evaluation reads each pipeline's part once, padded with weight-0 copies of a real
example to the same number of batches on every worker, so every worker runs the
same number of eval steps.
"""

import dataclasses
from typing import Callable, Optional

import tensorflow as tf

from trainer.data import base, elastic
from trainer.data.examples import as_examples
from trainer.data.streams import (OFF, check_dataset, max_over_workers, padded,
                                  preprocessed, shuffled_stream)
from trainer.errors import DataError


def pipeline_seed(order: base.Order, shard: int) -> int:
  """The shuffle seed of one input shard's stream."""
  return order.seed * 1_000_003 + shard


def shard_context(shard: int, shards: int) -> tf.distribute.InputContext:
  """The input context a pipeline function builds input shard `shard` of `shards`
  with: part `shard` of `shards`, one replica per shard (a shard feeds one
  replica's share of a step, whatever the replicas)."""
  return tf.distribute.InputContext(shards, shard, shards)


class PerPipeline(base.TaskData):
  """Data that each input pipeline (worker) reads its own part of, ordered over
  input shards (elastic.py). Subclasses say what a shard streams, how its
  elements become batches, and what a pipeline reads of an eval split."""

  per_pipeline = True

  def shard_stream(self, shard: int, order: base.Order, *,
                   position: int) -> tf.data.Dataset:
    """Input shard `shard` of `order.input_shards`'s endless stream of elements
    (for files: serialized records), from its element `position` on."""
    raise NotImplementedError

  def batches(self, elements: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    """Batches of stored features of `batch_size` elements of shard streams."""
    return elements.batch(batch_size, drop_remainder=True)

  def shardable(self, shards: int) -> bool:
    """Whether the data splits into `shards` input shards that each get their
    fair part of it."""
    raise NotImplementedError

  def pipeline_examples(self, context: tf.distribute.InputContext
                        ) -> tf.data.Dataset:
    """Pipeline `context.input_pipeline_id`'s part of an eval split, once."""
    raise NotImplementedError

  def input_shards(self, *, recorded, pipelines, global_batch_size):
    if recorded and elastic.exact(recorded, pipelines=pipelines,
                                  global_batch_size=global_batch_size):
      return recorded
    return elastic.first_input_shards(pipelines=pipelines,
                                      global_batch_size=global_batch_size,
                                      shardable=self.shardable)

  def pipeline_stream(self, order: base.Order, *, pipelines: int, pipeline_id: int,
                      start_step: int) -> tf.data.Dataset:
    """Pipeline `pipeline_id` of `pipelines`'s elements from global (micro-)step
    `start_step` on: each step, its input shards' examples of the step."""
    order = elastic.read_by(order, pipelines)
    per_shard = elastic.per_shard(order)
    return elastic.interleaved(
        [self.shard_stream(shard, order, position=start_step * per_shard)
         for shard in elastic.pipeline_shards(order, pipelines=pipelines,
                                              pipeline_id=pipeline_id)],
        per_shard=per_shard)

  def train_input(self, strategy, cluster, order, *, start_step, preprocess):
    del cluster

    def build(context):
      per_replica = context.get_per_replica_batch_size(order.global_batch_size)
      batches = self.batches(self.pipeline_stream(
          order, pipelines=context.num_input_pipelines,
          pipeline_id=context.input_pipeline_id, start_step=start_step), per_replica)
      # A plain map: a parallel one after the batch is rewritten under
      # multi-worker with an error line on stderr, and batches are cheap to
      # preprocess.
      dataset = batches.map(preprocessed(preprocess))
      return dataset.prefetch(tf.data.AUTOTUNE).with_options(base.dataset_options(OFF))

    return strategy.distribute_datasets_from_function(build, base.input_options())

  def eval_input(self, strategy, cluster, *, global_batch_size, preprocess):
    per_replica = -(-global_batch_size // cluster.num_replicas)
    per_step = cluster.local_replicas * per_replica
    mine = self.count(cluster)
    num_batches = max(1, -(-max_over_workers(strategy, cluster, mine) // per_step))

    def build(context):
      dataset = padded(self.pipeline_examples(context),
                       padding=num_batches * per_step - mine)
      dataset = dataset.batch(per_replica, drop_remainder=True).map(
          lambda f, y, w, p: (preprocess(f), y, w, p))
      return dataset.prefetch(tf.data.AUTOTUNE).with_options(base.dataset_options(OFF))

    return (strategy.distribute_datasets_from_function(build, base.input_options()),
            num_batches)

  def host_batches(self, order, *, num_replicas, start_step, count):
    # One process reads every input shard: its consecutive per-replica batches,
    # replica 0 first, make a step.
    del num_replicas
    stream = self.pipeline_stream(order, pipelines=1, pipeline_id=0,
                                  start_step=start_step)
    return list(self.batches(stream, order.global_batch_size).take(count))


@dataclasses.dataclass
class PipelineData(PerPipeline):
  """A task's function that builds one input pipeline's data.

  Attributes:
    build: `input_context -> tf.data.Dataset` of unbatched (features, labels)
      elements: the part of the data that part `input_context.input_pipeline_id`
      of `input_context.num_input_pipelines` holds (e.g. its own files). For
      training, the parts are the run's input shards (elastic.py; their
      contexts say one replica per shard), each worker building its own; for
      evaluation, one per worker. The framework shuffles each shard (a buffer
      seeded by --seed and the shard), repeats, batches and, on resume, skips
      the examples already trained on (which reads them again).
    what: where it came from, for errors.
  """
  build: Callable
  what: str = "the pipeline function"
  note: Optional[str] = None
  _counts: dict = dataclasses.field(default_factory=dict)
  _shardable: dict = dataclasses.field(default_factory=dict)

  @property
  def element_spec(self):
    return self.build(tf.distribute.InputContext()).element_spec

  def first(self, count: int):
    return next(iter(self.build(tf.distribute.InputContext()).batch(count).take(1)))

  def describe(self, cluster, order) -> str:
    order = elastic.read_by(order, cluster.num_pipelines)
    shards = elastic.pipeline_shards(order, pipelines=cluster.num_pipelines,
                                     pipeline_id=cluster.pipeline_id)
    return (f"input pipeline {cluster.pipeline_id} of {cluster.num_pipelines}: the "
            f"task's pipeline function, {elastic.said(shards, order.input_shards)}")

  def count(self, cluster) -> int:
    """Examples of this worker's pipeline (an eval split), counted once per layout."""
    key = (cluster.num_pipelines, cluster.pipeline_id)
    if key not in self._counts:
      self._counts[key] = base.count_elements(self.build(tf.distribute.InputContext(
          cluster.num_pipelines, cluster.pipeline_id, cluster.num_replicas)))
    return self._counts[key]

  def shard_stream(self, shard, order, *, position):
    return shuffled_stream(self.build(shard_context(shard, order.input_shards)),
                           order, shuffle_seed=pipeline_seed(order, shard),
                           position=position, shares=order.input_shards)

  def shardable(self, shards: int) -> bool:
    """Whether the function gives each of `shards` input shards examples (read
    once per count: the first element of each)."""
    if shards not in self._shardable:
      self._shardable[shards] = all(
          any(True for _ in self.build(shard_context(v, shards)).take(1))
          for v in range(shards))
    return self._shardable[shards]

  def pipeline_examples(self, context):
    return self.build(context)


def check_pipeline(build: Callable, *, what: str, finite: bool) -> PipelineData:
  """A task's pipeline function as PipelineData, checked on a one-pipeline context.

  Raises:
    DataError: it does not return a dataset of (features, labels) pairs with
      elements, or (an eval split) it is infinite or has unknown shapes.
  """
  dataset = build(tf.distribute.InputContext())
  if not isinstance(dataset, tf.data.Dataset):
    raise DataError(f"{what}: the pipeline function must return a tf.data.Dataset, "
                    f"got {type(dataset).__name__}")
  original = dataset
  dataset, note = as_examples(dataset, what=what, name="the pipeline's dataset")
  check_dataset(dataset, what=what, finite=finite, name="the pipeline's dataset",
                kind="the pipeline's dataset")
  spec = dataset.element_spec
  if finite and not all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec)):
    raise DataError(f"{what}: eval elements need known shapes (padding copies "
                    f"them), got {spec}")
  if dataset is not original:  # Batches: each pipeline's are unbatched too.
    built = build

    def build(context):
      return built(context).unbatch()

  return PipelineData(build, what=what, note=note)
