"""Whether a task's dataset yields examples or batches of them, decided from
its graph (dataset_graph.batching), and its examples either way.

A Keras user's dataset is usually batched (`image_dataset_from_directory(
batch_size=32)`, `.batch(64)` with augmentation mapped over the batches): the
framework unbatches it and batches the examples again into per-replica batches.
What cannot be unbatched into examples of one shape (padded or ragged batches,
batches of batches), and what the graph cannot tell (batches mixed with
examples, datasets of datasets), is refused in one line: training on a batch as
if it were one example would be silently wrong.
"""

import tensorflow as tf

from trainer.data import dataset_graph
from trainer.errors import DataError


def as_examples(dataset: tf.data.Dataset, *, what: str, name: str = "the dataset"):
  """(the examples of `dataset`, a note or None).

  Raises:
    DataError: its elements are padded, ragged or nested batches, or the graph
      cannot tell whether they are examples.
  """
  found = dataset_graph.batching(dataset)
  if found.depth is None:
    if found.why.startswith("its graph cannot be read"):
      return dataset, (f"{what}: {name}'s graph cannot be read (over 2 GiB), so "
                       "its elements are taken as examples")
    raise DataError(
        f"{what}: cannot tell whether {name}'s elements are examples or batches: "
        f"{found.why}; return a dataset of single (features, labels) examples, "
        "or of plain batch() batches")
  if found.depth == 0:
    return dataset, None
  if found.depth > 1 or found.kind != "batch":
    kind = ("batches of batches" if found.depth > 1 else
            f"{found.kind} batches, whose shapes differ from batch to batch")
    raise DataError(
        f"{what}: {name} yields {kind} (elements {dataset.element_spec}): return "
        "its examples with one shape, unbatched (e.g. padded or cropped to one "
        "length), and the framework batches them")
  return dataset.unbatch(), (
      f"{what}: {name} yields batches; the framework unbatches them and batches "
      "the examples again, one per-replica batch per replica per step")
