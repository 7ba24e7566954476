"""What an export takes: any batch size (a model built without keras.Input too),
Python numbers and numpy columns alike, and only what serving uses of the task
(an augmentation model kept for the input pipeline is left out)."""

import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

import export_tasks
import trainer
from conftest import TESTS, cli_env, run_cli


def _train(model_dir, task):
  return trainer.train(trainer.Config(train_steps=3, per_replica_batch_size=16,
                                      model_dir=str(model_dir), summaries=False),
                       task=task)


def _saved_model_cli(*args):
  return subprocess.run(
      [os.path.join(os.path.dirname(sys.executable), "saved_model_cli"), *args],
      env=cli_env(), capture_output=True, text=True, timeout=120, check=False)


def test_a_model_without_keras_input_serves_any_batch(tmp_path):
  """The README's kind of model (a Sequential built by its first call, on a
  probe batch of 8) exported a signature of exactly 8 rows."""
  _train(tmp_path / "run", export_tasks.NoInput())
  export = str(tmp_path / "run" / "export")
  shown = _saved_model_cli("show", "--dir", export, "--all")
  assert "shape: (-1, 3)" in shown.stdout, shown.stdout
  _, model = trainer.load(str(tmp_path / "run"))
  for rows in (1, 3):
    x = np.random.default_rng(rows).normal(size=(rows, 3)).astype("float32")
    np.save(str(tmp_path / "x.npy"), x)
    out = tmp_path / f"out{rows}"
    served = _saved_model_cli("run", "--dir", export, "--tag_set", "serve",
                              "--signature_def", "serving_default", "--inputs",
                              f"inputs={tmp_path / 'x.npy'}", "--outdir", str(out))
    assert served.returncode == 0, served.stderr[-2000:]
    np.testing.assert_allclose(np.load(str(out / "outputs.npy")),
                               model(x, training=False), atol=1e-6)


def test_python_numbers_and_numpy_columns_both_serve(tmp_path):
  """Columns stored int64 and float64 (pandas): the export takes the original
  program's own inference dict (int32 and float32 tensors) and numpy's alike;
  the signature takes float32 (the model's dtype) and int64. An augmentation
  Sequential kept on the task for the input pipeline no longer blocks it."""
  _train(tmp_path / "run", export_tasks.Table())
  loaded = tf.saved_model.load(str(tmp_path / "run" / "export"))
  task, model = trainer.load(str(tmp_path / "run"))
  stored = export_tasks.table(3, seed=5)
  expected = model(task.preprocess(stored), training=False).numpy()
  python = {"age": tf.constant(stored["age"].astype("int32")),
            "chol": tf.constant(stored["chol"].astype("float32"))}
  numpy = {name: tf.constant(value) for name, value in stored.items()}
  for features in (python, numpy):
    np.testing.assert_allclose(loaded.serve(features)["outputs"], expected,
                               atol=1e-5)
  signature = loaded.signatures["serving_default"]
  assert {name: spec.dtype for name, spec in
          signature.structured_input_signature[1].items()} == {
              "age": tf.int64, "chol": tf.float32}
  np.testing.assert_allclose(
      signature(age=numpy["age"], chol=python["chol"])["outputs"], expected,
      atol=1e-5)


def test_only_what_serving_reads_of_a_task_attribute_is_saved(tmp_path):
  """Task.scaler's own tf.function reads a lookup table it does not track, so
  it cannot be saved whole; preprocess reads only its variable, which is (a
  tf.data iterator that preprocess reads is named: tests/test_export.py)."""
  result = run_cli("--task=export_tasks:Scaled", "--train_steps=3",
                   f"--model_dir={tmp_path / 'run'}", python_path=TESTS)
  assert result.returncode == 0, result.stderr[-2000:]
  task, model = trainer.load(str(tmp_path / "run"))
  x = np.random.default_rng(3).normal(size=(2, 3)).astype("float32")
  loaded = tf.saved_model.load(str(tmp_path / "run" / "export"))
  np.testing.assert_allclose(loaded.serve(tf.constant(x))["outputs"],
                             model(task.preprocess(x), training=False), atol=1e-6)


def test_an_augmentation_model_kept_on_the_task_is_left_out(tmp_path):
  """keras-io's recipe, self.augment = keras.Sequential([RandomFlip(),
  RandomRotation(0.1)]) mapped over the training data, ended every run with
  exit 8."""
  result = run_cli("--task=export_tasks:Augmented", "--train_steps=3",
                   f"--model_dir={tmp_path / 'run'}", python_path=TESTS)
  assert result.returncode == 0, result.stderr[-2000:]
  loaded = tf.saved_model.load(str(tmp_path / "run" / "export"))
  x = export_tasks.features("augment", 2, seed=3)
  assert loaded.serve(tf.constant(x))["outputs"].shape == (2, 2)
