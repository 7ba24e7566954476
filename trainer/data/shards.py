"""What one input shard reads of a set of TFRecord files, in (seed, step) order.

A shard is one of n parts of the files: an input shard of training's order
(elastic.py), or one worker's part of an eval split. With at least as many files
as shards, shard v of n reads files v, v+n, ... (file-level sharding); with
fewer, it reads every file and keeps every n-th record (record-level sharding).

In epoch e a shard reads its files in an order permuted by (seed, e), in blocks of
its share of `files_per_block` files (elastic.share: the shards of a run share a
block of that many files). A block's records are interleaved from its files and
shuffled in the shard's share of the shuffle buffer, seeded by (seed, shard, e,
block), so the buffer never carries records across blocks. Given the records of
each file, the position of step s (s x the shard's examples per step) falls in a
known epoch and block: a resume starts reading at that block and skips only the
records of that block already trained on. Its cost is at most one block per
shard, at any step. (Record-level sharding has one block per epoch.)
"""

import dataclasses

import tensorflow as tf

from trainer.data.base import Order
from trainer.data.elastic import share
from trainer.errors import DataError

_ENDLESS = 2**62


@dataclasses.dataclass(frozen=True)
class Shard:
  """The records one shard of the files reads.

  Attributes:
    paths: every file of the set, sorted.
    counts: the records of each file.
    files: indices (into `paths`) of the files this shard reads.
    shard_id: this shard's index.
    num_shards: the number of shards.
    files_per_block: files interleaved and shuffled together by all the shards
      (each shard's block holds its share of them).
    flag: what names the files in errors, e.g. "--train_files".
  """
  paths: tuple
  counts: tuple
  files: tuple
  shard_id: int
  num_shards: int
  files_per_block: int
  flag: str

  @classmethod
  def of(cls, *, paths, counts, num_shards: int, shard_id: int,
         files_per_block: int, flag: str) -> "Shard":
    """Shard `shard_id` of `num_shards`'s part of the files."""
    n = len(paths)
    files = tuple(range(shard_id, n, num_shards) if n >= num_shards else range(n))
    return cls(tuple(paths), tuple(counts), files, shard_id, num_shards,
               files_per_block, flag)

  @property
  def record_level(self) -> bool:
    """Every shard reads every file and keeps every num_shards-th record."""
    return len(self.paths) < self.num_shards

  @property
  def block_size(self) -> int:
    """Files per block (all of them under record-level sharding)."""
    if self.record_level:
      return len(self.files)
    return min(share(self.files_per_block, self.num_shards), len(self.files))

  def _kept(self, total: int) -> int:
    """Records this shard keeps of `total` read."""
    if not self.record_level:
      return total
    v, shards = self.shard_id, self.num_shards
    return (total - v + shards - 1) // shards if total > v else 0

  @property
  def num_examples(self) -> int:
    return self._kept(sum(self.counts[i] for i in self.files))

  def file_order(self, order: Order, epoch):
    """Positions in `files` in epoch `epoch`'s order (int64 tensor)."""
    positions = tf.range(len(self.files), dtype=tf.int64)
    if not order.shuffle or len(self.files) < 2:
      return positions
    seeds = tf.stack([tf.constant(order.seed, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.random.experimental.index_shuffle(positions, seeds,
                                                len(self.files) - 1)

  def start(self, position: int, order: Order) -> tuple:
    """(epoch, block, records of the block to skip) at stream `position`."""
    if self.num_examples == 0:
      raise DataError(f"{self.flag}: input shard {self.shard_id} of "
                      f"{self.num_shards} gets no records; write more (or larger) "
                      "files")
    epoch, within = divmod(position, self.num_examples)
    if self.record_level:
      return epoch, 0, within
    ordered = self.file_order(order, epoch).numpy()
    counts = [self.counts[self.files[i]] for i in ordered]
    k = self.block_size
    for block in range(-(-len(counts) // k)):
      size = sum(counts[block * k:(block + 1) * k])
      if within < size:
        return epoch, block, within
      within -= size
    raise AssertionError("position within the epoch is past its records")

  def block_files(self, epoch: int, block: int, order: Order) -> list:
    """Paths of the files of block `block` of epoch `epoch`."""
    k = self.block_size
    ordered = self.file_order(order, epoch).numpy()[block * k:(block + 1) * k]
    return [self.paths[self.files[i]] for i in ordered]

  def files_read(self, position: int, records: int, order: Order) -> list:
    """The files of every block the stream reads from `position` over `records`
    records, and of the block after (prefetched): where a bad record met in a
    loop call can be. At most every file of the shard, each once."""
    paths, end = [], position + records
    while True:
      epoch, block, skip = self.start(position, order)
      block_paths = self.block_files(epoch, block, order)
      paths += [p for p in block_paths if p not in paths]
      if position > end or len(paths) >= len(self.files):
        return paths
      position += self._kept(sum(self.counts[self.paths.index(p)]
                                 for p in block_paths)) - skip

  @property
  def offsets(self) -> tuple:
    """Where each of this shard's files starts among its records, in `files`
    order (the ids `train_stream(..., ids=True)` yields)."""
    starts = [0]
    for i in self.files[:-1]:
      starts.append(starts[-1] + self.counts[i])
    return tuple(starts)

  def _block(self, sources, block_seed, *, shuffle: bool, buffer: int, read):
    """One block's records (`read` of each of its `sources`): interleaved,
    sharded, shuffled."""
    if read is _id_range:
      # The ids the interleave below would give, computed at once: element by
      # element, tf.data made them at a fifth of the speed training read them.
      dataset = tf.data.Dataset.from_tensor_slices(_interleaved_ids(sources))
    else:
      dataset = tf.data.Dataset.from_tensor_slices(sources).interleave(
          read, cycle_length=self.block_size, block_length=1,
          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if self.record_level:
      dataset = dataset.shard(self.num_shards, self.shard_id)
    if shuffle:
      # A tensor seed: tf.data pairs it with the graph-level seed, which must then
      # not be 0 (get_seed compares the pair to (0, 0) in Python). This sets it
      # in the function being traced only; the order depends on block_seed alone.
      tf.compat.v1.set_random_seed(1)
      dataset = dataset.shuffle(buffer, seed=block_seed)
    return dataset

  def train_stream(self, order: Order, *, position: int, ids: bool = False,
                   first_id: int = 0) -> tf.data.Dataset:
    """The endless stream of serialized records from `position` on; or (`ids`)
    of their ids, `first_id + offsets[file] + record`, in the same order (an
    interleave and a seeded shuffle order elements the same whatever they hold).
    The shuffle buffer holds this shard's share of `order.buffer`."""
    if ids:
      sources = tf.constant([[first_id + start, first_id + start + self.counts[i]]
                             for start, i in zip(self.offsets, self.files)],
                            tf.int64)
      read = _id_range
    else:
      sources = tf.constant([self.paths[i] for i in self.files])
      read = tf.data.TFRecordDataset
    k, num_blocks = self.block_size, -(-len(self.files) // self.block_size)

    def block_records(index):
      # Block `index` of the stream: one flat_map over every epoch's blocks.
      epoch, block = index // num_blocks, index % num_blocks
      ordered = tf.gather(sources, self.file_order(order, epoch))
      # Wrapping int64 arithmetic: a seed per (seed, shard, epoch, block).
      block_seed = ((tf.constant(order.seed, tf.int64) * 1_000_003 +
                     self.shard_id) * 1_000_003 + epoch) * 1_000_003 + block
      return self._block(ordered[block * k:(block + 1) * k], block_seed,
                         shuffle=order.shuffle,
                         buffer=share(order.buffer, self.num_shards), read=read)

    epoch, block, skip = self.start(position, order)
    return tf.data.Dataset.range(epoch * num_blocks + block, _ENDLESS).flat_map(
        block_records).skip(skip)

  def eval_stream(self) -> tf.data.Dataset:
    """Every serialized record of this shard once."""
    return self._block([self.paths[i] for i in self.files], None, shuffle=False,
                       buffer=1, read=tf.data.TFRecordDataset)


def _interleaved_ids(spans):
  """The ids of files' records ([start, end) per file, `spans`) in the order an
  interleave with one record per file per turn reads them (cycle_length: every
  file): record 0 of each file, then record 1 of each that has one, ..."""
  spans = tf.convert_to_tensor(spans, tf.int64)
  starts, counts = spans[:, 0], spans[:, 1] - spans[:, 0]
  turn = tf.range(tf.reduce_max(counts))[:, None]  # [turns, 1]
  kept = tf.reshape(turn < counts[None, :], [-1])
  return tf.boolean_mask(tf.reshape(starts[None, :] + turn, [-1]), kept)


def _id_range(span):
  """The ids [span[0], span[1]) of one file's records."""
  return tf.data.Dataset.range(span[0], span[1])
