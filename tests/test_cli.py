"""`python -m trainer.main` in subprocesses: the quickstart end to end, one-line
errors for bad input, signals, SIGKILL and bit-exact resume."""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import (REPO, assert_bit_identical, checkpoint_values, cli_env, run_cold,
                       read_results, run_cli)

SHORT = ["--model=mlp", "--per_replica_batch_size=16", "--optimizer=sgd"]



def _assert_one_line_error(process, *fragments):
  assert process.returncode == 2, process.stdout + process.stderr
  lines = process.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), process.stderr
  assert "Traceback" not in process.stdout + process.stderr
  for fragment in fragments:
    assert fragment in lines[0]


def test_quickstart_end_to_end(model_dir):
  process = run_cli("--flagfile=flags/quickstart.flags", f"--model_dir={model_dir}")
  assert process.returncode == 0, process.stderr
  assert "step 300/300" in process.stdout and "eval at step 300" in process.stdout
  results = read_results(model_dir)
  assert results["status"] == "completed" and results["num_replicas"] == 2
  assert results["replica_batches"] == {"replica_0": 300, "replica_1": 300}
  assert results["eval"]["examples"] == 360 and results["eval"]["accuracy"] > 0.8
  assert [s for s in os.listdir(os.path.join(model_dir, "train"))
          if s.startswith("events.out.tfevents")]
  assert os.path.isdir(os.path.join(model_dir, "export"))
  # The closing lines are the README's, but for the path and the numbers.
  assert _shape(process.stdout.splitlines()[-5:], model_dir) == _shape(
      _readme_closing_lines(), "/home/me/trainer/runs/q1")
  # flags.txt is a flagfile that reproduces the run: rerunning it is a no-op.
  again = run_cli(f"--flagfile={model_dir}/flags.txt")
  assert again.returncode == 0 and "nothing to train" in again.stdout


def _readme_closing_lines():
  """The README's block that shows how the quick start's run ends."""
  with open(os.path.join(REPO, "README.md")) as f:
    text = f.read()
  block = text.split("your numbers differ in the last digits):\n\n```\n")[1]
  return block.split("```")[0].splitlines()


def _shape(lines, model_dir):
  """Lines with the run directory and every number replaced by placeholders."""
  return [re.sub(r"\d+(\.\d+)?", "N", line.replace(model_dir, "DIR"))
          for line in lines]


def test_default_run_needs_no_flags(tmp_path):
  process = run_cold("--train_steps=20", cwd=str(tmp_path))
  assert process.returncode == 0, process.stderr
  (run,) = os.listdir(tmp_path / "runs")
  assert f"model_dir runs/{run}:" in process.stdout
  assert read_results(str(tmp_path / "runs" / run))["global_step"] == 20


def _npz(tmp_path, **arrays):
  path = tmp_path / "data.npz"
  np.savez(path, **arrays)
  return str(path)


@pytest.mark.parametrize("args, fragments", [
    (["--dataset=imagenet"], ["--dataset", "imagenet", "digits"]),
    (["--per_replica_batch_size=0"], ["--per_replica_batch_size=0", ">= 1"]),
    (["--per_replica_batch_size=-3"], ["--per_replica_batch_size=-3", ">= 1"]),
    (["--data_path=/no/such.npz"], ["--data_path=/no/such.npz: no such file"]),
    (["--train_steps=ten"], ["--train_steps", "ten"]),
    (["--no_such_flag=1"], ["no_such_flag"]),
    (["stray"], ["unexpected arguments 'stray'"]),
    (["--cpu_devices=65"], ["--cpu_devices=65", "<= 64"]),
    (["--flagfile=/no/such.flags"], ["/no/such.flags"]),
])
def test_bad_flags_fail_fast_with_one_line(model_dir, args, fragments):
  process = run_cli(f"--model_dir={model_dir}", *args, timeout=60)
  _assert_one_line_error(process, *fragments)
  assert not os.path.exists(model_dir)


def test_bad_input_found_after_startup(tmp_path):
  """Errors that need TensorFlow or the data, in one process each."""
  missing_keys = _npz(tmp_path, x_train=np.zeros((8, 2)), y_train=np.zeros(8, int))
  cases = [
      (["--dataset=npz", f"--data_path={missing_keys}"], "missing array(s) x_test"),
      (["--per_replica_batch_size=2000"], "fewer than one global batch"),
      (["--gpus=3"], "--gpus=3: no GPU 3"),
  ]
  for i, (args, fragment) in enumerate(cases):
    model_dir = str(tmp_path / f"run{i}")
    _assert_one_line_error(run_cli(f"--model_dir={model_dir}", *args), fragment)
    assert not os.path.exists(model_dir)


def test_bad_flags_leave_an_existing_run_untouched(model_dir):
  assert run_cli(f"--model_dir={model_dir}", "--train_steps=5", *SHORT).returncode == 0
  before = {name: open(os.path.join(model_dir, name), "rb").read()
            for name in ("results.json", "flags.txt")}
  _assert_one_line_error(run_cli(f"--model_dir={model_dir}", "--train_steps=9",
                                 "--model=cnn", "--per_replica_batch_size=16",
                                 "--optimizer=sgd"),
                         "--model=cnn (the run has mlp)")
  after = {name: open(os.path.join(model_dir, name), "rb").read() for name in before}
  assert after == before


def _start(*args):
  return subprocess.Popen([sys.executable, "-m", "trainer.main", *args], cwd=REPO,
                          env=cli_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _wait_for_steps(process, count):
  """Reads progress lines until `count` have appeared; returns all output read."""
  seen, output = 0, []
  for line in process.stdout:
    output.append(line)
    seen += line.startswith("step ")
    if seen >= count:
      return "".join(output)
  raise AssertionError("the run ended early:\n" + "".join(output))


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_and_rerun_resumes(model_dir, signal_number):
  args = [f"--model_dir={model_dir}", "--steps_per_loop=10", "--checkpoint_every=5000",
          *SHORT]
  process = _start(*args, "--train_steps=100000")
  _wait_for_steps(process, 2)
  process.send_signal(signal_number)
  output = process.communicate(timeout=60)[0]
  assert process.returncode == 4, output
  assert "saved a checkpoint" in output and "Traceback" not in output
  results = read_results(model_dir)
  step = results["global_step"]
  assert results["status"] == "interrupted" and step % 10 == 0 and step >= 20
  resumed = run_cli(*args, f"--train_steps={step + 10}")
  assert resumed.returncode == 0, resumed.stderr
  assert f"resuming at step {step}" in resumed.stdout
  assert read_results(model_dir)["global_step"] == step + 10


def test_sigkill_never_leaves_an_unresumable_run(model_dir):
  args = [f"--model_dir={model_dir}", "--steps_per_loop=5", "--checkpoint_every=5",
          *SHORT]
  process = _start(*args, "--train_steps=100000")
  _wait_for_steps(process, 3)
  process.kill()
  process.wait()
  assert os.path.exists(os.path.join(model_dir, ".lock"))  # Left behind: stale.
  resumed = run_cli(*args, "--train_steps=200")
  assert resumed.returncode == 0, resumed.stderr
  assert "resuming at step" in resumed.stdout
  assert read_results(model_dir)["global_step"] == 200


def test_resume_is_bit_exact_with_dropout_mid_epoch(tmp_path):
  # digits: 1437 training examples / global batch 64 = 22 steps per epoch, so the
  # resume at step 20 is mid-epoch and step 40 is in the second (reshuffled) epoch.
  args = ["--deterministic", "--dropout=0.3", "--cpu_devices=2",
          "--per_replica_batch_size=32", "--model=cnn", "--checkpoint_every=1000"]
  straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
  assert run_cli(f"--model_dir={straight}", "--train_steps=40", *args).returncode == 0
  assert run_cli(f"--model_dir={split}", "--train_steps=20", *args).returncode == 0
  midway = checkpoint_values(os.path.join(split, "checkpoints"))
  resumed = run_cli(f"--model_dir={split}", "--train_steps=40", *args)
  assert resumed.returncode == 0 and "resuming at step 20" in resumed.stdout
  a = assert_bit_identical(straight, split)
  assert any(k.startswith("rng/") for k in a)
  assert not all(np.array_equal(a[k], midway[k]) for k in a)  # It did train on.


def test_flags_this_mode_ignores_are_said(model_dir):
  process = run_cli(*SHORT, "--train_steps=5", "--eval_every=10", "--mode=train",
                    f"--model_dir={model_dir}")
  assert process.returncode == 0, process.stderr
  assert ("note: --eval_every=10 is ignored with --mode=train: use "
          "--mode=train_and_eval to evaluate") in process.stdout
