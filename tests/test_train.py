"""trainer.train in-process: summaries, results, evaluation, checkpoints, export and
the faults that must lose nothing."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import trainer
from trainer.config import Config
from trainer.errors import DivergedError, LockedError, ModelDirError

from conftest import checkpoint_values, read_layout, read_results, read_scalars
from presets import MLP_SGD, train

FAST = (*MLP_SGD, "--learning_rate=0.1", "--per_replica_batch_size=8")


def test_summaries_results_and_flags(model_dir):
  results = train(*FAST, model_dir=model_dir, cpu_devices=2, train_steps=12,
                  steps_per_loop=4, checkpoint_every=8)
  scalars = read_scalars(os.path.join(model_dir, "train"))
  expected_tags = {"loss", "accuracy", "learning_rate", "gradient_norm",
                   "examples_per_second", "steps_per_second",
                   "replica_batches/replica_0", "replica_batches/replica_1"}
  assert expected_tags <= scalars.keys()
  # A point every step (12 // 100, at least 1), inside loop calls of 4 steps.
  assert [step for step, _ in scalars["loss"]] == list(range(1, 13))
  assert scalars["replica_batches/replica_1"] == [(s, float(s)) for s in range(1, 13)]
  # One chart (TensorBoard's Custom Scalars) holds every replica's ledger line.
  charts = {chart.title: chart.multiline.tag
            for category in read_layout(os.path.join(model_dir, "train")).category
            for chart in category.chart}
  [ledger_chart] = [tags for title, tags in charts.items()
                    if title.startswith("replica_batches")]
  assert sorted(tag for tag in scalars if any(re.search(pattern, tag)
                                              for pattern in ledger_chart)) == [
      "replica_batches/replica_0", "replica_batches/replica_1"]
  assert scalars["learning_rate"][0][1] == pytest.approx(0.1)
  on_disk = read_results(model_dir)
  assert on_disk == json.loads(json.dumps(results))
  assert on_disk["status"] == "completed" and on_disk["global_step"] == 12
  assert on_disk["global_batch_size"] == 16 and on_disk["num_replicas"] == 2
  # results.json's train loss is the last call's (steps 9 to 12): its points' mean.
  assert on_disk["train"]["loss"] == pytest.approx(
      np.mean([loss for _, loss in scalars["loss"][-4:]]), rel=1e-6)
  assert on_disk["examples_per_second"] > 0
  flags_txt = open(os.path.join(model_dir, "flags.txt")).read()
  assert "--per_replica_batch_size=8\n" in flags_txt
  assert "--cpu_devices=2\n" in flags_txt


def test_automatic_steps_per_loop_ends_calls_at_every_interval(model_dir):
  ends = []
  train(*FAST, model_dir=model_dir, train_steps=100, steps_per_loop=0,
        summary_every=25, checkpoint_every=40,
        actions=[lambda context: ends.append(context.step)])
  # One step (it traces), then ten (measured), then calls sized to ~1 s, which
  # this small model would make far longer than the intervals allow.
  assert ends[:2] == [1, 11]
  # Checkpoints end calls; summaries do not (the loop records their rows).
  assert {40, 80, 100} <= set(ends)
  for start, end in zip([0] + ends, ends):
    assert not any(start < m < end for m in range(40, 100, 40)), (start, end)
  losses = read_scalars(os.path.join(model_dir, "train"))["loss"]
  assert [step for step, _ in losses] == [25, 50, 75, 100]
  assert len(ends) < 20  # Sized up after the first two calls, not one step each.
  checkpoints = sorted(int(name.split("-")[1].split(".")[0]) for name in os.listdir(
      os.path.join(model_dir, "checkpoints")) if name.endswith(".index"))
  assert checkpoints == [40, 80, 100]  # --keep_checkpoints=3: step 0 rotated out.


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_eval_counts_every_example_once(tmp_path, replicas):
  rng = np.random.default_rng(0)
  path = tmp_path / "seventy.npz"
  np.savez(path, x_train=rng.random((64, 6), np.float32),
           y_train=rng.integers(0, 3, 64),
           x_test=rng.random((70, 6), np.float32), y_test=rng.integers(0, 3, 70))
  results = train("--dataset=npz", f"--data_path={path}", "--model=mlp",
                  model_dir=str(tmp_path / "run"), cpu_devices=replicas,
                  per_replica_batch_size=4, train_steps=4, eval_every=2,
                  mode="train_and_eval", optimizer="sgd", summaries=True)
  assert results["eval"]["examples"] == 70
  assert results["best_eval"]["examples"] == 70
  # What the evaluations took (2 and 4), and the latest one's rate.
  assert results["eval_seconds"] > 0 and results["eval_examples_per_second"] > 0
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
  train(*FAST, model_dir=model_dir, train_steps=6)
  results = trainer.train(Config(mode="eval", model_dir=model_dir))
  assert results["global_step"] == 6 and results["eval"]["examples"] == 360
  assert json.load(open(os.path.join(model_dir, "eval_results.json"))) == results


def test_eval_mode_without_a_run_is_a_clear_error(tmp_path):
  with pytest.raises(ModelDirError, match="no flags.txt, not a trainer run"):
    trainer.train(Config(mode="eval", model_dir=str(tmp_path)))


def test_rerun_resumes_and_already_done_is_a_no_op(model_dir):
  train(*FAST, model_dir=model_dir, train_steps=5)
  resumed = train(*FAST, model_dir=model_dir, train_steps=9)
  # The ledger's totals cover the whole run, across invocations (kept in the
  # checkpoint), not just the resumed part.
  assert resumed["global_step"] == 9 and resumed["replica_batches"]["replica_0"] == 9
  before = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  again = train(*FAST, model_dir=model_dir, train_steps=9)
  assert again["status"] == "completed" and again["global_step"] == 9
  after = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  assert all(np.array_equal(before[k], after[k]) for k in before)


def test_corrupt_latest_checkpoint_falls_back(model_dir, capsys):
  train(*FAST, model_dir=model_dir, train_steps=10, checkpoint_every=5)
  directory = os.path.join(model_dir, "checkpoints")
  latest = tf.train.latest_checkpoint(directory)
  assert latest.endswith("ckpt-10")
  data_file = latest + ".data-00000-of-00001"
  with open(data_file, "r+b") as f:
    f.truncate(os.path.getsize(data_file) // 2)
  results = train(*FAST, model_dir=model_dir, train_steps=12, checkpoint_every=5)
  assert "ckpt-10 is unreadable" in capsys.readouterr().out
  # Resumed from step 5 (whose checkpoint counts 5 batches per replica): 7 more.
  assert results["global_step"] == 12 and results["replica_batches"]["replica_0"] == 12
  assert os.path.exists(os.path.join(directory, "unreadable-ckpt-10.index"))
  assert os.path.exists(os.path.join(directory, "ckpt-5.index"))


def test_nan_stops_and_keeps_the_last_good_checkpoint(model_dir):
  with pytest.raises(DivergedError, match=r"non-finite loss or gradients at step \d+"):
    train(*FAST, model_dir=model_dir, train_steps=40, checkpoint_every=1,
          steps_per_loop=1, learning_rate=1e12)
  results = read_results(model_dir)
  assert results["status"] == "diverged"
  values = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  assert all(np.isfinite(v).all() for v in values.values() if v.dtype.kind == "f")


def test_nan_rollback_halves_the_learning_rate(model_dir, capsys):
  with pytest.raises(DivergedError):  # Halving 1e12 three times still diverges.
    train(*FAST, model_dir=model_dir, train_steps=30, checkpoint_every=1,
          steps_per_loop=1, on_nan="rollback", learning_rate=1e12)
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
      train(*FAST, model_dir=model_dir, train_steps=2)
    assert not os.path.exists(os.path.join(model_dir, "flags.txt"))
  finally:
    holder.kill()  # A SIGKILL: the kernel drops its lock; the file stays.
    holder.wait()
  assert os.path.exists(lock)
  results = train(*FAST, model_dir=model_dir, train_steps=2)
  assert results["status"] == "completed" and not os.path.exists(lock)


@pytest.mark.parametrize("content", [b"", b"\x00\xff garbage", b"123"])
def test_an_empty_or_garbled_lock_of_a_killed_run_is_taken_over(model_dir, content):
  os.makedirs(model_dir)
  with open(os.path.join(model_dir, ".lock"), "wb") as f:
    f.write(content)  # What a SIGKILL between creating and writing the file leaves.
  results = train(*FAST, model_dir=model_dir, train_steps=2)
  assert results["status"] == "completed"


def test_a_lock_that_is_a_directory_is_one_line(model_dir):
  os.makedirs(os.path.join(model_dir, ".lock"))
  with pytest.raises(ModelDirError, match=r"cannot use .*/\.lock as its lock file "
                     r"\(Is a directory\); remove it"):
    train(*FAST, model_dir=model_dir, train_steps=2)
  assert os.listdir(model_dir) == [".lock"]


def test_layout_change_is_refused_listing_the_flags(model_dir):
  train(*FAST, model_dir=model_dir, train_steps=2)
  flags_before = open(os.path.join(model_dir, "flags.txt")).read()
  with pytest.raises(ModelDirError) as e:
    train(*FAST, "--model=cnn", model_dir=model_dir, train_steps=4,
          per_replica_batch_size=4)
  # Every difference, in one message.
  assert "--model=cnn (the run has mlp)" in str(e.value)
  assert "global batch 4 (1 replica(s) x 4; the run has 8)" in str(e.value)
  with pytest.raises(ModelDirError) as e:
    train(*FAST, model_dir=model_dir, train_steps=4, per_replica_batch_size=4)
  assert "global batch 4 (1 replica(s) x 4; the run has 8)" in str(e.value)
  assert open(os.path.join(model_dir, "flags.txt")).read() == flags_before


def test_unwritable_model_dir(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(ModelDirError, match="not writable"):
    train(*FAST, model_dir=str(blocker / "run"), train_steps=2)


def test_saved_model_reproduces_predictions(model_dir):
  train("--model=cnn", "--dropout=0.3", model_dir=model_dir, train_steps=60,
        learning_rate=0.01, cpu_devices=2, per_replica_batch_size=8)
  task, model = trainer.load(model_dir)
  raw = task.source.x_test[:16].astype(np.float32)
  served = tf.saved_model.load(os.path.join(model_dir, "export"))
  outputs = served.signatures["serving_default"](inputs=tf.constant(raw))
  expected = model(task.preprocess(raw), training=False).numpy()
  np.testing.assert_allclose(outputs["logits"].numpy(), expected, atol=1e-5)
  assert outputs["classes"].numpy().tolist() == expected.argmax(-1).tolist()
  assert (outputs["classes"].numpy() == task.source.y_test[:16]).mean() > 0.5


@pytest.mark.parametrize("changes", [dict(mixed_precision="mixed_bfloat16"),
                                     dict(mixed_precision="mixed_float16"),
                                     dict(jit_compile=True)])
def test_fast_paths_train(model_dir, changes):
  results = train(*FAST, "--model=cnn", model_dir=model_dir, train_steps=30,
                  cpu_devices=2, optimizer="adam", learning_rate=0.003, **changes)
  assert results["status"] == "completed" and results["global_step"] == 30
  assert results["train"]["loss"] < 2.0  # Learned something from ln(10) = 2.30.
