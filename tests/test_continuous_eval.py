"""--mode=continuous_eval, the evaluator beside training: every checkpoint once,
in step order, with the numbers --mode=eval gives; what it writes; a restart
after SIGKILL going on where it was; and the evaluator of a TF_CONFIG cluster."""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import trainer
from conftest import REPO, cli_env, read_results, run_cli
from trainer.training import checkpoint_files, continuous_eval

MLP = ["--dataset=digits", "--model=mlp", "--optimizer=sgd", "--learning_rate=0.1",
       "--per_replica_batch_size=16", "--keep_checkpoints=20"]


def _evaluations(model_dir) -> dict:
  with open(os.path.join(model_dir, "eval_results.json")) as f:
    return {int(step): metrics for step, metrics in json.load(f)["evaluated"].items()}


def _mode_eval_of(model_dir, step, tmp_path) -> dict:
  """--mode=eval of the checkpoint of `step` alone (in a copy of the run)."""
  copy = tmp_path / f"at-{step}"
  os.makedirs(copy / "checkpoints")
  shutil.copy(os.path.join(model_dir, "flags.txt"), copy)
  for name in os.listdir(os.path.join(model_dir, "checkpoints")):
    if name.startswith(f"ckpt-{step}."):
      shutil.copy(os.path.join(model_dir, "checkpoints", name), copy / "checkpoints")
  return trainer.train(trainer.Config(mode="eval", model_dir=str(copy)))["eval"]


@pytest.mark.slow
def test_an_evaluator_beside_two_workers_evaluates_every_checkpoint_once(tmp_path):
  """scripts/launch_workers.py --evaluator: a TF_CONFIG task of type evaluator
  (which the workers leave out of their cluster) runs continuous_eval, writes the
  eval summaries, eval_results.json, checkpoints/best and export_best, and ends
  when training finished; its numbers are --mode=eval's of each checkpoint."""
  model_dir = str(tmp_path / "run")
  launched = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "launch_workers.py"),
       "--num_workers=2", "--grace_seconds=5", "--evaluator", "--", *MLP,
       "--mode=train", "--train_steps=300", "--checkpoint_every=100",
       "--cpu_devices=1", f"--model_dir={model_dir}"], cwd=REPO,
      env=cli_env(TMPDIR=str(tmp_path)), capture_output=True, text=True,
      timeout=300, check=False)
  assert launched.returncode == 0, launched.stdout[-3000:]
  evaluated = re.findall(r"^\[evaluator\] eval of step (\d+):", launched.stdout,
                         re.M)
  assert evaluated == ["0", "100", "200", "300"], launched.stdout[-3000:]
  assert "[evaluator] continuous_eval: the run finished at step 300" in (
      launched.stdout)
  assert read_results(model_dir)["status"] == "completed"
  evaluations = _evaluations(model_dir)
  for step in (100, 300):
    expected = _mode_eval_of(model_dir, step, tmp_path)
    for name in ("loss", "accuracy"):
      assert evaluations[step][name] == pytest.approx(expected[name], rel=1e-6)
  best = max(evaluations, key=lambda s: evaluations[s]["accuracy"])
  assert checkpoint_files.checkpoint_steps(
      os.path.join(model_dir, "checkpoints", "best")) == [best]
  # What in-process evaluation exports: the SavedModel and model.keras.
  for name in ("saved_model.pb", "model.keras"):
    assert os.path.exists(os.path.join(model_dir, "export_best", name)), name
  assert os.listdir(os.path.join(model_dir, "eval"))  # Its summaries.


def test_a_killed_evaluator_goes_on_from_the_first_checkpoint_it_had_not_evaluated(
    tmp_path):
  model_dir = str(tmp_path / "run")
  # Stopped by its time budget after the first call: not finished, so the
  # evaluator waits for more.
  first = run_cli(*MLP, "--mode=train", "--train_steps=1000", "--steps_per_loop=50",
                  "--checkpoint_every=50", "--max_time=0.01s",
                  f"--model_dir={model_dir}")
  assert first.returncode == 0 and read_results(model_dir)["status"] == "time_limit"
  steps = checkpoint_files.checkpoint_steps(os.path.join(model_dir, "checkpoints"))
  evaluator = subprocess.Popen(
      [sys.executable, "-m", "trainer.main", "--mode=continuous_eval",
       f"--model_dir={model_dir}"], cwd=REPO, env=cli_env(), text=True,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  try:
    for line in evaluator.stdout:  # Each evaluation is said once recorded.
      if line.startswith(f"eval of step {steps[-1]}:"):
        break
    evaluator.send_signal(signal.SIGKILL)
    evaluator.wait(timeout=60)
  finally:
    evaluator.kill()
  assert sorted(_evaluations(model_dir)) == steps
  resumed = run_cli(*MLP, "--mode=train", "--train_steps=150",
                    "--checkpoint_every=50", f"--model_dir={model_dir}")
  assert resumed.returncode == 0 and read_results(model_dir)["status"] == "completed"
  restarted = run_cli("--mode=continuous_eval", f"--model_dir={model_dir}")
  assert restarted.returncode == 0, restarted.stderr[-2000:]
  again = re.findall(r"^eval of step (\d+):", restarted.stdout, re.M)
  newer = [s for s in checkpoint_files.checkpoint_steps(
      os.path.join(model_dir, "checkpoints")) if s > steps[-1]]
  assert [int(s) for s in again] == newer and newer, restarted.stdout
  assert sorted(_evaluations(model_dir)) == steps + newer


def test_a_checkpoint_deleted_before_it_is_read_is_skipped_in_one_line(
    tmp_path, monkeypatch, capsys):
  model_dir = str(tmp_path / "run")
  trainer.train(trainer.Config(mode="train", train_steps=20, checkpoint_every=10,
                               keep_checkpoints=5, summaries=False,
                               model_dir=model_dir))
  directory = os.path.join(model_dir, "checkpoints")
  listed = checkpoint_files.checkpoint_steps(directory)
  for name in os.listdir(directory):  # Rotated away after it was listed.
    if name.startswith("ckpt-10."):
      os.remove(os.path.join(directory, name))
  monkeypatch.setattr(checkpoint_files, "checkpoint_steps",
                      lambda d: listed if d == directory else [])
  results = continuous_eval.evaluate_continuously(
      trainer.Config(mode="continuous_eval", model_dir=model_dir,
                     eval_timeout="1s"), sleep=lambda s: None)
  out = capsys.readouterr().out
  assert ("continuous_eval: checkpoint of step 10 was deleted before it could be "
          "read (--keep_checkpoints rotates them); skipped") in out
  assert results["evaluated"]["10"] is None
  assert set(results["evaluated"]) == {"0", "10", "20"}


def test_an_older_results_json_does_not_end_the_evaluation_of_a_resumed_run(
    tmp_path, capsys):
  """results.json is written as an invocation ends: one that says "completed at
  step 20" while a resume (flags.txt: --train_steps=40) trains on is no end."""
  model_dir = str(tmp_path / "run")
  trainer.train(trainer.Config(mode="train", train_steps=20, checkpoint_every=10,
                               summaries=False, model_dir=model_dir))
  flags = os.path.join(model_dir, "flags.txt")
  with open(flags) as f:
    text = f.read()
  with open(flags, "w") as f:  # As the resumed invocation rewrote it at its claim.
    f.write(text.replace("--train_steps=20", "--train_steps=40"))
  state = continuous_eval.evaluate_continuously(
      trainer.Config(mode="continuous_eval", model_dir=model_dir, eval_timeout="1s"),
      sleep=lambda s: None)
  out = capsys.readouterr().out
  assert "continuous_eval: no new checkpoint for --eval_timeout=1s; stopping" in out
  assert "the run finished" not in out
  assert set(state["evaluated"]) == {"0", "10", "20"}


def test_an_end_written_by_a_host_with_a_slow_clock_ends_the_evaluation(
    tmp_path, capsys):
  """The run's invocation ends (--max_time: not finished) while the evaluator
  watches, on a host whose clock is an hour behind: results.json's time is older
  than the evaluator's start, yet it records another invocation's end. (The
  evaluator compared that time with its own clock, and waited for
  --eval_timeout.)"""
  model_dir = str(tmp_path / "run")
  trainer.train(trainer.Config(mode="train", train_steps=20, checkpoint_every=10,
                               summaries=False, model_dir=model_dir))
  path = os.path.join(model_dir, "results.json")
  with open(flags := os.path.join(model_dir, "flags.txt")) as f:
    text = f.read()
  with open(flags, "w") as f:  # A resumed invocation trains on.
    f.write(text.replace("--train_steps=20", "--train_steps=40"))

  def the_invocation_ends(seconds):
    del seconds
    ended = read_results(model_dir)
    if ended["status"] != "time_limit":
      ended.update(status="time_limit", invocation="the resumed invocation")
      with open(path, "w") as f:
        json.dump(ended, f)
      past = time.time() - 3600
      os.utime(path, (past, past))

  state = continuous_eval.evaluate_continuously(
      trainer.Config(mode="continuous_eval", model_dir=model_dir,
                     eval_timeout="20s"), sleep=the_invocation_ends)
  out = capsys.readouterr().out
  assert "continuous_eval: the run finished at step 20, evaluated" in out
  assert set(state["evaluated"]) == {"0", "10", "20"}


def test_a_checkpoint_deleted_while_it_is_read_leaves_nothing_for_the_next(
    tmp_path, monkeypatch, capsys):
  """--keep_checkpoints rotates step 10 away while the evaluator reads it, at
  any moment of the read: it is skipped, and steps 20 and 30 are evaluated."""
  model_dir = str(tmp_path / "run")
  trainer.train(trainer.Config(mode="train", train_steps=30, checkpoint_every=10,
                               keep_checkpoints=5, summaries=False, ema_decay=0.9,
                               model_dir=model_dir))
  prefix = os.path.join(model_dir, "checkpoints", "ckpt-10")
  real = tf.train.Checkpoint.restore

  def restore_while_rotated(checkpoint, path, *args, **kwargs):
    if path != prefix:
      return real(checkpoint, path, *args, **kwargs)
    for name in glob.glob(prefix + ".data*"):  # Data first, as a rotation does.
      os.remove(name)
    try:
      return real(checkpoint, path, *args, **kwargs)
    finally:
      if os.path.exists(prefix + ".index"):
        os.remove(prefix + ".index")

  monkeypatch.setattr(tf.train.Checkpoint, "restore", restore_while_rotated)
  state = continuous_eval.evaluate_continuously(
      trainer.Config(mode="continuous_eval", model_dir=model_dir, eval_timeout="1s"),
      sleep=lambda s: None)
  out = capsys.readouterr().out
  assert "checkpoint of step 10 was deleted before it could be read" in out
  assert state["evaluated"]["10"] is None
  assert state["evaluated"]["20"] and state["evaluated"]["30"]
