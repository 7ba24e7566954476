"""What a tf.data.Dataset's graph says of it, read without running it: whether a
second read gives the same elements (or the same ones in another order), and
whether it batches its examples.

The framework holds a dataset in memory (decoded once) only where a second read
gives its elements again (streams.StreamData.gather_input), and takes a batched
dataset as its examples (`as_examples`).
"""

import re
from typing import Optional

import tensorflow as tf
from tensorflow.python.framework import op_def_registry  # Is an op stateful?

from trainer.errors import DataError

# Ops after which reading a dataset again may give other elements, besides every
# stateful op that is not a dataset's source (a variable read, a random op), nor
# one that only checks or prints (the same values either way).
_VARYING_OPS = ("Random", "Shuffle", "PyFunc", "Generator")
_DATASET_OP = re.compile(r"Dataset(V\d+)?$")
_CHECKS = ("Assert", "Print", "PrintV2")
# A shuffle of a dataset's elements: other orders, the same elements...
_ORDER_ONLY = re.compile(r"^Shuffle(AndRepeat)?Dataset(V\d+)?$")
# ...unless a part of them is taken after it (a batch may drop its remainder).
_PARTS = ("Take", "Skip", "Shard", "Sample", "Window", "Filter", "Batch",
          "ParallelBatch", "PaddedBatch")
ORDER, ELEMENTS = "order", "elements"


def dataset_ops(dataset: tf.data.Dataset) -> Optional[set]:
  """The names of the ops of `dataset`'s graph and of its functions (the maps'),
  or None where the graph cannot be read (over protobuf's 2 GiB)."""
  try:
    serialized = dataset._as_serialized_graph(  # noqa: SLF001 (no public way)
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE)
    graph = tf.compat.v1.GraphDef.FromString(serialized.numpy())
  except (tf.errors.OpError, ValueError, MemoryError):
    return None
  return {node.op for node in graph.node} | {
      node.op for function in graph.library.function for node in function.node_def}


def read_variation(dataset: tf.data.Dataset) -> Optional[str]:
  """What reading `dataset` again may change: None (nothing), ORDER (its
  elements come in another order: its only varying ops shuffle it, and no part
  of it is taken), or ELEMENTS (other elements may come: a random or stateful op
  (a variable, a random generator), Python (a generator, a py_function), or a
  graph that cannot be read, over protobuf's 2 GiB: such data is not held in
  memory either)."""
  ops = dataset_ops(dataset)
  if ops is None:
    return ELEMENTS
  varying = set()
  for op in ops:
    definition = op_def_registry.get(op)
    if any(word in op for word in _VARYING_OPS) or (
        definition is not None and definition.is_stateful and
        not _DATASET_OP.search(op) and not op.startswith("_") and
        op not in _CHECKS):
      varying.add(op)
  if not varying:
    return None
  if all(_ORDER_ONLY.match(op) for op in varying) and not any(
      op.startswith(_PARTS) for op in ops):
    return ORDER
  return ELEMENTS


def varies_between_reads(dataset: tf.data.Dataset) -> bool:
  """Whether reading `dataset` again may give other elements or another order."""
  return read_variation(dataset) is not None


# Batches whose examples unbatch() gives back as they were.
_PLAIN_BATCHING = ("BatchDataset", "ParallelBatchDataset")
_BATCHING = (*_PLAIN_BATCHING, "PaddedBatchDataset", "DenseToRaggedBatchDataset",
             "BucketBySequenceLengthDataset")


def batching(dataset: tf.data.Dataset) -> Optional[str]:
  """How `dataset` batches its elements (the kind of its batch() dataset not
  undone by unbatch()), from the chain of datasets it was built from; None where
  it yields single examples."""
  pending = [dataset]
  while pending:
    current = pending.pop()
    kind = type(current).__name__.lstrip("_")
    if kind == "UnbatchDataset":
      continue
    if kind in _BATCHING:
      return kind
    # tf.data keeps the datasets a dataset was built from as these attributes.
    pending += [d for d in [getattr(current, "_input_dataset", None),
                            getattr(current, "_dataset_to_concatenate", None),
                            *getattr(current, "_datasets", ())]
                if isinstance(d, tf.data.Dataset)]
  return None


def as_examples(dataset: tf.data.Dataset, *, what: str, name: str = "the dataset"):
  """(the examples of `dataset`, a note or None): a dataset that batches them
  (a Keras user's `image_dataset_from_directory(batch_size=32)`, with
  augmentation mapped over its batches) is unbatched, and the framework batches
  its examples again into per-replica batches.

  Raises:
    DataError: it pads or ragged-batches them (their shapes differ from batch to
      batch: unbatched, they could not be batched again).
  """
  kind = batching(dataset)
  if kind is None:
    return dataset, None
  if kind not in _PLAIN_BATCHING:
    raise DataError(
        f"{what}: {name} yields padded or ragged batches ({kind}; elements "
        f"{dataset.element_spec}), whose shapes differ from batch to batch: return "
        "its examples with one shape, unbatched (e.g. padded or cropped to one "
        "length), and the framework batches them")
  return dataset.unbatch(), (
      f"{what}: {name} yields batches; the framework unbatches them and batches "
      "the examples again, one per-replica batch per replica per step")
