"""The four keras-io programs of examples/ ported with `trainer.fit`: their
numbers are Keras `fit`'s on the same data (as close as their different
shuffles and initial draws allow), and on 2 replicas as on one device: the same
weights where the model has no random layer, the same numbers up to its
dropout's draws where it has. tests/test_fit_workers.py runs them on 2 workers.
"""

import dataclasses
import os

import numpy as np
import pytest

import fit_programs
import trainer
from conftest import read_results


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


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name[4:-3])
def test_example_trains_as_keras_fit_and_on_two_replicas_as_on_one(example,
                                                                   tmp_path):
  keras_dir, one_dir, two_dir = (tmp_path / name for name in ("keras", "1", "2"))
  for directory in (keras_dir, one_dir, two_dir):
    directory.mkdir()
  theirs = fit_programs.run(example.name, keras_dir, fit=fit_programs.keras_fit)
  one = fit_programs.run(example.name, one_dir, f"--model_dir={one_dir / 'run'}")
  two = fit_programs.run(example.name, two_dir, f"--model_dir={two_dir / 'run'}",
                         "--cpu_devices=2")
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
