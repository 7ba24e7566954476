"""A task's data as distributed input: the one place that picks how batches reach
the replicas.

- Arrays and a single tf.data.Dataset (pipeline.py) are global batches split by
  `strategy.experimental_distribute_dataset`.
- TFRecord files (records.py) and a task's pipeline function (`PipelineData`)
  build one dataset per input pipeline (one per worker), given its
  `tf.distribute.InputContext`, through `strategy.distribute_datasets_from_function`:
  each worker reads only its own part, and each of its replicas takes one
  per-replica batch per step.

Evaluation of per-pipeline data pads every pipeline with weight-0 examples to the
same number of batches, so each example counts exactly once and every worker runs
the same number of eval steps.
"""

import dataclasses
from typing import Callable

import tensorflow as tf

from trainer.data import pipeline
from trainer.data.records import TFRecords, find_bad_record
from trainer.errors import DataError


@dataclasses.dataclass
class PipelineData:
  """A task's function that builds one input pipeline's data.

  Attributes:
    build: `input_context -> tf.data.Dataset` of unbatched (features, labels)
      elements: the part of the data that input pipeline
      `input_context.input_pipeline_id` of `input_context.num_input_pipelines`
      reads (e.g. its own files). The framework shuffles (a buffer seeded by
      --seed and the pipeline), repeats, batches and, on resume, skips the
      batches already trained on (which reads them again).
  """
  build: Callable
  _counts: dict = dataclasses.field(default_factory=dict)

  @property
  def element_spec(self):
    return self.build(tf.distribute.InputContext()).element_spec

  def first(self, count: int):
    for batch in self.build(tf.distribute.InputContext()).batch(count).take(1):
      return batch
    raise AssertionError("as_task_data checked that the pipeline is not empty")

  def identity(self) -> dict:
    return {}

  def describe(self, num_pipelines: int, pipeline_id: int) -> str:
    return (f"input pipeline {pipeline_id} of {num_pipelines}: the task's pipeline "
            "function")

  def count(self, num_pipelines: int, pipeline_id: int, num_replicas: int) -> int:
    """Examples of this worker's pipeline (an eval split), counted once per layout."""
    key = (num_pipelines, pipeline_id)
    if key not in self._counts:
      self._counts[key] = pipeline.count_elements(self.build(
          tf.distribute.InputContext(num_pipelines, pipeline_id, num_replicas)))
    return self._counts[key]


def check_pipeline_data(value: PipelineData, *, what: str, finite: bool):
  """Checks a pipeline function on a one-pipeline context.

  Raises:
    DataError: it does not return a dataset of (features, labels) pairs with
      elements, or (an eval split) it is infinite or has unknown shapes.
  """
  dataset = value.build(tf.distribute.InputContext())
  if not isinstance(dataset, tf.data.Dataset):
    raise DataError(f"{what}: the pipeline function must return a tf.data.Dataset, "
                    f"got {type(dataset).__name__}")
  pipeline.check_dataset(dataset, what=what, finite=finite,
                         name="the pipeline's dataset", kind="the pipeline's dataset")
  spec = dataset.element_spec
  if finite and not all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec)):
    raise DataError(f"{what}: eval elements need known shapes (padding copies "
                    f"them), got {spec}")


def is_per_pipeline(data) -> bool:
  return isinstance(data, (TFRecords, PipelineData))


def input_pipelines(strategy) -> tuple:
  """(number of input pipelines, this worker's) under `strategy`."""
  resolver = getattr(strategy, "cluster_resolver", None)
  if (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and resolver
      is not None and resolver.cluster_spec().as_dict()):
    # The input context's id: the chief (if the cluster names one) is 0.
    # pylint: disable-next=protected-access
    return strategy.extended._num_workers, int(strategy.extended._id_in_cluster)
  return 1, 0


def describe(strategy, data):
  """This worker's one line on what it reads, or None for in-memory data."""
  if not is_per_pipeline(data):
    return None
  return "input: " + data.describe(*input_pipelines(strategy))


def _options() -> tf.data.Options:
  return pipeline.dataset_options(tf.data.experimental.AutoShardPolicy.OFF)


def _batches(data, context, *, batch_size, seed, shuffle, shuffle_buffer, position):
  """One pipeline's endless stream of parsed batches from example `position` on."""
  if isinstance(data, TFRecords):
    shard = data.shard(context.num_input_pipelines, context.input_pipeline_id)
    return data.parsed_batches(shard.train_stream(
        seed=seed, shuffle=shuffle, buffer=shuffle_buffer, position=position),
                               batch_size)
  dataset = data.build(context)
  if shuffle:
    dataset = dataset.shuffle(
        shuffle_buffer, seed=seed * 1_000_003 + context.input_pipeline_id,
        reshuffle_each_iteration=True)
  return dataset.repeat().skip(position).batch(batch_size, drop_remainder=True)


def train_input(strategy, data, *, global_batch_size: int, seed: int, shuffle: bool,
                shuffle_buffer: int, start_step: int, preprocess):
  """The distributed training input from global (micro-)step `start_step` on.

  Args:
    strategy: the run's strategy.
    data: ArrayData, StreamData, TFRecords or PipelineData.
    global_batch_size: examples per (micro-)step over all replicas.
    seed: the data-order seed.
    shuffle: whether to shuffle.
    shuffle_buffer: the buffer of streamed data's shuffle.
    start_step: the (micro-)step of the first batch.
    preprocess: the task's map from a batch of stored features to model inputs.

  Returns:
    A distributed dataset: each element one per-replica batch per replica.
  """
  if not is_per_pipeline(data):
    return pipeline.distribute(strategy, pipeline.train_dataset(
        data, global_batch_size=global_batch_size, seed=seed, shuffle=shuffle,
        shuffle_buffer=shuffle_buffer, start_step=start_step,
        preprocess=preprocess))

  def build(context):
    per_replica = context.get_per_replica_batch_size(global_batch_size)
    local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
    batches = _batches(data, context, batch_size=per_replica, seed=seed,
                       shuffle=shuffle, shuffle_buffer=shuffle_buffer,
                       position=start_step * local_replicas * per_replica)
    # A plain map: a parallel one after the batch is rewritten under multi-worker
    # with an error line on stderr, and batches are cheap to preprocess.
    dataset = batches.map(lambda features, labels: (preprocess(features), labels))
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(_options())

  return strategy.distribute_datasets_from_function(build, pipeline.input_options())


def host_batches(data, *, num_replicas: int, global_batch_size: int, seed: int,
                 shuffle: bool, shuffle_buffer: int, start_step: int,
                 count: int) -> list:
  """The `count` global batches (as stored, before Task.preprocess) from step
  `start_step` on, as one process with `num_replicas` replicas reads them.

  Returns:
    [(features, labels)] global batches, the replicas' batches in replica order.
  """
  if not is_per_pipeline(data):
    return list(pipeline.train_dataset(
        data, global_batch_size=global_batch_size, seed=seed, shuffle=shuffle,
        shuffle_buffer=shuffle_buffer, start_step=start_step).take(count))
  # One pipeline's consecutive per-replica batches, replica 0 first, make a step.
  batches = _batches(data, tf.distribute.InputContext(1, 0, num_replicas),
                     batch_size=global_batch_size, seed=seed, shuffle=shuffle,
                     shuffle_buffer=shuffle_buffer,
                     position=start_step * global_batch_size)
  return list(batches.take(count))


def eval_input(strategy, data, *, global_batch_size: int, preprocess) -> tuple:
  """The distributed eval split, padded with weight-0 examples.

  Returns:
    (distributed dataset of (features, labels, weight) per-replica batches, the
    number of eval steps).
  """
  if not is_per_pipeline(data):
    dataset, num_batches = pipeline.eval_dataset(
        data, global_batch_size=global_batch_size, preprocess=preprocess)
    return pipeline.distribute(strategy, dataset), num_batches
  num_pipelines, this_pipeline = input_pipelines(strategy)
  num_replicas = strategy.num_replicas_in_sync
  local_replicas = num_replicas // num_pipelines
  per_replica = -(-global_batch_size // num_replicas)
  per_step = local_replicas * per_replica
  if isinstance(data, TFRecords):  # Every pipeline's count is known.
    counts = {p: data.shard(num_pipelines, p).num_examples
              for p in range(num_pipelines)}
    most = max(counts.values())
  else:  # Each worker counts its own part; the largest is agreed on.
    counts = {this_pipeline: data.count(num_pipelines, this_pipeline, num_replicas)}
    most = _max_over_workers(strategy, counts[this_pipeline])
  num_batches = max(1, -(-most // per_step))
  features_spec, labels_spec = data.element_spec
  padding = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype),
                                  (features_spec, labels_spec))

  def build(context):
    pipeline_id = context.input_pipeline_id
    if isinstance(data, TFRecords):
      real = data.shard(context.num_input_pipelines, pipeline_id).eval_records()
    else:
      real = data.build(context)
    real = real.map(lambda f, y: (f, y, tf.constant(1.0)))
    pad = tf.data.Dataset.from_tensors((*padding, tf.constant(0.0))).repeat(
        num_batches * per_step - counts[pipeline_id])
    dataset = real.concatenate(pad).batch(per_replica, drop_remainder=True).map(
        lambda f, y, w: (preprocess(f), y, w))
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(_options())

  return strategy.distribute_datasets_from_function(build, pipeline.input_options()), \
      num_batches


def _max_over_workers(strategy, value: int) -> int:
  """The largest of every worker's `value` (a collective under multi-worker)."""
  if input_pipelines(strategy)[0] == 1:
    return value
  local = tf.constant(value, tf.int64)
  reduce = tf.function(lambda: strategy.reduce(
      tf.distribute.ReduceOp.MAX, strategy.run(lambda: tf.identity(local)), axis=None))
  return int(reduce())


def input_error(strategy, data, error: Exception, *, split: str, step: int,
                seed: int = 0, shuffle: bool = False, position: int = 0,
                records: int = 0):
  """Explains an error of a loop call that may come from a bad record.

  When the error came out of the input (a corrupt file, or an error in the
  iterator's get-next), looks for the first bad record where this worker was
  reading: training, the blocks from `position` over the call's `records` (and
  the next, which prefetching may have read); evaluation, all of its files.

  Returns:
    A DataError naming the file and record (the checkpoint is kept), or None when
    the data is not TFRecords, the error is not the input's, or no bad record is
    found there.
  """
  from_input = (isinstance(error, tf.errors.DataLossError) or
                "IteratorGetNext" in str(error))
  if not isinstance(data, TFRecords) or not from_input:
    return None
  shard = data.shard(*input_pipelines(strategy))
  if split == "train":
    paths = shard.files_read(position, records, seed=seed, shuffle=shuffle)
  else:
    paths = [data.paths[i] for i in shard.files]
  found = find_bad_record(data, paths)
  if found is None:
    return None
  return DataError(f"{data.flag}: bad record in {found} ({split} stopped in the "
                   f"steps after {step}; the checkpoints written so far are kept)")
