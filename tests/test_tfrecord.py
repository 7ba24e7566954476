"""--dataset=tfrecord end to end: shards written by scripts/make_tfrecords.py train
like the arrays, two workers read their own shards, resume is bit-exact, and bad
files are one line naming the file."""

import importlib.util
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import (REPO, assert_bit_identical, checkpoint_values, read_results,
                      run_cli)
from test_multi_worker import FLAGS as WORKER_FLAGS
from test_multi_worker import assert_read_as_one_process_straight, launch
from trainer import data

_spec = importlib.util.spec_from_file_location(
    "make_tfrecords", os.path.join(REPO, "scripts", "make_tfrecords.py"))
make_tfrecords = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_tfrecords)

FLAGS = ["--model=mlp", "--deterministic", "--mode=train_and_eval", "--seed=1"]


def _records_flags(folder):
  return ["--dataset=tfrecord", f"--train_files={folder}/train-*",
          f"--eval_files={folder}/test-*"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
  """{number of shards: folder} of digits in TFRecord files."""
  root = tmp_path_factory.mktemp("shards")
  folders = {}
  for count in (4, 8):
    folders[count] = str(root / f"digits{count}")
    assert make_tfrecords.main(["--dataset=digits", f"--out={folders[count]}",
                                f"--shards={count}"]) == 0
  return folders


def test_make_tfrecords_writes_shards_and_an_index(shards, capsys):
  names = sorted(os.listdir(shards[8]))
  assert names[0] == "dataset.json" and len(names) == 17
  assert names[1:3] == ["test-00000-of-00008.tfrecord", "test-00001-of-00008.tfrecord"]
  # Refuses to write over them, in one line.
  assert make_tfrecords.main(["--dataset=digits", f"--out={shards[8]}"]) == 2
  assert capsys.readouterr().err == (f"make_tfrecords.py: error: --out={shards[8]}: "
                                     "already holds 16 .tfrecord file(s); pass "
                                     "--overwrite or another folder\n")


def test_shards_train_like_arrays_and_resume_bit_exact(shards, tmp_path):
  common = [*FLAGS, "--cpu_devices=2", "--train_steps=200"]
  arrays, files = str(tmp_path / "arrays"), str(tmp_path / "files")
  assert run_cli(*common, f"--model_dir={arrays}").returncode == 0
  straight = run_cli(*common, *_records_flags(shards[8]), f"--model_dir={files}")
  assert straight.returncode == 0, straight.stderr
  assert "reads 8 of 8 files (1437 records)" in straight.stdout
  expected, results = read_results(arrays), read_results(files)
  assert results["eval"]["examples"] == 360  # Every test record once.
  assert abs(results["eval"]["accuracy"] - expected["eval"]["accuracy"]) <= 0.01
  assert results["replica_batches"] == {"replica_0": 200, "replica_1": 200}

  split = str(tmp_path / "split")
  args = [a for a in common if a != "--train_steps=200"] + _records_flags(shards[8])
  assert run_cli(*args, "--train_steps=90", f"--model_dir={split}").returncode == 0
  resumed = run_cli(*args, "--train_steps=200", f"--model_dir={split}")
  assert resumed.returncode == 0 and "resuming at step 90" in resumed.stdout
  assert_bit_identical(files, split)
  # The records decoded into memory and gathered in-graph (the default, as they
  # fit) train exactly as the records read by tf.data as it trains.
  streamed = str(tmp_path / "streamed")
  assert run_cli(*common, *_records_flags(shards[8]), "--array_input=dataset",
                 f"--model_dir={streamed}").returncode == 0
  assert_bit_identical(files, streamed)
  assert read_results(streamed)["eval"] == results["eval"]


def _worker_files(output):
  """{worker: shard names it read}, from each worker's input line."""
  return {int(worker): set(names.split(", ")) for worker, names in re.findall(
      r"\[worker (\d)\] input: --train_files: file-level sharding, input pipeline "
      r"\d of 2 reads 2 of 4 files \(\d+ records\), input shard\(s\) \d-\d of 4: "
      r"(.*)", output)}


@pytest.mark.slow
def test_two_workers_read_their_own_shards_and_resume_bit_exact(shards, tmp_path):
  args = [*FLAGS, *_records_flags(shards[4]), "--per_replica_batch_size=16",
          "--checkpoint_every=20"]
  straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
  result = launch(straight, *args, "--train_steps=60")
  assert result.returncode == 0, result.stdout[-3000:]
  # The run's 4 input shards (one file each: 4 files, a global batch of 32), 2
  # per worker.
  read = _worker_files(result.stdout)
  assert read == {0: {"train-00000-of-00004.tfrecord", "train-00001-of-00004.tfrecord"},
                  1: {"train-00002-of-00004.tfrecord", "train-00003-of-00004.tfrecord"}}
  results = read_results(straight)
  assert results["num_workers"] == 2
  assert results["replica_batches"] == {"replica_0": 60, "replica_1": 60}
  assert results["replica_examples"] == {"replica_0": 960, "replica_1": 960}
  assert results["eval"]["examples"] == 360  # Each worker its 2 test shards.

  assert launch(split, *args, "--train_steps=30").returncode == 0
  resumed = launch(split, *args, "--train_steps=60")
  assert resumed.returncode == 0 and "resuming at step 30" in resumed.stdout
  assert_bit_identical(straight, split)
  # Each worker's records decoded into memory (the default) train as they do read
  # by tf.data as training goes.
  streamed = str(tmp_path / "streamed")
  assert launch(streamed, *args, "--train_steps=60",
                "--array_input=dataset").returncode == 0
  assert_bit_identical(straight, streamed)


@pytest.mark.slow
def test_files_read_by_2_workers_or_a_run_that_grows_are_one_process_s(shards,
                                                                      tmp_path):
  """One process (2 replicas) and 2 workers read the same records at every step,
  straight or changing from one to the other (1 process, then 2 workers, then 1
  process): the same weights as one process straight."""
  args = [*WORKER_FLAGS, *FLAGS, *_records_flags(shards[4]), "--mode=train",
          "--per_replica_batch_size=16", "--checkpoint_every=20",
          "--summaries=false"]
  one = [a for a in args if a != "--cpu_devices=1"] + ["--cpu_devices=2"]
  assert_read_as_one_process_straight(
      tmp_path, steps=60,
      one_process=lambda model_dir, *extra: run_cli(
          *one, f"--model_dir={model_dir}", *extra),
      two_workers=lambda model_dir, *extra: launch(model_dir, *args, *extra))


def _rewrite(folder, name, change):
  """Rewrites one shard record by record (`change(index, record) -> record`) and
  its index entry, as a broken converter would have written them."""
  path = os.path.join(folder, name)
  rewritten = [change(i, r.numpy()) for i, r in enumerate(
      tf.data.TFRecordDataset(path))]
  with tf.io.TFRecordWriter(path) as writer:
    for record in rewritten:
      writer.write(record)
  data.write_index(folder, [path])


def _corrupt(folder, name):
  """Flips a byte mid-file: the size, and so the index entry, still match."""
  path = os.path.join(folder, name)
  with open(path, "rb") as f:
    raw = bytearray(f.read())
  raw[len(raw) // 2] ^= 0xFF
  with open(path, "wb") as f:
    f.write(bytes(raw))


def _label(value):
  def change(index, record):
    if index != 100:
      return record
    example = tf.train.Example.FromString(record)
    example.features.feature["image/class/label"].int64_list.value[:] = [value]
    return example.SerializeToString()
  return change


def _without_label(index, record):
  if index != 100:
    return record
  example = tf.train.Example.FromString(record)
  del example.features.feature["image/class/label"]
  return example.SerializeToString()


@pytest.mark.parametrize("damage, message", [
    (lambda d: _rewrite(d, "train-00002-of-00004.tfrecord", _label(12)),
     "train-00002-of-00004.tfrecord: record 100: "
     "image/class/label \\[12\\] is out of range "
     r"\[0, 10\)"),
    (lambda d: _rewrite(d, "train-00003-of-00004.tfrecord", _without_label),
     "train-00003-of-00004.tfrecord: record 100: Feature: image/class/label "
     r"\(data type: int64\) is required but could not be found"),
    (lambda d: _corrupt(d, "train-00001-of-00004.tfrecord"),
     r"train-00001-of-00004.tfrecord: record \d+: corrupted record at \d+"),
])
def test_a_bad_record_mid_run_is_one_line_and_keeps_the_checkpoint(
    shards, tmp_path, damage, message):
  folder = str(tmp_path / "shards")
  shutil.copytree(shards[4], folder)
  # With an index, nothing reads the records before training: found mid-run.
  damage(folder)
  model_dir = str(tmp_path / "run")
  result = run_cli("--model=mlp", "--dataset=tfrecord", "--checkpoint_every=10",
                   f"--train_files={folder}/train-*", f"--model_dir={model_dir}",
                   "--train_steps=100", "--array_input=dataset")
  assert result.returncode == 2
  line = result.stderr.strip().splitlines()[-1]
  assert re.fullmatch(rf"error: --train_files: bad record in {folder}/{message}.* "
                      r"\(train stopped in the steps after \d+; the checkpoints "
                      r"written so far are kept\)", line), line
  assert "Traceback" not in result.stderr
  kept = checkpoint_values(os.path.join(model_dir, "checkpoints"))  # Readable.
  assert np.isfinite(kept["global_step/.ATTRIBUTES/VARIABLE_VALUE"])

  # Decoded into memory (the default where they fit), the records are all read
  # before the first step: the same record is named then.
  decoded = run_cli("--model=mlp", "--dataset=tfrecord",
                    f"--train_files={folder}/train-*",
                    f"--model_dir={tmp_path / 'decoded'}", "--train_steps=100")
  assert decoded.returncode == 2 and "Traceback" not in decoded.stderr
  line = decoded.stderr.strip().splitlines()[-1]
  assert re.fullmatch(rf"error: --train_files: bad record in {folder}/{message}.* "
                      r"\(found while decoding the records into memory, before "
                      r"training; --array_input=dataset reads them as it trains\)",
                      line), line


@pytest.mark.parametrize("args, line", [
    (["--train_files={tmp}/none-*"],
     "error: --train_files={tmp}/none-*: no file matches"),
    (["--train_files={shards}/train-*", "--eval_files={tmp}/x-*"],
     "error: --eval_files={tmp}/x-*: no file matches"),
    (["--train_files={bare}/train-*"],
     "error: --num_classes: needed with --dataset=tfrecord when the shards' folder "
     "has no dataset.json with num_classes (write one with scripts/make_tfrecords.py "
     "--index)"),
    ([], "error: --dataset=tfrecord needs --train_files=GLOB, e.g. "
     "--train_files='data/digits/train-*'"),
    (["--train_files={shards}/train-*", "--num_classes=3"],
     "error: --train_files: bad record in {shards}/train-00000-of-00004.tfrecord: "
     "record 3: image/class/label [3] is out of range [0, 3)"),
])
def test_bad_file_flags_are_one_line_and_write_nothing(shards, tmp_path, args, line):
  bare = tmp_path / "bare"
  shutil.copytree(shards[4], bare)
  os.remove(bare / "dataset.json")
  fill = dict(tmp=tmp_path, shards=shards[4], bare=bare)
  model_dir = str(tmp_path / "run")
  result = run_cli("--dataset=tfrecord", *[a.format(**fill) for a in args],
                   f"--model_dir={model_dir}")
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [line.format(**fill)]
  assert not os.path.exists(model_dir)


def test_overwrite_leaves_no_old_shard_and_npz_vectors_are_stored(tmp_path):
  out = str(tmp_path / "out")
  assert make_tfrecords.main(["--dataset=digits", f"--out={out}", "--shards=4"]) == 0
  assert make_tfrecords.main(["--dataset=digits", f"--out={out}", "--shards=2",
                              "--overwrite"]) == 0
  assert sorted(os.listdir(out)) == [
      "dataset.json", "test-00000-of-00002.tfrecord", "test-00001-of-00002.tfrecord",
      "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
  # float64 vectors (numpy's default) are stored as raw float32 the trainer reads.
  npz = str(tmp_path / "v.npz")
  rng = np.random.default_rng(0)
  np.savez(npz, x_train=rng.normal(size=(40, 5)), y_train=np.arange(40) % 3,
           x_test=rng.normal(size=(9, 5)), y_test=np.arange(9) % 3)
  assert make_tfrecords.main(["--dataset=npz", f"--data_path={npz}",
                              f"--out={tmp_path / 'v'}", "--shards=2"]) == 0
  result = run_cli("--dataset=tfrecord", f"--train_files={tmp_path}/v/train-*",
                   f"--eval_files={tmp_path}/v/test-*", "--model=mlp",
                   "--mode=train_and_eval", "--train_steps=3",
                   "--per_replica_batch_size=8", f"--model_dir={tmp_path / 'run'}")
  assert result.returncode == 0, result.stderr
  assert read_results(str(tmp_path / "run"))["eval"]["examples"] == 9
