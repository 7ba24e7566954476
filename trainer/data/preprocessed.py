"""Task.preprocess run once over data held in memory, instead of on every batch.

`Task.preprocess` is per-example and draws no random numbers (its docstring's
contract), so its output for an example is the same at every step: over arrays
held in memory it can run once, before training, like `map(vectorize).cache()`.
A TextVectorization of string arrays then runs once, and the token ids it gives
are numbers that the replicas gather in-graph (strings stay on the host).

`PreprocessedArrays` stands in for the raw arrays: the loops read the
preprocessed features without mapping again, while everything that speaks of the
data as stored (the probe, the export's signature, the resume's identity, a
divergence dump) still sees the raw ones. Where the output would not fit
(gather.MAX_GATHER_BYTES), or preprocess has random or stateful work after all,
the data is preprocessed per batch, as with --preprocess_once=false.
"""

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from trainer.autograph import graph_code
from trainer.data import gather
from trainer.data.arrays import ArrayData
from trainer.data.dataset_graph import read_variation

_CHUNK = 1024  # Examples preprocessed per call.


@dataclasses.dataclass(frozen=True)
class PreprocessedArrays(ArrayData):
  """Arrays whose `features` went through Task.preprocess once; `raw` holds the
  stored ones, which the data's spec, first examples, identity and host batches
  still are."""
  raw: Optional[ArrayData] = None

  @property
  def element_spec(self):
    return self.raw.element_spec

  def first(self, count: int):
    return self.raw.first(count)

  def identity(self) -> dict:
    return self.raw.identity()

  def train_dataset(self, order, *, start_step, preprocess=None):
    del preprocess  # Already applied.
    return super().train_dataset(order, start_step=start_step)

  def train_input(self, strategy, cluster, order, *, start_step, preprocess):
    del preprocess
    return super().train_input(strategy, cluster, order, start_step=start_step,
                               preprocess=None)

  def eval_input(self, strategy, cluster, *, global_batch_size, preprocess):
    del preprocess
    return super().eval_input(strategy, cluster, global_batch_size=global_batch_size,
                              preprocess=None)

  def gather_input(self, strategy, cluster, order, *, per_replica_batch_size,
                   preprocess):
    del preprocess
    return super().gather_input(strategy, cluster, order,
                                per_replica_batch_size=per_replica_batch_size,
                                preprocess=None)

  def host_batches(self, order, *, num_replicas, start_step, count):
    # As stored, before Task.preprocess (a divergence dump's batch).
    return self.raw.host_batches(order, num_replicas=num_replicas,
                                 start_step=start_step, count=count)


def once(data, preprocess, *, what: str) -> tuple:
  """(the data, a note or None): arrays held in memory with `preprocess` applied
  once (PreprocessedArrays), where it can be; other data as it is.

  Args:
    data: a TaskData (only ArrayData is preprocessed).
    preprocess: the task's preprocess.
    what: the split, for the note (e.g. "Task.train_data()").
  """
  if type(data) is not ArrayData:  # Streams, files, or already preprocessed.
    return data, None
  mapped = (tf.data.Dataset.from_tensor_slices(data.features).batch(_CHUNK)
            .map(graph_code(preprocess)))
  if read_variation(mapped) is not None:  # Random or stateful work, or Python.
    return data, (f"{what}: Task.preprocess draws random numbers or keeps state, "
                  "so it runs on every batch (a per-example map without random "
                  "work can run once, before training)")
  chunks = iter(mapped)
  first = next(chunks)
  leaves = tf.nest.flatten(first)
  if not all(leaf.dtype.is_floating or leaf.dtype.is_integer or
             leaf.dtype == tf.bool for leaf in leaves):
    return data, None  # Strings out: nothing to gather; map per batch.
  per_example = sum(leaf.shape[1:].num_elements() * leaf.dtype.size
                    for leaf in leaves)
  total = per_example * data.num_examples
  if total > gather.MAX_GATHER_BYTES:
    return data, (f"{what}: Task.preprocess's output would take "
                  f"{total / 2**30:.1f} GiB held in memory (over "
                  f"{gather.MAX_GATHER_BYTES / 2**30:.0f} GiB), so it runs on every "
                  "batch instead of once")
  parts = [tf.nest.map_structure(lambda t: t.numpy(), first)]
  parts += [tf.nest.map_structure(lambda t: t.numpy(), chunk) for chunk in chunks]
  try:
    features = tf.nest.map_structure(lambda *a: np.concatenate(a), *parts)
  except ValueError:  # Its shape depends on the batch (padded to the longest).
    return data, None
  return PreprocessedArrays(features=features, labels=data.labels,
                            weights=data.weights, what=data.what, raw=data), None
