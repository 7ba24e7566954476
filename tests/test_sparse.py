"""Sparse gradients (an Embedding's tf.IndexedSlices) keep "N replicas equal one
device": duplicate rows are summed before every optimizer's update, on one
device, on several replicas and on several workers, so each optimizer applies
its dense definition."""

import subprocess
import sys

import numpy as np
import pytest

import trainer
from trainer import config as config_lib

from conftest import REPO, TESTS, float_values, run_cli, run_workers, user_env
OPTIMIZERS = ["sgd", "momentum", "adam", "adamw", "lion"]
# Clipping, accumulation and EMA on: every path a sparse gradient takes.
FLAGS = ["--task=user_tasks:BagOfTokens", "--learning_rate=0.05", "--shuffle=false",
         "--train_steps=6", "--steps_per_loop=3", "--clip_norm=0.05",
         "--grad_accum_steps=2", "--ema_decay=0.9", "--summaries=false"]


def _train(model_dir, *flags):
  return trainer.train(config_lib.from_argv([*FLAGS, *flags,
                                             f"--model_dir={model_dir}"]))


def assert_same_weights(run_a, run_b):
  a, b = float_values(run_a), float_values(run_b)
  assert a.keys() == b.keys() and any(k.startswith("model/") for k in a)
  for key in a:
    np.testing.assert_allclose(a[key], b[key], atol=1e-5, err_msg=key)


@pytest.mark.parametrize("optimizer,accumulation",
                         [(name, 2) for name in OPTIMIZERS] + [("adam", 1)])
def test_two_replicas_equal_one_device(tmp_path, optimizer, accumulation):
  flags = [f"--optimizer={optimizer}", f"--grad_accum_steps={accumulation}"]
  one = _train(tmp_path / "one", *flags, "--cpu_devices=1",
               "--per_replica_batch_size=16")
  two = _train(tmp_path / "two", *flags, "--cpu_devices=2",
               "--per_replica_batch_size=8")
  assert one["global_batch_size"] == two["global_batch_size"] == 16
  assert_same_weights(tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
# What workers add is the sparse all-reduce across processes, the same for every
# optimizer: one without state and one with (each optimizer's own sparse update
# is checked on 2 replicas above).
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_two_workers_equal_one_device(tmp_path, optimizer):
  launched = run_workers(*FLAGS, f"--optimizer={optimizer}",
                         "--per_replica_batch_size=8",
                         f"--model_dir={tmp_path / 'workers'}", python_path=TESTS)
  assert launched.returncode == 0, launched.stdout[-3000:]
  _train(tmp_path / "one", f"--optimizer={optimizer}", "--cpu_devices=1",
         "--per_replica_batch_size=16")
  assert_same_weights(tmp_path / "one", tmp_path / "workers")


def test_replay_dumps_a_sparse_gradient_densely(tmp_path):
  model_dir = tmp_path / "run"
  env = user_env()
  trained = run_cli(*FLAGS, "--optimizer=adam", "--cpu_devices=1",
                    "--per_replica_batch_size=16", "--checkpoint_every=3",
                    f"--model_dir={model_dir}", python_path=TESTS)
  assert trained.returncode == 0, trained.stderr
  dump = tmp_path / "step5.npz"
  replayed = subprocess.run(
      [sys.executable, "-m", "trainer.replay", f"--model_dir={model_dir}",
       "--step=5", f"--dump={dump}"], cwd=REPO, env=env, capture_output=True,
      text=True, timeout=240, check=False)
  assert replayed.returncode == 0, replayed.stderr
  with np.load(dump) as arrays:
    embedding = [k for k in arrays if k.startswith("gradient/") and "embedding" in k]
    assert len(embedding) == 1
    gradient = arrays[embedding[0]]
    assert gradient.shape == (64, 8)  # Dense: one row per token of the vocabulary.
    # Row 0 (padding, in every example) and only looked-up rows have gradients.
    assert np.abs(gradient[0]).sum() > 0
    assert arrays["features/0" if "features/0" in arrays else "features"].shape == (
        32, 12)
