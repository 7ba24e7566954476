"""TFRecord input (trainer/data/records.py, shards.py): sharding, the (seed, step)
order and its resume arithmetic, exact evaluation, bad records. In-process."""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

import user_tasks
from trainer import data
from trainer.data import records
from trainer.distribute.cluster import Cluster
from trainer.errors import DataError

from presets import train

RECORDS_PER_FILE = (7, 0, 12, 5, 9, 3)  # Uneven, one file empty.


def _parse(serialized):
  value = tf.io.parse_single_example(
      serialized, {"v": tf.io.FixedLenFeature([], tf.int64)})["v"]
  return value, value


def _example(value):
  return tf.train.Example(features=tf.train.Features(feature={
      "v": tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
  })).SerializeToString()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """Six files of consecutive values 0..35: value = the record's identity."""
  folder = tmp_path_factory.mktemp("records")
  value = 0
  for i, count in enumerate(RECORDS_PER_FILE):
    with tf.io.TFRecordWriter(str(folder / f"part-{i}.tfrecord")) as writer:
      for _ in range(count):
        writer.write(_example(value))
        value += 1
  return str(folder)


def _records(files, parse=_parse, **kwargs):
  return data.as_task_data(
      records.TFRecords(os.path.join(files, "part-*"), parse=parse, **kwargs),
      what="test")


def _values(stream, count):
  """The values of a shard's stream of serialized records."""
  return [int(v) for v, _ in records.TFRecords("", parse=_parse).parsed(
      stream.take(count))]


def test_counts_come_from_the_index_or_are_counted(files, tmp_path):
  counted = _records(files)
  assert counted.counts == RECORDS_PER_FILE and "counted 36 records" in counted.note
  data.write_index(files, counted.paths)
  indexed = _records(files)
  assert indexed.counts == RECORDS_PER_FILE and indexed.note is None
  os.remove(os.path.join(files, data.INDEX_FILE))


@pytest.mark.parametrize("num_pipelines", [1, 2, 3, 6, 8])
def test_pipelines_partition_the_records(files, num_pipelines):
  source = _records(files)
  seen = []
  for p in range(num_pipelines):
    shard = source.shard(num_pipelines, p)
    values = sorted(int(v) for v, _ in source.parsed(shard.eval_stream()))
    assert len(values) == shard.num_examples
    seen += values
    if num_pipelines <= len(RECORDS_PER_FILE):  # File-level: its own files only.
      assert shard.files == tuple(range(p, len(RECORDS_PER_FILE), num_pipelines))
  assert sorted(seen) == list(range(36))  # Every record exactly once.


@pytest.mark.parametrize("num_pipelines, shuffle", [(1, True), (2, True), (8, True),
                                                    (2, False)])
def test_a_stream_started_anywhere_continues_the_full_stream(files, num_pipelines,
                                                             shuffle):
  source = _records(files, files_per_block=2)
  epoch_values = [[], [], []]  # Each epoch's records over all pipelines.
  for p in range(num_pipelines):
    shard = source.shard(num_pipelines, p)
    size = shard.num_examples
    total = 3 * size + 10
    order = data.Order(seed=5, shuffle=shuffle, buffer=4)
    full = _values(shard.train_stream(order, position=0), total)
    epochs = [full[i * size:(i + 1) * size] for i in range(3)]
    assert (epochs[0] != epochs[1]) == shuffle  # Each epoch its own order.
    for values, epoch in zip(epoch_values, epochs):
      values += epoch
    for position in (1, 6, size - 1, size, size + 3, 2 * size + 5) if p in (
        0, num_pipelines - 1) else ():
      resumed = shard.train_stream(order, position=position)
      assert _values(resumed, total - position) == full[position:], position
  # Each epoch, the pipelines together read every record exactly once.
  assert all(sorted(values) == list(range(36)) for values in epoch_values)


def _worker_parts(source, order, *, pipelines, start_step, count):
  """[worker][step] features that each of `pipelines` workers reads of `count`
  global batches from `start_step` on."""
  return [[features.numpy().tolist() for features, *_ in source.batches(
      source.pipeline_stream(order, pipelines=pipelines, pipeline_id=w,
                             start_step=start_step),
      order.global_batch_size // pipelines).take(count)] for w in range(pipelines)]


def _global_batches(source, order, *, pipelines, start_step, count):
  """Their global batches: each worker's part of a step, worker 0's first."""
  return [sum(parts, []) for parts in zip(*_worker_parts(
      source, order, pipelines=pipelines, start_step=start_step, count=count))]


@pytest.mark.parametrize("input_shards, batch", [(2, 4), (3, 6)])
def test_any_worker_count_that_shares_the_input_shards_reads_the_same_steps(
    files, input_shards, batch):
  """Global step S holds the same records read by one process or by each worker
  its own input shards, from the start or resumed at S: a run that grows or
  shrinks reads what a straight run reads. Each worker reads only its shards'
  files."""
  source = _records(files, files_per_block=2)
  order = data.Order(seed=2, shuffle=True, buffer=5, global_batch_size=batch,
                     input_shards=input_shards)
  straight = [features.numpy().tolist() for features, _ in source.host_batches(
      order, num_replicas=1, start_step=0, count=20)]
  assert straight[0] != straight[1] and len(straight[0]) == batch
  starts = np.cumsum((0,) + RECORDS_PER_FILE)  # A record's value: its identity.
  for pipelines in (p for p in (1, 2, 3) if input_shards % p == 0):
    assert _global_batches(source, order, pipelines=pipelines, start_step=0,
                           count=20) == straight
    assert _global_batches(source, order, pipelines=pipelines, start_step=13,
                           count=7) == straight[13:]
    parts = _worker_parts(source, order, pipelines=pipelines, start_step=0,
                          count=20)
    for worker, part in enumerate(parts):
      mine = input_shards // pipelines
      files_read = {i for i in range(len(RECORDS_PER_FILE))
                    if worker * mine <= i % input_shards < (worker + 1) * mine}
      assert {int(np.searchsorted(starts, v, side="right")) - 1
              for step in part for v in step} <= files_read


@pytest.mark.parametrize("input_shards", [2, 8])
def test_a_pipeline_function_is_read_the_same_by_any_worker_count_too(input_shards):
  source = data.as_task_data(user_tasks.PipelineQuadratic(hidden=8).train_data(),
                             what="test")
  order = data.Order(seed=2, shuffle=True, buffer=50, global_batch_size=16,
                     input_shards=input_shards)
  straight = [features.numpy().tolist() for features, _ in source.host_batches(
      order, num_replicas=1, start_step=3, count=4)]
  for pipelines in (p for p in (2, 4, 8) if input_shards % p == 0):
    assert _global_batches(source, order, pipelines=pipelines, start_step=3,
                           count=4) == straight


def test_the_seed_changes_the_order(files):
  shard = _records(files).shard(1, 0)
  first, second = (_values(shard.train_stream(
      data.Order(seed=seed, shuffle=True, buffer=8), position=0), 36)
                    for seed in (1, 2))
  assert first != second and sorted(first) == sorted(second)


def test_resume_reads_at_most_one_block(files):
  shard = _records(files, files_per_block=2).shard(1, 0)
  order = data.Order(seed=3, shuffle=True)
  epoch, block, skip = shard.start(36 * 4 + 20, order)
  assert epoch == 4
  block_files = shard.block_files(epoch, block, order)
  block_records = sum(RECORDS_PER_FILE[int(p.rsplit("-", 1)[1].split(".")[0])]
                      for p in block_files)
  assert skip < block_records  # Only the block's records already trained on.


def test_bad_files_are_one_line_naming_the_file(files, tmp_path):
  with pytest.raises(DataError, match=r"^test=.*nothing-\*: no file matches$"):
    data.as_task_data(records.TFRecords(str(tmp_path / "nothing-*"), parse=_parse),
                      what="test")
  corrupt = tmp_path / "corrupt.tfrecord"
  with tf.io.TFRecordWriter(str(corrupt)) as writer:
    for value in range(5):
      writer.write(_example(value))
  raw = bytearray(corrupt.read_bytes())
  raw[len(raw) // 2] ^= 0xFF
  corrupt.write_bytes(bytes(raw))
  with pytest.raises(DataError, match=r"corrupt.tfrecord: record 2: corrupted record"):
    data.as_task_data(records.TFRecords(str(corrupt), parse=_parse), what="test")
  unknown = lambda s: (tf.io.parse_tensor(s, tf.int64), 0)  # noqa: E731
  with pytest.raises(DataError, match="part-0.tfrecord: record 0: "):
    _records(files, parse=unknown)


def test_a_pipeline_function_task_evaluates_every_example_once(tmp_path):
  results = train(model_dir=str(tmp_path / "run"), cpu_devices=4,
                  per_replica_batch_size=4, train_steps=20, mode="train_and_eval",
                  learning_rate=0.01, summaries=False,
                  task=user_tasks.PipelineQuadratic(hidden=8))
  assert results["eval"]["examples"] == 77  # 5 global batches of 16, 3 padded.
  assert results["replica_batches"] == {f"replica_{i}": 20 for i in range(4)}


def test_a_pipeline_function_task_on_two_replicas_matches_one_device(tmp_path):
  def weights(devices):
    train(model_dir=str(tmp_path / f"d{devices}"), cpu_devices=devices,
          global_batch_size=16, train_steps=15, learning_rate=0.05, optimizer="sgd",
          summaries=False, shuffle=False, task=user_tasks.PipelineQuadratic(hidden=8))
    reader = tf.train.load_checkpoint(str(tmp_path / f"d{devices}" / "checkpoints"))
    return {k: reader.get_tensor(k) for k, _ in tf.train.list_variables(
        str(tmp_path / f"d{devices}" / "checkpoints")) if k.startswith("model/")}

  one, two = weights(1), weights(2)
  for key in one:
    np.testing.assert_allclose(one[key], two[key], atol=1e-5, err_msg=key)


def test_records_identity_changes_with_the_files(files):
  source = _records(files)
  other = dataclasses.replace(source, counts=(7, 0, 12, 5, 9, 4))
  assert source.identity()["files_sha256"] != other.identity()["files_sha256"]


def test_replicas_get_consecutive_batches_of_the_stream_as_replay_reads_them(files):
  source = _records(files)
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  order = data.Order(global_batch_size=8, seed=2, shuffle=True, buffer=8)
  distributed = source.train_input(strategy, Cluster(num_replicas=2), order,
                                   start_step=5, preprocess=lambda f: f)
  values, *_ = next(iter(distributed))
  per_replica = [v.numpy() for v in strategy.experimental_local_results(values)]
  assert [len(v) for v in per_replica] == [4, 4]
  (replayed, _), = source.host_batches(order, num_replicas=2, start_step=5, count=1)
  np.testing.assert_array_equal(np.concatenate(per_replica), replayed.numpy())
  stream = source.shard(1, 0).train_stream(order, position=0)
  assert list(replayed.numpy()) == _values(stream, 48)[40:48]  # Step 5 of 8 each.


def test_a_bad_record_is_looked_for_in_every_block_a_loop_call_read(files):
  shard = _records(files, files_per_block=2).shard(1, 0)
  order = data.Order(seed=3, shuffle=True)
  one_record = shard.files_read(0, 1, order)
  assert len(one_record) == 4  # Its block, and the next (prefetched).
  epoch = shard.files_read(0, 36, order)
  assert sorted(epoch) == sorted(shard.paths)  # Every file, once.


@pytest.mark.parametrize("num_pipelines", [1, 2, 3])
def test_the_id_stream_orders_records_as_the_record_stream(files, num_pipelines):
  # Decoded into memory, records are read by ids: each id must be the record the
  # stream of records gives at that position, from any start.
  starts = np.cumsum((0,) + RECORDS_PER_FILE)  # A record's value: its identity.
  order = data.Order(global_batch_size=4, seed=3, shuffle=True, buffer=5)
  for pipeline in range(num_pipelines):
    shard = _records(files).shard(num_pipelines, pipeline)
    held = [v for i in shard.files for v in range(starts[i], starts[i + 1])]
    for position in (0, 7, 40):
      ids = shard.train_stream(order, position=position, ids=True).take(50)
      assert [held[int(i)] for i in ids] == _values(
          shard.train_stream(order, position=position), 50)


def test_records_are_held_in_memory_only_where_parse_reads_the_same_twice(files):
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  order = data.Order(global_batch_size=4, seed=3, shuffle=True, buffer=5)

  def noisy(serialized):
    value, label = _parse(serialized)
    return value + tf.random.uniform([], maxval=2, dtype=tf.int64), label

  held = {name: _records(files, parse=parse).gather_input(
      strategy, Cluster(num_replicas=1), order, per_replica_batch_size=4,
      preprocess=lambda f: f) is not None
          for name, parse in (("plain", _parse), ("noisy", noisy))}
  assert held == {"plain": True, "noisy": False}
