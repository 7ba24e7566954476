"""trainer.train in-process: summaries, results, evaluation, checkpoints, export and
the faults that must lose nothing."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import trainer
from trainer.config import Config
from trainer.errors import DivergedError, LockedError, ModelDirError

from conftest import checkpoint_values, read_results, read_scalars

FAST = dict(dataset="digits", model="mlp", optimizer="sgd", learning_rate=0.1,
            per_replica_batch_size=8)




def test_summaries_results_and_flags(model_dir):
  results = trainer.train(Config(model_dir=model_dir, cpu_devices=2, train_steps=12,
                                 steps_per_loop=4, checkpoint_every=8, **FAST))
  scalars = read_scalars(os.path.join(model_dir, "train"))
  expected_tags = {"loss", "accuracy", "learning_rate", "gradient_norm",
                   "examples_per_second", "steps_per_second",
                   "replica_batches/replica_0", "replica_batches/replica_1"}
  assert expected_tags <= scalars.keys()
  # Loop calls end at 4, 8 (a checkpoint) and 12.
  assert [step for step, _ in scalars["loss"]] == [4, 8, 12]
  assert scalars["replica_batches/replica_1"] == [(4, 4.0), (8, 8.0), (12, 12.0)]
  assert scalars["learning_rate"][0][1] == pytest.approx(0.1)
  on_disk = read_results(model_dir)
  assert on_disk == json.loads(json.dumps(results))
  assert on_disk["status"] == "completed" and on_disk["global_step"] == 12
  assert on_disk["global_batch_size"] == 16 and on_disk["num_replicas"] == 2
  assert on_disk["train"]["loss"] == pytest.approx(scalars["loss"][-1][1], rel=1e-6)
  assert on_disk["examples_per_second"] > 0
  flags_txt = open(os.path.join(model_dir, "flags.txt")).read()
  assert "--per_replica_batch_size=8\n" in flags_txt and "--cpu_devices=2\n" in flags_txt


def test_automatic_steps_per_loop_ends_calls_at_every_interval(model_dir):
  trainer.train(Config(model_dir=model_dir, train_steps=100, steps_per_loop=0,
                       summary_every=25, checkpoint_every=40, **FAST))
  ends = [step for step, _ in read_scalars(os.path.join(model_dir, "train"))["loss"]]
  # One step (it traces), then ten (measured), then calls sized to ~1 s, which
  # this small model would make far longer than the intervals allow.
  assert ends[:2] == [1, 11]
  assert {25, 40, 50, 75, 80, 100} <= set(ends)
  for start, end in zip([0] + ends, ends):
    assert not any(start < m < end for m in range(25, 100, 25)), (start, end)
    assert not any(start < m < end for m in range(40, 100, 40)), (start, end)
  assert len(ends) < 20  # Sized up after the first two calls, not one step each.
  checkpoints = sorted(int(name.split("-")[1].split(".")[0]) for name in os.listdir(
      os.path.join(model_dir, "checkpoints")) if name.endswith(".index"))
  assert checkpoints == [40, 80, 100]  # --keep_checkpoints=3: step 0 rotated out.


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_eval_counts_every_example_once(tmp_path, replicas):
  rng = np.random.default_rng(0)
  path = tmp_path / "seventy.npz"
  np.savez(path, x_train=rng.random((64, 6), np.float32), y_train=rng.integers(0, 3, 64),
           x_test=rng.random((70, 6), np.float32), y_test=rng.integers(0, 3, 70))
  results = trainer.train(Config(
      model_dir=str(tmp_path / "run"), dataset="npz", data_path=str(path), model="mlp",
      cpu_devices=replicas, per_replica_batch_size=4, train_steps=4, eval_every=2,
      mode="train_and_eval", optimizer="sgd", summaries=True))
  assert results["eval"]["examples"] == 70
  assert results["best_eval"]["examples"] == 70
  eval_scalars = read_scalars(str(tmp_path / "run" / "eval"))
  assert [s for s, _ in eval_scalars["accuracy"]] == [2, 4]
  # The padded, distributed eval equals a plain mean over exactly the 70 examples.
  served = tf.saved_model.load(results["export_dir"])
  with np.load(path) as arrays:
    logits = served.signatures["serving_default"](
        inputs=tf.constant(arrays["x_test"]))["logits"].numpy()
    labels = arrays["y_test"]
  loss = tf.keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                         from_logits=True)
  assert results["eval"]["loss"] == pytest.approx(float(np.mean(loss)), rel=1e-5)
  assert results["eval"]["accuracy"] == pytest.approx(
      float(np.mean(logits.argmax(-1) == labels)))


def test_eval_mode_evaluates_the_latest_checkpoint(model_dir):
  trainer.train(Config(model_dir=model_dir, train_steps=6, **FAST))
  results = trainer.train(Config(mode="eval", model_dir=model_dir))
  assert results["global_step"] == 6 and results["eval"]["examples"] == 360
  assert json.load(open(os.path.join(model_dir, "eval_results.json"))) == results


def test_eval_mode_without_a_run_is_a_clear_error(tmp_path):
  with pytest.raises(ModelDirError, match="no flags.txt, not a trainer run"):
    trainer.train(Config(mode="eval", model_dir=str(tmp_path)))


def test_rerun_resumes_and_already_done_is_a_no_op(model_dir):
  trainer.train(Config(model_dir=model_dir, train_steps=5, **FAST))
  resumed = trainer.train(Config(model_dir=model_dir, train_steps=9, **FAST))
  # The ledger's totals cover the whole run, across invocations (kept in the
  # checkpoint), not just the resumed part.
  assert resumed["global_step"] == 9 and resumed["replica_batches"]["replica_0"] == 9
  before = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  again = trainer.train(Config(model_dir=model_dir, train_steps=9, **FAST))
  assert again["status"] == "completed" and again["global_step"] == 9
  after = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  assert all(np.array_equal(before[k], after[k]) for k in before)


def test_corrupt_latest_checkpoint_falls_back(model_dir, capsys):
  trainer.train(Config(model_dir=model_dir, train_steps=10, checkpoint_every=5, **FAST))
  directory = os.path.join(model_dir, "checkpoints")
  latest = tf.train.latest_checkpoint(directory)
  assert latest.endswith("ckpt-10")
  data_file = latest + ".data-00000-of-00001"
  with open(data_file, "r+b") as f:
    f.truncate(os.path.getsize(data_file) // 2)
  results = trainer.train(Config(model_dir=model_dir, train_steps=12,
                                 checkpoint_every=5, **FAST))
  assert "ckpt-10 is unreadable" in capsys.readouterr().out
  # Resumed from step 5 (whose checkpoint counts 5 batches per replica): 7 more.
  assert results["global_step"] == 12 and results["replica_batches"]["replica_0"] == 12
  assert os.path.exists(os.path.join(directory, "unreadable-ckpt-10.index"))
  assert os.path.exists(os.path.join(directory, "ckpt-5.index"))


def test_nan_stops_and_keeps_the_last_good_checkpoint(model_dir):
  config = Config(model_dir=model_dir, train_steps=40, checkpoint_every=1,
                  steps_per_loop=1, **dict(FAST, learning_rate=1e12))
  with pytest.raises(DivergedError, match=r"non-finite loss or gradients at step \d+"):
    trainer.train(config)
  results = read_results(model_dir)
  assert results["status"] == "diverged"
  values = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  assert all(np.isfinite(v).all() for v in values.values() if v.dtype.kind == "f")


def test_nan_rollback_halves_the_learning_rate(model_dir, capsys):
  config = Config(model_dir=model_dir, train_steps=30, checkpoint_every=1,
                  steps_per_loop=1, on_nan="rollback", **dict(FAST, learning_rate=1e12))
  with pytest.raises(DivergedError):
    trainer.train(config)  # Halving 1e12 three times still diverges.
  assert capsys.readouterr().out.count("rolled back to step") == 3


_HOLD_LOCK = """
import fcntl, os, socket, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, f"{os.getpid()} {socket.gethostname()}\\n".encode())
print("locked", flush=True)
time.sleep(60)
"""


def test_lock_refuses_a_live_holder_and_takes_over_a_dead_one(model_dir):
  os.makedirs(model_dir)
  lock = os.path.join(model_dir, ".lock")
  holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, lock],
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline() == "locked\n"
    with pytest.raises(LockedError, match=f"in use by pid {holder.pid}"):
      trainer.train(Config(model_dir=model_dir, train_steps=2, **FAST))
    assert not os.path.exists(os.path.join(model_dir, "flags.txt"))
  finally:
    holder.kill()  # A SIGKILL: the kernel drops its lock; the file stays.
    holder.wait()
  assert os.path.exists(lock)
  results = trainer.train(Config(model_dir=model_dir, train_steps=2, **FAST))
  assert results["status"] == "completed" and not os.path.exists(lock)


@pytest.mark.parametrize("content", [b"", b"\x00\xff garbage", b"123"])
def test_an_empty_or_garbled_lock_of_a_killed_run_is_taken_over(model_dir, content):
  os.makedirs(model_dir)
  with open(os.path.join(model_dir, ".lock"), "wb") as f:
    f.write(content)  # What a SIGKILL between creating and writing the file leaves.
  results = trainer.train(Config(model_dir=model_dir, train_steps=2, **FAST))
  assert results["status"] == "completed"


def test_layout_change_is_refused_listing_the_flags(model_dir):
  trainer.train(Config(model_dir=model_dir, train_steps=2, **FAST))
  flags_before = open(os.path.join(model_dir, "flags.txt")).read()
  with pytest.raises(ModelDirError) as e:
    trainer.train(Config(model_dir=model_dir, train_steps=4,
                         **dict(FAST, model="cnn", per_replica_batch_size=4)))
  assert "--model=cnn (the run has mlp)" in str(e.value)
  with pytest.raises(ModelDirError) as e:
    trainer.train(Config(model_dir=model_dir, train_steps=4,
                         **dict(FAST, per_replica_batch_size=4)))
  assert "global batch 4 (1 replica(s) x 4; the run has 8)" in str(e.value)
  assert open(os.path.join(model_dir, "flags.txt")).read() == flags_before


def test_unwritable_model_dir(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(ModelDirError, match="not writable"):
    trainer.train(Config(model_dir=str(blocker / "run"), train_steps=2, **FAST))


def test_saved_model_reproduces_predictions(model_dir):
  trainer.train(Config(model_dir=model_dir, train_steps=60, model="cnn", dropout=0.3,
                       learning_rate=0.01,
                       cpu_devices=2, per_replica_batch_size=8))
  from trainer.tasks import image_data
  from trainer.tasks.classification import Classification
  from trainer.training.setup import setup
  from trainer.training.state import build_state
  source = image_data.load_source(Config())
  raw = source.x_test[:16].astype(np.float32)
  served = tf.saved_model.load(os.path.join(model_dir, "export"))
  outputs = served.signatures["serving_default"](inputs=tf.constant(raw))
  # Rebuild the model from its checkpoint and compare.
  config = Config(model_dir=model_dir, model="cnn", dropout=0.3, cpu_devices=2,
                  per_replica_batch_size=8)
  found = setup(config, Classification())
  state = build_state(config, found.task, found.strategy, train_data=found.train_data,
                      eval_data=found.eval_data, is_chief=True)
  state.checkpoints.restore_latest()
  expected = state.model(raw * source.scale, training=False).numpy()
  np.testing.assert_allclose(outputs["logits"].numpy(), expected, atol=1e-5)
  assert outputs["classes"].numpy().tolist() == expected.argmax(-1).tolist()
  assert (outputs["classes"].numpy() == source.y_test[:16]).mean() > 0.5


@pytest.mark.parametrize("changes", [dict(mixed_precision="mixed_bfloat16"),
                                     dict(mixed_precision="mixed_float16"),
                                     dict(jit_compile=True)])
def test_fast_paths_train(model_dir, changes):
  results = trainer.train(Config(model_dir=model_dir, train_steps=30, cpu_devices=2,
                                 **dict(FAST, model="cnn", optimizer="adam",
                                        learning_rate=0.003), **changes))
  assert results["status"] == "completed" and results["global_step"] == 30
  assert results["train"]["loss"] < 2.0  # Learned something from ln(10) = 2.30.
