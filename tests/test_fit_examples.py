"""The four keras-io programs of examples/ ported with `trainer.fit`: their
numbers are Keras `fit`'s on the same data (as close as their different
shuffles and initial draws allow), and on 2 replicas as on one device: the same
weights where the model has no random layer, the same numbers up to its
dropout's draws where it has; and on 2 workers
(`launch_workers.py --num_workers=2 -- python examples/X.py`) as 2 replicas in
one process (each worker's replica draws its dropout as that replica does) or,
for the model without a random layer, as one device. The programs that run
TensorFlow before trainer.fit (their datasets) are restarted once by it there,
with the strategy made first.
"""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

import fit_programs
import trainer
from conftest import REPO, cli_env, float_values, read_results


@dataclasses.dataclass(frozen=True)
class Example:
  """An example and how close its runs must come.

  Attributes:
    name: its file in examples/.
    metric: the validation value compared ("val_loss", "val_accuracy"...).
    keras_tolerance: |ours - Keras fit's| allowed (their shuffles differ).
    replicas_tolerance: |2 replicas - 1 device| allowed (None: no random layer,
      the weights agree to 1e-5).
    files: what its callbacks write in its working directory.
  """
  name: str
  metric: str
  keras_tolerance: float
  replicas_tolerance: float = None
  files: tuple = ()


EXAMPLES = [
    Example("fit_mnist_convnet.py", "val_accuracy", 0.06, replicas_tolerance=0.05),
    Example("fit_imbalanced.py", "val_accuracy", 0.06, replicas_tolerance=0.05,
            files=tuple(f"fraud_model_at_epoch_{e}.keras" for e in (1, 30))),
    Example("fit_text_classification.py", "val_accuracy", 0.06,
            replicas_tolerance=0.05),
    Example("fit_weather_forecast.py", "val_loss", 0.03,
            files=("model_checkpoint.weights.h5",)),
]


def _value(history, example: Example) -> float:
  if example.metric == "val_accuracy" and "val_tp" in history.history:
    logs = {k: v[-1] for k, v in history.history.items()}
    return (logs["val_tp"] + logs["val_tn"]) / sum(
        logs[f"val_{k}"] for k in ("tp", "tn", "fp", "fn"))
  return history.history[example.metric][-1]


@dataclasses.dataclass(frozen=True)
class Ran:
  """An example's run with trainer.fit: its working directory (its run in
  `directory / "run"`) and the History trainer.fit returned."""
  directory: object
  history: object


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """`runs(example, replicas)`: the example's trainer.fit run on 1 device or 2
  replicas, made once in this module (the 2-worker test compares with them)."""
  made = {}

  def run(example: Example, replicas: int) -> Ran:
    if (example.name, replicas) not in made:
      directory = tmp_path_factory.mktemp(f"{example.name[4:-3]}-{replicas}")
      made[example.name, replicas] = Ran(directory, fit_programs.run(
          example.name, directory, f"--model_dir={directory / 'run'}",
          f"--cpu_devices={replicas}"))
    return made[example.name, replicas]

  return run


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name[4:-3])
def test_example_trains_as_keras_fit_and_on_two_replicas_as_on_one(example,
                                                                   tmp_path, runs):
  keras_dir = tmp_path / "keras"
  keras_dir.mkdir()
  theirs = fit_programs.run(example.name, keras_dir, fit=fit_programs.keras_fit)
  one_dir, one = runs(example, 1).directory, runs(example, 1).history
  two_dir, two = runs(example, 2).directory, runs(example, 2).history
  print(example.name, _value(theirs, example), _value(one, example),
        _value(two, example))
  # Keras's keys, in each epoch.
  assert set(one.history) == set(theirs.history)
  assert len(one.epoch) == len(theirs.epoch)
  assert abs(_value(one, example) - _value(theirs, example)) <= (
      example.keras_tolerance)
  # The History is the run's: its last epoch's is the final evaluation.
  final = read_results(str(one_dir / "run"))["eval"]
  for key, values in one.history.items():
    if key.startswith("val_"):
      assert final[key[4:]] == pytest.approx(values[-1], rel=1e-6), key
  assert read_results(str(two_dir / "run"))["num_replicas"] == 2
  if example.replicas_tolerance is None:
    _, a = trainer.load(str(one_dir / "run"), task=one.task)
    _, b = trainer.load(str(two_dir / "run"), task=two.task)
    for x, y in zip(a.weights, b.weights):
      np.testing.assert_allclose(x.numpy(), y.numpy(), atol=1e-5, err_msg=x.path)
  else:
    assert abs(_value(one, example) - _value(two, example)) <= (
        example.replicas_tolerance)
  for name in example.files:
    assert os.path.isfile(one_dir / name) and os.path.isfile(two_dir / name)


@pytest.mark.slow  # Two processes per example: about a minute each.
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name[4:-3])
def test_example_on_two_workers_trains_as_in_one_process(example, tmp_path, runs):
  launched = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "launch_workers.py"),
       "--num_workers=2", "--grace_seconds=5", "--", sys.executable,
       os.path.join(fit_programs.EXAMPLES, example.name), "--deterministic",
       f"--model_dir={tmp_path / 'run'}"],
      cwd=tmp_path, env=cli_env(PYTHONPATH=REPO, TMPDIR=str(tmp_path)),
      capture_output=True, text=True, timeout=420, check=False)
  assert launched.returncode == 0, launched.stdout[-4000:] + launched.stderr[-2000:]
  restarted = "restarting the program as python -m trainer.keras_fit" in (
      launched.stdout)
  assert restarted == (example.name in ("fit_text_classification.py",
                                        "fit_weather_forecast.py"))
  # The reference: 2 replicas where dropout draws per replica, else 1 device.
  local = runs(example, 1 if example.replicas_tolerance is None else 2)
  results = read_results(str(tmp_path / "run"))
  assert results["num_workers"] == 2 and results["status"] == "completed"
  ours = float_values(str(tmp_path / "run"))
  theirs = float_values(str(local.directory / "run"))
  model_keys = [key for key in ours if key.startswith("model/")]
  assert model_keys
  for key in model_keys:
    np.testing.assert_allclose(ours[key], theirs[key], atol=1e-5, err_msg=key)
  final = results["eval"]
  for key, values in local.history.history.items():
    if key.startswith("val_"):
      assert final[key[4:]] == pytest.approx(values[-1], rel=1e-4, abs=1e-6), key
  # Only the chief wrote the callbacks' files.
  for name in example.files:
    assert os.path.isfile(tmp_path / name)
