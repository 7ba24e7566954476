"""What a new user sees: a run that evaluates by default and ends by saying where
everything is, a first progress line that says it compiles, curves of about 100
points, `--help` with the framework's flags grouped, and a sweep's log with a
line per trial."""

import os
import re
import subprocess
import sys

import pytest

from conftest import (REPO, TESTS, cli_env, read_results, read_scalars, run_cli,
                      run_cold)
from trainer.outputs import progress


def test_the_default_run_evaluates_and_ends_saying_where_everything_is(tmp_path):
  process = run_cold("--train_steps=20", cwd=str(tmp_path))
  assert process.returncode == 0, process.stderr
  (run,) = os.listdir(tmp_path / "runs")
  where = str(tmp_path / "runs" / run)
  results = read_results(where)
  assert results["eval"]["examples"] == 360  # The digits' test split, evaluated.
  lines = process.stdout.strip().splitlines()
  evaluated = results["eval"]
  assert lines[-4] == (f"completed at step 20: eval loss {evaluated['loss']:.4f}  "
                       f"accuracy {evaluated['accuracy']:.4f}")
  assert lines[-3] == f"run directory: {where}"
  assert lines[-2] == (f"look further: tensorboard --logdir {where}, or python -m "
                       f"trainer.inspect {where}")
  assert lines[-1] == (f"the model: trainer.load({where!r}) in Python, or the "
                       f"SavedModel in {where}/export")
  # The first line of a process's first loop call says it compiled.
  [first] = [line for line in lines if line.startswith("step ")][:1]
  assert re.search(r"\(compiling: \d+\.\d\d s\)  ETA \?$", first), first
  assert progress.parse_line(first)["train/loss"] > 0  # Sweeps still parse it.


def test_a_task_without_eval_data_trains_alone_by_default(model_dir):
  process = run_cli("--task=export_tasks:Exportable", "--train_steps=4",
                    "--cpu_devices=1", f"--model_dir={model_dir}", python_path=TESTS)
  assert process.returncode == 0, process.stderr
  results = read_results(model_dir)
  assert results["status"] == "completed" and "eval" not in results
  assert process.stdout.strip().splitlines()[-4].startswith(
      "completed at step 4: train loss ")
  with open(os.path.join(model_dir, "flags.txt")) as f:
    assert "--mode=train\n" in f.read()  # What the default resolved to.


@pytest.mark.parametrize("train_steps, points", [(200, 100), (30, 30)])
def test_every_train_scalar_has_about_100_points(model_dir, train_steps, points):
  process = run_cli("--model=mlp", "--cpu_devices=2", f"--train_steps={train_steps}",
                    f"--model_dir={model_dir}")
  assert process.returncode == 0, process.stderr
  scalars = read_scalars(os.path.join(model_dir, "train"))
  every = train_steps // points
  for tag in ("loss", "accuracy", "learning_rate", "gradient_norm",
              "replica_batches/replica_1"):
    assert [step for step, _ in scalars[tag]] == list(
        range(every, train_steps + 1, every)), tag
  # Rates leave out the first loop call (step 1: it traced the loop).
  for tag in ("examples_per_second", "steps_per_second"):
    assert [step for step, _ in scalars[tag]] == list(
        range(2 * every if every == 1 else every, train_steps + 1, every)), tag
  # The ledger's points count every batch so far, at any point inside a call.
  assert scalars["replica_batches/replica_1"][-1] == (train_steps, train_steps)
  assert scalars["replica_batches/replica_0"][4] == (5 * every, 5 * every)


def test_points_inside_a_call_are_the_means_of_their_steps(model_dir):
  process = run_cli("--model=mlp", "--train_steps=20", "--steps_per_loop=10",
                    "--summary_every=1", f"--model_dir={model_dir}")
  assert process.returncode == 0, process.stderr
  losses = [value for _, value in
            read_scalars(os.path.join(model_dir, "train"))["loss"]]
  assert len(losses) == 20
  # results.json's train metrics are the last call's: steps 11 to 20.
  assert sum(losses[10:]) / 10 == pytest.approx(
      read_results(model_dir)["train"]["loss"], rel=1e-6)


def test_help_shows_the_framework_flags_grouped_without_absls():
  process = subprocess.run([sys.executable, "-m", "trainer.main", "--help"],
                           cwd=REPO, env=cli_env(), capture_output=True, text=True,
                           timeout=120, check=False)
  assert process.returncode == 0, process.stderr
  text = process.stdout
  headings = [line for line in text.splitlines() if line.endswith(":")
              and not line.startswith(" ")]
  assert headings[:5] == [
      "What to run, where, and for how long:",
      "Devices and the tf.distribute strategy over them:",
      "Batches and the order of the training examples:",
      "How gradients become updates:",
      "When the loop's actions run: evaluations, checkpoints, summaries, limits:"]
  assert "  --train_steps=200\n" in text and "  --learning_rate=0.001\n" in text
  assert "  --task.dataset=digits  (or --dataset)\n" in text
  assert "--helpfull" in text and "--only_check_args" not in text  # absl's own.
