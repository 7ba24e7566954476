"""TFRecord files as a task's data: read per input pipeline, ordered by (seed, step).

    train = trainer.data.TFRecords("data/digits/train-*", parse=parse_example)

`parse(serialized) -> (features, labels)` maps one record (or `parse_batch` a
batch of records, which is several times faster: one op per batch, not per
record); the framework does the rest. Each input pipeline (one per worker) reads only its own files when there are
at least as many files as pipelines (file-level sharding: pipeline p of P reads
files p, p+P, ...), and otherwise every file, keeping every P-th record
(record-level sharding).

Training order, a function of (seed, step): in epoch e a pipeline reads its files
in an order permuted by (seed, e), in blocks of `files_per_block` files. A block's
records are interleaved from its files and shuffled in a buffer seeded by (seed,
pipeline, e, block), so the buffer never carries records across blocks. Given the
number of records of each file (from the shards' `dataset.json` index, or counted
once at start), the position of step s (s x the pipeline's batch) falls in a known
epoch and block: a resume starts reading at that block and skips only the records
of that block already trained on. Its cost is at most one block, at any step.
(Record-level sharding has one block per epoch.)

Evaluation reads each pipeline's records once, in file order; `inputs.py` pads the
pipelines to a common number of batches with weight-0 examples.
"""

import dataclasses
import hashlib
import json
import os
import re
import time
from typing import Callable, Optional, Sequence, Union

import tensorflow as tf

from trainer.data.pipeline import count_elements
from trainer.errors import DataError

INDEX_FILE = "dataset.json"  # Records per file (and a data set's facts), per folder.
_ENDLESS = 2**62
_NAMES_SAID = 8  # Files named in the start line; then a count.


@dataclasses.dataclass(frozen=True)
class TFRecords:
  """TFRecord files and how to read one record.

  Attributes:
    files: a glob ("data/train-*"), or a list of paths or globs.
    parse: `serialized record -> (features, labels)`, in-graph (e.g. with
      `tf.io.parse_single_example`); features need fully known shapes.
    parse_batch: instead of `parse`: `[batch] serialized records -> (features,
      labels)` with a leading batch dimension (e.g. with `tf.io.parse_example`).
    files_per_block: files interleaved and shuffled together (see the module
      docstring); a resume re-reads at most one block.
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
    """The first `count` records, parsed and batched."""
    for batch in self._parsed(self.paths).batch(count).take(1):
      return batch
    raise AssertionError("resolve() checked that there are records")

  def identity(self) -> dict:
    """What the files are, for the checkpoint's check that a resume reads the
    same data: their names, sizes and record counts."""
    digest = hashlib.sha256()
    for path, count in zip(self.paths, self.counts):
      digest.update(f"{os.path.basename(path)}:{_size(path)}:{count};".encode())
    return {"examples": self.num_examples, "files": len(self.paths),
            "files_sha256": digest.hexdigest()[:16],
            "files_per_block": self.files_per_block}

  def shard(self, num_pipelines: int, pipeline_id: int) -> "Shard":
    """What input pipeline `pipeline_id` of `num_pipelines` reads."""
    n = len(self.paths)
    if n >= num_pipelines:
      return Shard(self, tuple(range(pipeline_id, n, num_pipelines)), pipeline_id,
                   num_pipelines, record_level=False)
    return Shard(self, tuple(range(n)), pipeline_id, num_pipelines,
                 record_level=True)

  def describe(self, num_pipelines: int, pipeline_id: int) -> str:
    """One line: which files this pipeline reads and how."""
    shard = self.shard(num_pipelines, pipeline_id)
    names = [os.path.basename(self.paths[i]) for i in shard.files]
    names = ", ".join(names[:_NAMES_SAID] + [f"... ({len(names) - _NAMES_SAID} more)"]
                      if len(names) > _NAMES_SAID + 1 else names)
    if shard.record_level:
      return (f"{self.flag}: {len(self.paths)} file(s) < {num_pipelines} input "
              f"pipelines, record-level sharding: pipeline {pipeline_id} reads every "
              f"file and keeps 1 record in {num_pipelines} ({names})")
    return (f"{self.flag}: file-level sharding, input pipeline {pipeline_id} of "
            f"{num_pipelines} reads {len(shard.files)} of {len(self.paths)} files "
            f"({shard.num_examples} records): {names}")


@dataclasses.dataclass(frozen=True)
class Shard:
  """The records one input pipeline reads.

  Attributes:
    records: the TFRecords.
    files: indices of the files it reads (sorted).
    pipeline_id: this input pipeline's index.
    num_pipelines: the number of input pipelines (one per worker).
    record_level: every pipeline reads every file and keeps every
      num_pipelines-th record (fewer files than pipelines).
  """
  records: TFRecords
  files: tuple
  pipeline_id: int
  num_pipelines: int
  record_level: bool

  @property
  def block_size(self) -> int:
    """Files per block (all of them under record-level sharding)."""
    if self.record_level:
      return len(self.files)
    return min(self.records.files_per_block, len(self.files))

  def _kept(self, total: int) -> int:
    """Records this pipeline keeps of `total` read."""
    if not self.record_level:
      return total
    p, shards = self.pipeline_id, self.num_pipelines
    return (total - p + shards - 1) // shards if total > p else 0

  @property
  def num_examples(self) -> int:
    return self._kept(sum(self.records.counts[i] for i in self.files))

  def file_order(self, seed: int, epoch, shuffle: bool):
    """Positions in `files` in epoch `epoch`'s order (int64 tensor)."""
    positions = tf.range(len(self.files), dtype=tf.int64)
    if not shuffle or len(self.files) < 2:
      return positions
    seeds = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.random.experimental.index_shuffle(positions, seeds,
                                                len(self.files) - 1)

  def start(self, position: int, *, seed: int, shuffle: bool) -> tuple:
    """(epoch, block, records of the block to skip) at stream `position`."""
    if self.num_examples == 0:
      raise DataError(f"{self.records.flag}: input pipeline {self.pipeline_id} "
                      "gets no records; write more (or larger) shards")
    epoch, within = divmod(position, self.num_examples)
    if self.record_level:
      return epoch, 0, within
    order = self.file_order(seed, epoch, shuffle).numpy()
    counts = [self.records.counts[self.files[i]] for i in order]
    k = self.block_size
    for block in range(-(-len(counts) // k)):
      size = sum(counts[block * k:(block + 1) * k])
      if within < size:
        return epoch, block, within
      within -= size
    raise AssertionError("position within the epoch is past its records")

  def block_files(self, epoch: int, block: int, *, seed: int,
                  shuffle: bool) -> list:
    """Paths of the files of block `block` of epoch `epoch`."""
    k = self.block_size
    order = self.file_order(seed, epoch, shuffle).numpy()[block * k:(block + 1) * k]
    return [self.records.paths[self.files[i]] for i in order]

  def files_read(self, position: int, records: int, *, seed: int,
                 shuffle: bool) -> list:
    """The files of every block the stream reads from `position` over `records`
    records, and of the block after (prefetched): where a bad record met in a
    loop call can be. At most every file of the pipeline, each once."""
    paths, end = [], position + records
    while True:
      epoch, block, skip = self.start(position, seed=seed, shuffle=shuffle)
      block_paths = self.block_files(epoch, block, seed=seed, shuffle=shuffle)
      paths += [p for p in block_paths if p not in paths]
      if position > end or len(paths) >= len(self.files):
        return paths
      position += self._kept(sum(self.records.counts[self.records.paths.index(p)]
                                 for p in block_paths)) - skip

  def _block(self, paths, block_seed, *, shuffle: bool, buffer: int):
    """One block's serialized records: interleaved, sharded, shuffled."""
    dataset = tf.data.Dataset.from_tensor_slices(paths).interleave(
        tf.data.TFRecordDataset, cycle_length=self.block_size, block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if self.record_level:
      dataset = dataset.shard(self.num_pipelines, self.pipeline_id)
    if shuffle:
      # A tensor seed: tf.data pairs it with the graph-level seed, which must then
      # not be 0 (get_seed compares the pair to (0, 0) in Python). This sets it
      # in the function being traced only; the order depends on block_seed alone.
      tf.compat.v1.set_random_seed(1)
      dataset = dataset.shuffle(buffer, seed=block_seed)
    return dataset

  def train_stream(self, *, seed: int, shuffle: bool, buffer: int,
                   position: int) -> tf.data.Dataset:
    """The endless stream of serialized records from `position` on."""
    paths = tf.constant([self.records.paths[i] for i in self.files])
    k, num_blocks = self.block_size, -(-len(self.files) // self.block_size)

    def epoch_records(epoch, first_block=0):
      ordered = tf.gather(paths, self.file_order(seed, epoch, shuffle))

      def block_records(block):
        # Wrapping int64 arithmetic: a seed per (seed, pipeline, epoch, block).
        block_seed = ((tf.constant(seed, tf.int64) * 1_000_003 + self.pipeline_id)
                      * 1_000_003 + epoch) * 1_000_003 + block
        return self._block(ordered[block * k:(block + 1) * k], block_seed,
                           shuffle=shuffle, buffer=buffer)

      return tf.data.Dataset.range(first_block, num_blocks).flat_map(block_records)

    epoch, block, skip = self.start(position, seed=seed, shuffle=shuffle)
    stream = epoch_records(tf.constant(epoch, tf.int64), block).skip(skip)
    stream = stream.concatenate(
        tf.data.Dataset.range(epoch + 1, _ENDLESS).flat_map(epoch_records))
    return stream

  def eval_records(self) -> tf.data.Dataset:
    """Every record of this pipeline once, parsed, in file order."""
    paths = [self.records.paths[i] for i in self.files]
    return self.records.parsed(self._block(paths, None, shuffle=False, buffer=1),
                               batch_size=256)


def _size(path: str) -> int:
  return tf.io.gfile.stat(path).length


def glob_files(files, flag: str) -> list:
  """The sorted files a glob (or list of globs) names.

  Raises:
    DataError: a pattern matches no file.
  """
  patterns = [files] if isinstance(files, str) else list(files)
  paths = []
  for pattern in patterns:
    try:
      matched = sorted(tf.io.gfile.glob(pattern))
    except tf.errors.OpError as e:
      raise DataError(f"{flag}={pattern}: cannot list files "
                      f"({error_line(e)})") from None
    matched = [p for p in matched if not tf.io.gfile.isdir(p)
               and os.path.basename(p) != INDEX_FILE]
    if not matched:
      raise DataError(f"{flag}={pattern}: no file matches")
    paths += matched
  return paths


def error_line(error: Exception) -> str:
  """TensorFlow's error message without its function and op decorations."""
  message = getattr(error, "message", None) or str(error)
  message = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", message)
  message = re.sub(r"\s*\[\[\{\{node [^]]*\]\]", "", message)
  message = re.sub(r"\s*\[Op:[^]]*\]( name: .*)?", "", message)
  message = re.sub(r"Error in user-defined function passed to \S+ transformation "
                   r"with iterator: \S+: ", "", message)
  message = re.sub(r"assertion failed: \[(.*)\]$", r"\1", message.strip())
  message = message.replace("Name: <unknown>, ", "")  # parse_example's.
  return " ".join(message.split())[:300]


def read_index(paths) -> Optional[list]:
  """Records per file from each folder's dataset.json, or None when a file is not
  in an index or its size differs from the index's (a stale index)."""
  indexes, counts = {}, []
  for path in paths:
    folder = os.path.dirname(path)
    if folder not in indexes:
      indexes[folder] = read_index_file(folder)
    try:
      entry = indexes[folder]["files"][os.path.basename(path)]
      if entry["bytes"] != _size(path):
        return None
      counts.append(int(entry["records"]))
    except (TypeError, KeyError, ValueError):  # No index, or not one we wrote.
      return None
  return counts


def read_index_file(folder: str) -> Optional[dict]:
  """A folder's dataset.json, or None if it has none (or it is unreadable)."""
  path = os.path.join(folder, INDEX_FILE)
  try:
    with tf.io.gfile.GFile(path) as f:
      index = json.load(f)
  except (tf.errors.OpError, ValueError):
    return None
  return index if isinstance(index, dict) else None


def count_records(path: str, *, flag: str) -> int:
  """Reads a file to count its records.

  Raises:
    DataError: naming the file and the first corrupt record.
  """
  try:
    return count_elements(tf.data.TFRecordDataset(path))
  except tf.errors.OpError:
    raise DataError(f"{flag}: {bad_record(path, records=None)}") from None


def bad_record(path: str, *, records: Optional[TFRecords]) -> Optional[str]:
  """"FILE: record N: what is wrong" for the first record of `path` that cannot be
  read (or parsed by `records`, if given), or None if every record is fine."""
  dataset = tf.data.TFRecordDataset(path)
  if records is not None:
    dataset = records.parsed(dataset)
  try:
    count_elements(dataset)  # Fast: in-graph.
    return None
  except tf.errors.OpError:
    pass
  good = 0
  try:
    for _ in dataset:  # Again, one record at a time, to say which one.
      good += 1
  except tf.errors.OpError as e:
    return f"{path}: record {good}: {error_line(e)}"
  return None


def find_bad_record(records: TFRecords, paths) -> Optional[str]:
  """The first bad record in `paths` (see bad_record), or None."""
  for path in paths:
    found = bad_record(path, records=records)
    if found:
      return found
  return None


def resolve(records: TFRecords, *, what: str) -> tuple:
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
    raise DataError(f"{flag}: files_per_block={records.files_per_block}, must be >= 1")
  paths = glob_files(records.files, flag)
  note = None
  counts = read_index(paths)
  if counts is None:
    started = time.monotonic()
    counts = [count_records(path, flag=flag) for path in paths]
    note = (f"{flag}: counted {sum(counts)} records in {len(paths)} file(s) "
            f"({time.monotonic() - started:.1f} s); scripts/make_tfrecords.py "
            f"--index='{records.files if isinstance(records.files, str) else '...'}' "
            "writes an index that skips this")
  records = dataclasses.replace(records, files=tuple(paths), counts=tuple(counts),
                                flag=flag, note=note)
  if not records.num_examples:
    raise DataError(f"{flag}: the {len(paths)} file(s) hold no records")
  first = next(path for path, count in zip(paths, counts) if count)
  try:
    for _ in records._parsed([first]).take(1):  # pylint: disable=protected-access
      pass
  except (tf.errors.OpError, ValueError, TypeError) as e:
    raise DataError(f"{flag}: {first}: record 0: {error_line(e)}") from None
  spec = records.element_spec
  if not (isinstance(spec, tuple) and len(spec) == 2):
    raise DataError(f"{flag}: parse must return (features, labels), got {spec}")
  if not all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec)):
    raise DataError(f"{flag}: parse must return tensors of known shapes (e.g. "
                    f"tf.ensure_shape), got {spec}")
  return records


def write_index(folder: str, paths, **facts) -> dict:
  """Writes (or updates) `folder`/dataset.json with the records of `paths`.

  Args:
    folder: the shards' folder.
    paths: files in it to count and list.
    **facts: more keys for the index (e.g. num_classes, scale).

  Returns:
    The index.
  """
  index = read_index_file(folder) or {}
  files = index.setdefault("files", {})
  for path in paths:
    files[os.path.basename(path)] = {"records": count_records(path, flag=path),
                                     "bytes": _size(path)}
  index.update(facts)
  temporary = os.path.join(folder, f".{INDEX_FILE}.tmp")
  with tf.io.gfile.GFile(temporary, "w") as f:
    json.dump(index, f, indent=1, sort_keys=True)
  tf.io.gfile.rename(temporary, os.path.join(folder, INDEX_FILE), overwrite=True)
  return index
