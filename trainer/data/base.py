"""The one interface of a task's data, whatever its kind, and the order it is read in.

A task returns in-memory arrays, a `tf.data.Dataset`, `TFRecords` files or a
function that builds one input pipeline's dataset. `trainer.data.as_task_data`
wraps each in a `TaskData`, which answers the same questions for every kind: the
spec of an element, a first batch, what the data is (for the resume check), a
line saying what this worker reads, how many examples it has, and the
distributed input of the train and eval loops from a step. No module outside
`trainer/data` asks which kind it holds.

Training reads global batches in an order that depends only on `Order` (seed,
shuffle, buffer, global batch) and the step; evaluation reads every example
exactly once, padded with weight-0 examples to whole batches.
"""

import dataclasses
import re
from typing import Optional

import tensorflow as tf

from trainer.distribute.cluster import Cluster
from trainer.errors import DataError


@dataclasses.dataclass(frozen=True)
class Order:
  """What fixes the order of the training examples, with the step.

  Attributes:
    seed: the data-order seed (--seed).
    shuffle: whether to shuffle (--shuffle).
    buffer: the shuffle buffer of streamed data (--shuffle_buffer).
    global_batch_size: examples per (micro-)step over all replicas.
    input_shards: per-pipeline data (TFRecords, a pipeline function): the input
      shards its order is defined over, fixed when the run first starts and
      recorded in its checkpoints (0: one per input pipeline). Any worker count
      that divides it reads the same examples at every step, each worker its own
      shards (elastic.py).
  """
  seed: int = 0
  shuffle: bool = True
  buffer: int = 10000
  global_batch_size: int = 32
  input_shards: int = 0


class TaskData:
  """A task's training or evaluation data, as the framework reads it.

  Subclasses: `ArrayData`, `StreamData`, `PipelineData`, `TFRecords`.

  Attributes:
    what: where it came from, for errors (e.g. "Task.train_data()").
    note: a line to say once at start (e.g. how TFRecord files were counted).
    per_pipeline: each input pipeline (worker) reads its own part of the data,
      through distribute_datasets_from_function.
  """

  what: str = "the data"
  note: Optional[str] = None
  per_pipeline: bool = False  # Each worker reads its own part (its own files).

  @property
  def element_spec(self):
    """(features, labels) specs of one example."""
    raise NotImplementedError

  @property
  def feature_spec(self):
    """Specs of one batch of stored features (leading dimension None)."""
    return tf.nest.map_structure(
        lambda s: tf.TensorSpec([None, *s.shape], s.dtype), self.element_spec[0])

  def first(self, count: int):
    """The first `count` examples (or fewer) as one (features, labels) batch."""
    raise NotImplementedError

  def identity(self) -> dict:
    """What the data is, recorded in the checkpoint: a resume on other data (the
    same flags, another file) is refused."""
    return {}

  def describe(self, cluster: Cluster, order: Order) -> Optional[str]:
    """One line on what this worker reads for training (files, sharding), or
    None."""
    del cluster, order
    return None

  def count(self, cluster: Cluster) -> int:
    """The examples of this worker's part (of an evaluation split)."""
    raise NotImplementedError

  def check_training(self, cluster: Cluster, global_batch_size: int):
    """Raises DataError when this split cannot feed training at this batch."""
    del cluster, global_batch_size

  def input_shards(self, *, recorded: Optional[int], pipelines: int,
                   global_batch_size: int) -> int:
    """The input shards training reads over (Order.input_shards) on `pipelines`
    input pipelines: the run's `recorded` ones where these read them exactly,
    else others picked for this layout; 0 where the order has no shards (data
    that is not per-pipeline)."""
    del recorded, pipelines, global_batch_size
    return 0

  def train_input(self, strategy, cluster: Cluster, order: Order, *,
                  start_step: int, preprocess):
    """The distributed training input from global (micro-)step `start_step` on:
    each element gives every replica one per-replica batch."""
    raise NotImplementedError

  def eval_input(self, strategy, cluster: Cluster, *, global_batch_size: int,
                 preprocess) -> tuple:
    """(distributed dataset of (features, labels, weight) per-replica batches,
    eval steps): every example once, padded with weight-0 examples."""
    raise NotImplementedError

  def host_batches(self, order: Order, *, num_replicas: int, start_step: int,
                   count: int) -> list:
    """The `count` global batches (stored features, before Task.preprocess) from
    step `start_step` on, as one process with `num_replicas` replicas reads them:
    [(features, labels)], the replicas' batches in replica order."""
    raise NotImplementedError

  def step_examples(self, order: Order, *, first_step: int, steps: int) -> dict:
    """Which examples the micro-steps `first_step`.. `first_step + steps - 1`
    read: stream positions (indices into the training set for arrays)."""
    start = first_step * order.global_batch_size
    return {"stream_positions": [start, start + steps * order.global_batch_size]}

  def explain_error(self, error: Exception, cluster: Cluster, *, split: str,
                    step: int, order: Optional[Order] = None, position: int = 0,
                    records: int = 0) -> Optional[DataError]:
    """A DataError naming the bad element or record behind a loop call's
    `error`, or None. Here: elements whose shapes change (tf.data cannot batch
    them; the probe saw only the first ones)."""
    del cluster, order, position, records
    return changing_shapes(error, what=self.what, split=split, step=step)

  def gather_input(self, strategy, cluster: Cluster, order: Order, *,
                   per_replica_batch_size: int, preprocess):
    """In-graph per-replica batches with no iterator (data.GatherInput), or None
    when this data cannot be gathered."""
    del strategy, cluster, order, per_replica_batch_size, preprocess
    return None


def changing_shapes(error: Exception, *, what: str, split: str,
                    step: Optional[int]) -> Optional[DataError]:
  """The DataError of a loop call (at `step`; None: of reading the data before
  the first) that failed because the elements change shape, or None."""
  found = re.search(r"Cannot batch tensors with different shapes in component "
                    r"(\d+)\. First element had shape (\[[^]]*\]) and element "
                    r"(\d+) had shape (\[[^]]*\])", str(error))
  held = re.search(r"Shape of tensor (\S+) (\[[^]]*\]) is not compatible with "
                   r"expected shape (\[[^]]*\])", str(error))
  where = (f"{split} stopped in the steps after {step}; the checkpoints written "
           "so far are kept" if step is not None else
           f"found {split}, before the first step")
  if held:  # streams.one_shape: an element of another shape than the first's.
    return DataError(
        f"{what}: its elements change shape: the first has {held.group(3)}, a "
        f"later one {held.group(2)} ({where}); give every element the same "
        "shape (pad or crop them in the dataset)")
  if not found:
    return None
  component, first, index, other = found.groups()
  return DataError(
      f"{what}: its elements change shape: component {component} of a batch's "
      f"first element has shape {first}, of its element {index} {other} "
      f"({where}); give every element the same shape (pad or crop them in the "
      "dataset)")


@tf.autograph.experimental.do_not_convert
def weighted(*element, batched: bool) -> tuple:
  """(features, labels, weights) of an element given with or without weights:
  weights are float32, ones (one per example of a batch) where there were none."""
  if len(element) == 3:
    features, labels, weights = element
    return features, labels, tf.cast(weights, tf.float32)
  features, labels = element
  size = tf.shape(tf.nest.flatten(labels)[0])[:1] if batched else []
  return features, labels, tf.ones(size, tf.float32)


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


def input_options() -> tf.distribute.InputOptions:
  """How distributed input reaches the replicas: prefetched to their devices."""
  return tf.distribute.InputOptions(experimental_fetch_to_device=True)


def distribute(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset):
  """Splits each global batch into one per-replica batch per replica."""
  return strategy.experimental_distribute_dataset(dataset, input_options())


def count_elements(dataset: tf.data.Dataset) -> int:
  """Reads a finite dataset to count its elements (in-graph, fast)."""
  return int(dataset.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1))
