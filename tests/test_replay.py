"""Divergence you can replay: divergence.json names the step, the examples and the
first non-finite gradient, and `python -m trainer.replay` recomputes the same
numbers bit for bit (under --deterministic)."""

import json
import os

import numpy as np
import pytest

from conftest import read_results, run_cli, run_replay
from trainer.tasks.regression import load_diabetes
from trainer.training.divergence import format_report

# SGD at rate 30 on the regression task: the loss and gradients overflow at step 4
# (step 3 is still finite), after the checkpoint of step 2.
DIVERGING = ["--task=regression", "--optimizer=sgd", "--learning_rate=30",
             "--train_steps=100", "--checkpoint_every=2", "--steps_per_loop=10",
             "--deterministic"]


replay = run_replay


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp("diverged") / "run")
  result = run_cli(*DIVERGING, f"--model_dir={model_dir}")
  return model_dir, result


def test_divergence_names_step_examples_and_layer(diverged):
  model_dir, result = diverged
  assert result.returncode == 3, result.stdout + result.stderr
  error = result.stderr.strip().splitlines()
  assert len(error) == 1 and error[0].startswith(
      "error: non-finite loss or gradients at step 4 (loss inf, gradient norm ")
  assert (f"replay it with: python -m trainer.replay --model_dir={model_dir} "
          "--step=4") in error[0]
  with open(os.path.join(model_dir, "divergence.json")) as f:
    report = json.load(f)
  assert report["step"] == 4 and report["finite"] is False
  assert report["checkpoint"] == "ckpt-2" and report["checkpoint_step"] == 2
  names = [name for name, _ in report["gradient_norms"]]
  assert report["first_nonfinite_gradient"] in names
  assert f"first non-finite gradient {report['first_nonfinite_gradient']}" in error[0]
  assert report["loss"] == "inf"
  assert len(report["examples"]["indices"]) == 32
  assert len(set(report["examples"]["indices"])) == 32  # One epoch: no repeats.
  results = read_results(model_dir)
  assert results["status"] == "diverged" and results["divergence"] == "divergence.json"


def test_replay_prints_the_same_numbers_and_dumps_the_batch(diverged, tmp_path):
  model_dir, _ = diverged
  with open(os.path.join(model_dir, "divergence.json")) as f:
    report = json.load(f)
  before = sorted(os.listdir(model_dir))
  dump = str(tmp_path / "step4.npz")
  replayed = replay(f"--model_dir={model_dir}", "--step=4", f"--dump={dump}")
  assert replayed.returncode == 0, replayed.stderr
  assert format_report(report) in replayed.stdout  # Every float, exactly.
  assert sorted(os.listdir(model_dir)) == before  # The run is only read.
  arrays = np.load(dump)
  indices = arrays["example_indices"]
  assert indices.tolist() == report["examples"]["indices"]
  diabetes = load_diabetes()
  np.testing.assert_array_equal(arrays["features"], diabetes.x_train[indices])
  np.testing.assert_array_equal(arrays["labels"], diabetes.y_train[indices])
  bad = arrays[f"gradient/{report['first_nonfinite_gradient']}"]
  assert not np.isfinite(bad).all()


@pytest.mark.parametrize("args, code, fragment", [
    (["--step=0"], 2, "--step=0: must be >= 1"),
    (["--step=3", "--dump=out.txt"], 2,
     "--dump=out.txt: must be a path ending in .npz"),
    (["--step=3", "--dump=/nonexistent/d/s.npz"], 2,
     "--dump=/nonexistent/d/s.npz: no directory /nonexistent/d to write it in"),
    # A step the run never trained: refused at once, naming the run's last.
    (["--step=100000"], 2, "--step=100000: the run in "),
])
def test_replay_bad_input_is_one_line(diverged, args, code, fragment):
  model_dir, _ = diverged
  result = replay(f"--model_dir={model_dir}", *args)
  assert result.returncode == code
  assert result.stderr.count("\n") == 1 and fragment in result.stderr


def test_replay_of_a_directory_that_is_not_a_run(tmp_path):
  result = replay(f"--model_dir={tmp_path}", "--step=3")
  assert result.returncode == 2
  assert result.stderr.strip() == (f"error: --model_dir={tmp_path}: no flags.txt, not "
                                   "a trainer run")


def test_replay_of_a_finite_step_reproduces_what_training_logged(diverged):
  """Not only itself: the replayed step 2 has the gradient norm that the train
  loop computed and logged to TensorBoard at step 2 (the last step of a call)."""
  from conftest import read_scalars
  model_dir, _ = diverged
  replayed = replay(f"--model_dir={model_dir}", "--step=2")
  assert replayed.returncode == 0, replayed.stderr
  assert "step 2 (replayed from ckpt-0):" in replayed.stdout
  logged = dict(read_scalars(os.path.join(model_dir, "train"))["gradient_norm"])[2]
  norm = float(replayed.stdout.split("  gradient norm ")[1].split()[0])
  assert np.float32(norm) == np.float32(logged)


def test_replay_trains_at_the_rate_left_by_the_last_rollback(diverged, tmp_path):
  """After --on_nan=rollback lowered the rate (rollbacks.json), the replayed steps
  use the lowered rate: step 4's loss, which follows step 3's update, changes."""
  import shutil
  model_dir, _ = diverged
  halved = str(tmp_path / "halved")
  shutil.copytree(model_dir, halved)
  with open(os.path.join(halved, "rollbacks.json"), "w") as f:
    # Far below the real 0.5 per rollback, so that step 4 stays finite.
    json.dump({"rollbacks": 1, "lr_multiplier": 0.001, "step": 2}, f)
  losses = []
  for directory in (model_dir, halved):
    replayed = replay(f"--model_dir={directory}", "--step=4")
    assert replayed.returncode == 0, replayed.stderr
    losses.append(replayed.stdout.split("  loss ")[1].split()[0])
  assert losses[0] == "inf" and losses[1] != "inf", losses
