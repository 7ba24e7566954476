"""TFRecord files as a task's data: read per input pipeline, ordered by (seed, step).

    train = trainer.data.TFRecords("data/digits/train-*", parse=parse_example)

`parse(serialized) -> (features, labels)` maps one record (or `parse_batch` a
batch of records, which is several times faster: one op per batch, not per
record); the framework does the rest. Training's order is defined over input
shards of the files (elastic.py), each reading its own files (shards.py says
which, and in which order) given the number of records of each file: from the
shards' `dataset.json` index, or counted once at start. Each input pipeline (one
per worker) reads only its own input shards. Evaluation reads each pipeline's
part of the files once; every pipeline is padded to the same number of batches
with weight-0 examples (pipelines.PerPipeline).
"""

import dataclasses
import hashlib
import os
import time
from typing import Callable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from trainer.data import arrays, dataset_graph, elastic, gather, record_files
from trainer.data.pipelines import PerPipeline
from trainer.data.shards import Shard
from trainer.errors import DataError

_NAMES_SAID = 8  # Files named in the start line; then a count.
# An input shard of files holds at least this part of the largest one's records
# (a step takes as many examples of each): else the run picks fewer shards.
_FAIR = 0.9


@dataclasses.dataclass(frozen=True)
class TFRecords(PerPipeline):
  """TFRecord files and how to read one record.

  Attributes:
    files: a glob ("data/train-*"), or a list of paths or globs.
    parse: `serialized record -> (features, labels)`, in-graph (e.g. with
      `tf.io.parse_single_example`); features need fully known shapes.
    parse_batch: instead of `parse`: `[batch] serialized records -> (features,
      labels)` with a leading batch dimension (e.g. with `tf.io.parse_example`).
    files_per_block: files interleaved and shuffled together (see shards.py); a
      resume re-reads at most one block.
    flag: what names these files in errors, e.g. "--train_files".
    counts: records per file, set when the files are resolved.
    note: how the counts were found when they were counted (said at start).
  """
  files: Union[str, Sequence[str]]
  parse: Optional[Callable] = None
  parse_batch: Optional[Callable] = None
  files_per_block: int = 4
  flag: str = ""
  counts: Optional[tuple] = None
  note: Optional[str] = None

  @property
  def what(self) -> str:
    return self.flag

  @property
  def paths(self) -> tuple:
    """The files (after `resolve`, which turns globs into paths)."""
    return tuple(self.files)

  @property
  def num_examples(self) -> int:
    return int(sum(self.counts))

  @property
  def element_spec(self):
    return self._parsed([self.paths[0]]).element_spec

  def _parsed(self, paths) -> tf.data.Dataset:
    return self.parsed(tf.data.TFRecordDataset(list(paths)))

  def parsed(self, serialized: tf.data.Dataset, *,
             batch_size: int = 1) -> tf.data.Dataset:
    """Records, parsed in order; `parse_batch` runs on batches of `batch_size`
    (1 where an error must name its record)."""
    if self.parse is not None:
      return serialized.map(self.parse)
    return serialized.batch(batch_size).map(self.parse_batch).unbatch()

  def parsed_batches(self, serialized: tf.data.Dataset,
                     batch_size: int) -> tf.data.Dataset:
    """Batches of `batch_size` parsed records (the last partial one dropped)."""
    if self.parse is not None:
      return serialized.map(self.parse, num_parallel_calls=tf.data.AUTOTUNE,
                            deterministic=True).batch(batch_size, drop_remainder=True)
    return serialized.batch(batch_size, drop_remainder=True).map(
        self.parse_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

  def first(self, count: int):
    """The first `count` records; a bad one among them is named (DataError)."""
    try:
      return next(iter(self._parsed(self.paths).batch(count).take(1)))
    except tf.errors.OpError:
      for path in self.paths:
        found = record_files.bad_record(path, parse=self.parsed)
        if found:
          raise DataError(f"{self.flag}: bad record in {found}") from None
      raise

  def identity(self) -> dict:
    """The files' names, sizes and record counts."""
    digest = hashlib.sha256()
    for path, count in zip(self.paths, self.counts):
      digest.update(f"{os.path.basename(path)}:{record_files.size(path)}:"
                    f"{count};".encode())
    return {"examples": self.num_examples, "files": len(self.paths),
            "files_sha256": digest.hexdigest()[:16],
            "files_per_block": self.files_per_block}

  def shard(self, num_shards: int, shard_id: int) -> Shard:
    """What shard `shard_id` of `num_shards` reads (an input shard of training's
    order, or a worker's part of an eval split)."""
    return Shard.of(paths=self.paths, counts=self.counts, num_shards=num_shards,
                    shard_id=shard_id, files_per_block=self.files_per_block,
                    flag=self.flag)

  def _own_shard(self, cluster) -> Shard:
    """This worker's part of an eval split."""
    return self.shard(cluster.num_pipelines, cluster.pipeline_id)

  def _worker_shards(self, order, pipelines: int, pipeline_id: int) -> list:
    """The input shards (Shards) pipeline `pipeline_id` of `pipelines` trains on,
    of `order` as elastic.read_by gives it."""
    return [self.shard(order.input_shards, v) for v in elastic.pipeline_shards(
        order, pipelines=pipelines, pipeline_id=pipeline_id)]

  def describe(self, cluster, order) -> str:
    """One line: which files this pipeline trains on and how."""
    order = elastic.read_by(order, cluster.num_pipelines)
    shards = self._worker_shards(order, cluster.num_pipelines, cluster.pipeline_id)
    names = [os.path.basename(self.paths[i])
             for i in sorted({i for shard in shards for i in shard.files})]
    count = len(names)
    names = ", ".join(names[:_NAMES_SAID] + [f"... ({count - _NAMES_SAID} more)"]
                      if count > _NAMES_SAID + 1 else names)
    total = order.input_shards
    said = elastic.said(range(shards[0].shard_id, shards[-1].shard_id + 1), total)
    if shards[0].record_level:
      return (f"{self.flag}: {len(self.paths)} file(s) < {total} input shards, "
              f"record-level sharding: input pipeline {cluster.pipeline_id} of "
              f"{cluster.num_pipelines} reads every file and keeps {len(shards)} "
              f"record(s) in {total}, its {said} ({names})")
    return (f"{self.flag}: file-level sharding, input pipeline {cluster.pipeline_id} "
            f"of {cluster.num_pipelines} reads {count} of {len(self.paths)} files "
            f"({sum(s.num_examples for s in shards)} records), {said}: {names}")

  def count(self, cluster) -> int:
    return self._own_shard(cluster).num_examples

  def check_training(self, cluster, global_batch_size: int):
    # Every worker checks every pipeline: they all stop, with the same line.
    # (Each pipeline's part holds whole input shards, which each have records
    # where the run picked them: elastic.first_input_shards.)
    del global_batch_size
    empty = [p for p in range(cluster.num_pipelines)
             if not self.shard(cluster.num_pipelines, p).num_examples]
    if empty:
      raise DataError(f"{self.flag}: input pipeline {empty[0]} of "
                      f"{cluster.num_pipelines} gets no records; write more shards")

  def shardable(self, shards: int) -> bool:
    """Whether `shards` input shards each read files of their own (file-level
    sharding) holding at least _FAIR of the largest shard's records: a step
    takes as many examples of each."""
    if shards > len(self.paths):
      return False
    sizes = [self.shard(shards, v).num_examples for v in range(shards)]
    return min(sizes) >= _FAIR * max(sizes)

  def shard_stream(self, shard, order, *, position):
    return self.shard(order.input_shards, shard).train_stream(order,
                                                               position=position)

  def batches(self, elements, batch_size):
    return self.parsed_batches(elements, batch_size)

  def pipeline_examples(self, context):
    shard = self.shard(context.num_input_pipelines, context.input_pipeline_id)
    return self.parsed(shard.eval_stream(), batch_size=256)

  def gather_input(self, strategy, cluster, order, *, per_replica_batch_size,
                   preprocess):
    """This pipeline's records decoded once into memory and gathered in-graph,
    in the order the stream would read them (`order`: its input shards in turn;
    None: an eval split, in the order `pipeline_examples` reads it), or None
    where the largest pipeline's would not fit (gather.MAX_GATHER_BYTES: every
    worker takes the same path) or hold text, where `parse` may give other
    values on a second read (dataset_graph.varies_between_reads: random
    augmentation), where records are sharded by record, where a worker of
    several has several replicas, or for an eval split of several pipelines
    (padded to the same count on every worker).

    Raises:
      DataError: a bad record, named (the records are all read now).
    """
    pipelines = cluster.num_pipelines
    if order is None:
      shard = self._own_shard(cluster)
      if (shard.record_level or pipelines > 1 or
          not self._holdable(shard.num_examples)):
        return None
      paths = [self.paths[i] for i in shard.files]
      return gather.EvalGather(
          strategy=strategy, per_replica_batch_size=per_replica_batch_size,
          preprocess=preprocess, data=self._decoded(
              paths, shard.num_examples,
              lambda: self.pipeline_examples(tf.distribute.InputContext())))
    order = elastic.read_by(order, pipelines)
    parts = [self._worker_shards(order, pipelines, p) for p in range(pipelines)]
    shards = parts[cluster.pipeline_id]
    if (shards[0].record_level or (pipelines > 1 and cluster.local_replicas > 1) or
        not self._holdable(max(sum(s.num_examples for s in part)
                               for part in parts))):
      return None
    paths = [self.paths[i] for shard in shards for i in shard.files]
    decoded = self._decoded(
        paths, sum(s.num_examples for s in shards),
        lambda: self.parsed(tf.data.TFRecordDataset(paths), batch_size=256))
    # Shard k's records follow those of the shards before it in memory.
    starts = np.cumsum([0] + [s.num_examples for s in shards[:-1]])
    per_shard = elastic.per_shard(order)
    per_step = cluster.local_replicas * per_replica_batch_size

    def ids(start_step):
      streams = [shard.train_stream(order, position=start_step * per_shard,
                                    ids=True, first_id=int(start))
                 for shard, start in zip(shards, starts)]
      return elastic.interleaved(streams, per_shard=per_shard).batch(
          per_step, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return gather.StreamedIdsGather(strategy=strategy, data=decoded,
                                    per_replica_batch_size=per_replica_batch_size,
                                    preprocess=preprocess, ids=ids,
                                    local_replicas=cluster.local_replicas)

  def _holdable(self, records: int) -> bool:
    """Whether `records` parsed records fit in memory and read the same twice."""
    return (gather.fits_in_memory(self.element_spec, records) and
            not dataset_graph.varies_between_reads(self._parsed(self.paths[:1])))

  def _decoded(self, paths: list, count: int, records) -> arrays.ArrayData:
    """`records()`, a dataset of the parsed records of `paths`, as arrays.

    Raises:
      DataError: a record that cannot be read or parsed, named; or a count other
        than the index's (`count`).
    """
    try:
      decoded = arrays.read_into_memory(records(), what=self.flag)
    except tf.errors.OpError:
      for path in paths:
        found = record_files.bad_record(path, parse=self.parsed)
        if found:
          raise DataError(f"{self.flag}: bad record in {found} (found while "
                          "decoding the records into memory, before training; "
                          "--array_input=dataset reads them as it trains)"
                          ) from None
      raise
    if decoded.num_examples != count:
      raise DataError(f"{self.flag}: read {decoded.num_examples} records where the "
                      f"index counts {count}; rewrite the index "
                      "(scripts/make_tfrecords.py --index)")
    return decoded

  def explain_error(self, error, cluster, *, split, step, order=None, position=0,
                    records=0):
    """When the error came out of the input (a corrupt file, or an error in the
    iterator's get-next), looks for the first bad record where this worker was
    reading: training, in each of its input shards, the blocks of the steps from
    its stream `position` over the call's `records` (and the next, which
    prefetching may have read); evaluation, all of its files."""
    if not (isinstance(error, tf.errors.DataLossError) or
            "IteratorGetNext" in str(error)):
      return None
    if split == "train":
      pipelines = cluster.num_pipelines
      order = elastic.read_by(order, pipelines)
      per_pipeline, per_shard = (order.global_batch_size // pipelines,
                                 elastic.per_shard(order))
      first, steps = position // per_pipeline, -(-records // per_pipeline)
      paths = []
      for shard in self._worker_shards(order, pipelines, cluster.pipeline_id):
        paths += [p for p in shard.files_read(first * per_shard, steps * per_shard,
                                              order) if p not in paths]
    else:
      paths = [self.paths[i] for i in self._own_shard(cluster).files]
    for path in paths:
      found = record_files.bad_record(path, parse=self.parsed)
      if found:
        return DataError(f"{self.flag}: bad record in {found} ({split} stopped in "
                         f"the steps after {step}; the checkpoints written so far "
                         "are kept)")
    return None


def resolve(records: TFRecords, *, what: str) -> TFRecords:
  """Finds the files, their record counts, and checks the first record.

  Args:
    records: TFRecords as a task returned them.
    what: where they came from, for errors (used when `records.flag` is empty).

  Returns:
    TFRecords with paths and counts (and a note when the counts were counted).

  Raises:
    DataError: no file matches, no records, a corrupt file (while counting) or a
      first record that `parse` cannot read.
  """
  flag = records.flag or what
  if (records.parse is None) == (records.parse_batch is None):
    raise DataError(f"{flag}: TFRecords needs parse or parse_batch (one of them)")
  if records.files_per_block < 1:
    raise DataError(f"{flag}: files_per_block={records.files_per_block}, must be "
                    ">= 1")
  paths = record_files.glob_files(records.files, flag)
  note = None
  counts = record_files.read_index(paths)
  if counts is None:
    started = time.monotonic()
    counts = [record_files.count_records(path, flag=flag) for path in paths]
    pattern = records.files if isinstance(records.files, str) else "..."
    note = (f"{flag}: counted {sum(counts)} records in {len(paths)} file(s) "
            f"({time.monotonic() - started:.1f} s); scripts/make_tfrecords.py "
            f"--index='{pattern}' writes an index that skips this")
  records = dataclasses.replace(records, files=tuple(paths), counts=tuple(counts),
                                flag=flag, note=note)
  if not records.num_examples:
    raise DataError(f"{flag}: the {len(paths)} file(s) hold no records")
  first = next(path for path, count in zip(paths, counts) if count)
  try:
    next(iter(records.parsed(tf.data.TFRecordDataset([first])).take(1)))
  except (tf.errors.OpError, ValueError, TypeError) as e:
    raise DataError(f"{flag}: {first}: record 0: {record_files.error_line(e)}"
                    ) from None
  spec = records.element_spec
  if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
    raise DataError(f"{flag}: parse must return (features, labels) or (features, "
                    f"labels, weights), got {spec}")
  if not all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec)):
    raise DataError(f"{flag}: parse must return tensors of known shapes (e.g. "
                    f"tf.ensure_shape), got {spec}")
  return records
