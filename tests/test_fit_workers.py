"""The keras-io programs of examples/, unchanged, on 2 workers:
`launch_workers.py --num_workers=2 -- python examples/X.py` trains them as 2
replicas in one process do (each worker's replica draws its dropout as that
replica does), and, for the model without a random layer, as one device: the
same weights. The programs that run TensorFlow before trainer.fit (their
datasets) are restarted once by it, with the strategy made first."""

import os
import subprocess
import sys

import numpy as np
import pytest

import fit_programs
from conftest import REPO, cli_env, float_values, read_results
from test_fit_examples import EXAMPLES

pytestmark = pytest.mark.slow  # Two processes per example: about a minute each.


def _launch(example, directory, model_dir):
  return subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "launch_workers.py"),
       "--num_workers=2", "--grace_seconds=5", "--", sys.executable,
       os.path.join(fit_programs.EXAMPLES, example.name), "--deterministic",
       f"--model_dir={model_dir}"],
      cwd=directory, env=cli_env(PYTHONPATH=REPO, TMPDIR=str(directory)),
      capture_output=True, text=True, timeout=420, check=False)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name[4:-3])
def test_example_on_two_workers_trains_as_in_one_process(example, tmp_path):
  workers_dir, local_dir = tmp_path / "workers", tmp_path / "local"
  workers_dir.mkdir()
  local_dir.mkdir()
  launched = _launch(example, workers_dir, workers_dir / "run")
  assert launched.returncode == 0, launched.stdout[-4000:] + launched.stderr[-2000:]
  restarted = "restarting the program as python -m trainer.keras_fit" in (
      launched.stdout)
  assert restarted == (example.name in ("fit_text_classification.py",
                                        "fit_weather_forecast.py"))
  # The reference: 2 replicas where dropout draws per replica, else 1 device.
  replicas = 1 if example.replicas_tolerance is None else 2
  local = fit_programs.run(example.name, local_dir,
                           f"--model_dir={local_dir / 'run'}",
                           f"--cpu_devices={replicas}")
  results = read_results(str(workers_dir / "run"))
  assert results["num_workers"] == 2 and results["status"] == "completed"
  ours = float_values(str(workers_dir / "run"))
  theirs = float_values(str(local_dir / "run"))
  model_keys = [key for key in ours if key.startswith("model/")]
  assert model_keys
  for key in model_keys:
    np.testing.assert_allclose(ours[key], theirs[key], atol=1e-5, err_msg=key)
  final = results["eval"]
  for key, values in local.history.items():
    if key.startswith("val_"):
      assert final[key[4:]] == pytest.approx(values[-1], rel=1e-4, abs=1e-6), key
  # Only the chief wrote the callbacks' files.
  for name in example.files:
    assert os.path.isfile(workers_dir / name)
