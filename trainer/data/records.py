"""TFRecord files as a task's data: read per input pipeline, ordered by (seed, step).

    train = trainer.data.TFRecords("data/digits/train-*", parse=parse_example)

`parse(serialized) -> (features, labels)` maps one record (or `parse_batch` a
batch of records, which is several times faster: one op per batch, not per
record); the framework does the rest. Each input pipeline (one per worker) reads
only its own part of the files (shards.py says which, and in which order), given
the number of records of each file: from the shards' `dataset.json` index, or
counted once at start. Evaluation reads each pipeline's records once, in file
order; every pipeline is padded to the same number of batches with weight-0
examples (streams.PerPipeline).
"""

import dataclasses
import hashlib
import os
import time
from typing import Callable, Optional, Sequence, Union

import tensorflow as tf

from trainer.data import arrays, dataset_graph, gather, record_files, streams
from trainer.data.shards import Shard
from trainer.errors import DataError

_NAMES_SAID = 8  # Files named in the start line; then a count.


@dataclasses.dataclass(frozen=True)
class TFRecords(streams.PerPipeline):
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

  def shard(self, num_pipelines: int, pipeline_id: int) -> Shard:
    """What input pipeline `pipeline_id` of `num_pipelines` reads."""
    return Shard.of(paths=self.paths, counts=self.counts,
                    num_pipelines=num_pipelines, pipeline_id=pipeline_id,
                    files_per_block=self.files_per_block, flag=self.flag)

  def _own_shard(self, cluster) -> Shard:
    return self.shard(cluster.num_pipelines, cluster.pipeline_id)

  def describe(self, cluster) -> str:
    """One line: which files this pipeline reads and how."""
    shard = self._own_shard(cluster)
    names = [os.path.basename(self.paths[i]) for i in shard.files]
    names = ", ".join(names[:_NAMES_SAID] + [f"... ({len(names) - _NAMES_SAID} more)"]
                      if len(names) > _NAMES_SAID + 1 else names)
    if shard.record_level:
      return (f"{self.flag}: {len(self.paths)} file(s) < {cluster.num_pipelines} "
              f"input pipelines, record-level sharding: pipeline "
              f"{cluster.pipeline_id} reads every file and keeps 1 record in "
              f"{cluster.num_pipelines} ({names})")
    return (f"{self.flag}: file-level sharding, input pipeline {cluster.pipeline_id} "
            f"of {cluster.num_pipelines} reads {len(shard.files)} of "
            f"{len(self.paths)} files ({shard.num_examples} records): {names}")

  def count(self, cluster) -> int:
    return self._own_shard(cluster).num_examples

  def check_training(self, cluster, global_batch_size: int):
    # Every worker checks every pipeline: they all stop, with the same line.
    del global_batch_size
    empty = [p for p in range(cluster.num_pipelines)
             if not self.shard(cluster.num_pipelines, p).num_examples]
    if empty:
      raise DataError(f"{self.flag}: input pipeline {empty[0]} of "
                      f"{cluster.num_pipelines} gets no records; write more shards")

  def pipeline_batches(self, context, order, *, batch_size, position):
    shard = self.shard(context.num_input_pipelines, context.input_pipeline_id)
    return self.parsed_batches(shard.train_stream(order, position=position),
                               batch_size)

  def pipeline_examples(self, context):
    shard = self.shard(context.num_input_pipelines, context.input_pipeline_id)
    return self.parsed(shard.eval_stream(), batch_size=256)

  def gather_input(self, strategy, cluster, order, *, per_replica_batch_size,
                   preprocess):
    """This pipeline's records decoded once into memory and gathered in-graph,
    in the order the stream would read them (`order`; None: an eval split, in
    the order `pipeline_examples` reads it), or None where the largest
    pipeline's would not fit (gather.MAX_GATHER_BYTES: every worker takes the
    same path) or hold text, where `parse` may give other values on a second
    read (dataset_graph.varies_between_reads: random augmentation), where records
    are sharded by record, where a worker has several replicas, where the order
    is defined over more shards than pipelines (streams.exact_shards), or for an
    eval split of several pipelines (padded to the same count on every worker).

    Raises:
      DataError: a bad record, named (the records are all read now).
    """
    shard = self._own_shard(cluster)
    largest = max(self.shard(cluster.num_pipelines, p).num_examples
                  for p in range(cluster.num_pipelines))
    if (shard.record_level or
        (order is not None and streams.exact_shards(order, cluster.num_pipelines))
        or (cluster.num_pipelines > 1 and (order is None or
                                           cluster.local_replicas > 1))
        or not gather.fits_in_memory(self.element_spec, largest) or
        dataset_graph.varies_between_reads(self._parsed(self.paths[:1]))):
      return None
    if order is None:
      return gather.EvalGather(
          strategy=strategy, per_replica_batch_size=per_replica_batch_size,
          preprocess=preprocess, data=self._decoded(
              shard, lambda: self.pipeline_examples(tf.distribute.InputContext())))
    paths = [self.paths[i] for i in shard.files]
    decoded = self._decoded(shard, lambda: self.parsed(
        tf.data.TFRecordDataset(paths), batch_size=256))
    per_step = cluster.local_replicas * per_replica_batch_size

    def ids(start_step):
      stream = shard.train_stream(order, position=start_step * per_step, ids=True)
      return stream.batch(per_step, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return gather.StreamedIdsGather(strategy=strategy, data=decoded,
                                    per_replica_batch_size=per_replica_batch_size,
                                    preprocess=preprocess, ids=ids,
                                    local_replicas=cluster.local_replicas)

  def _decoded(self, shard: Shard, records) -> arrays.ArrayData:
    """`records()`, a dataset of a pipeline's parsed records, as arrays.

    Raises:
      DataError: a record that cannot be read or parsed, named; or a count other
        than the index's.
    """
    try:
      decoded = arrays.read_into_memory(records(), what=self.flag)
    except tf.errors.OpError:
      for path in (self.paths[i] for i in shard.files):
        found = record_files.bad_record(path, parse=self.parsed)
        if found:
          raise DataError(f"{self.flag}: bad record in {found} (found while "
                          "decoding the records into memory, before training; "
                          "--array_input=dataset reads them as it trains)"
                          ) from None
      raise
    if decoded.num_examples != shard.num_examples:
      raise DataError(f"{self.flag}: read {decoded.num_examples} records where the "
                      f"index counts {shard.num_examples}; rewrite the index "
                      "(scripts/make_tfrecords.py --index)")
    return decoded

  def explain_error(self, error, cluster, *, split, step, order=None, position=0,
                    records=0):
    """When the error came out of the input (a corrupt file, or an error in the
    iterator's get-next), looks for the first bad record where this worker was
    reading: training, the blocks from `position` over the call's `records` (and
    the next, which prefetching may have read); evaluation, all of its files."""
    if not (isinstance(error, tf.errors.DataLossError) or
            "IteratorGetNext" in str(error)):
      return None
    shard = self._own_shard(cluster)
    if split == "train":
      paths = shard.files_read(position, records, order)
    else:
      paths = [self.paths[i] for i in shard.files]
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
