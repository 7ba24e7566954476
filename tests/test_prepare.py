"""A task that prepares itself (Task.prepare: a TextVectorization adapted after the
devices are set up): raw strings through training, evaluation and the export; a
changed vocabulary refused on resume; and the mistakes a Keras user makes when
porting (TensorFlow work in __post_init__, batched datasets) as one line."""

import json
import os
import subprocess
import sys

import pytest

from conftest import (TESTS, assert_bit_identical, cli_env, one_line_error,
                      read_results, run_cli)

TEXT = ["--task=user_tasks:TextBag", "--cpu_devices=2", "--per_replica_batch_size=8",
        "--train_steps=20", "--steps_per_loop=10", "--learning_rate=0.05",
        "--mode=train_and_eval"]


_SERVE = """
import json, sys
import numpy as np, tensorflow as tf
sys.path.insert(0, {tests!r})
import user_tasks
texts, labels = user_tasks._texts(60, seed=1)
serve = tf.saved_model.load({export!r}).signatures["serving_default"]
logits = next(iter(serve(tf.constant(texts)).values())).numpy()
print(json.dumps(float(np.mean((logits > 0) == (labels > 0)))))
"""


def test_raw_strings_train_evaluate_and_serve_from_the_export(model_dir):
  trained = run_cli(*TEXT, f"--model_dir={model_dir}", python_path=TESTS)
  assert trained.returncode == 0, trained.stderr
  results = read_results(model_dir)
  assert results["eval"]["examples"] == 60
  # A fresh process, without the task: the export carries the vocabulary.
  served = subprocess.run(
      [sys.executable, "-c", _SERVE.format(tests=TESTS, export=os.path.join(
          model_dir, "export"))], env=cli_env(), capture_output=True, text=True,
      timeout=120, check=False)
  assert served.returncode == 0, served.stderr
  assert json.loads(served.stdout) == pytest.approx(results["eval"]["accuracy"],
                                                    abs=1e-6)


def test_string_arrays_keep_the_seeded_order_and_resume_bit_exactly(tmp_path):
  flags = [*TEXT, "--task=user_tasks:TextArrays", "--mode=train", "--seed=4"]
  straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
  assert run_cli(*flags, f"--model_dir={straight}", python_path=TESTS).returncode == 0
  first = run_cli(*flags, "--train_steps=10", f"--model_dir={split}",
                  python_path=TESTS)
  assert first.returncode == 0, first.stderr
  resumed = run_cli(*flags, f"--model_dir={split}", python_path=TESTS)
  assert resumed.returncode == 0, resumed.stderr
  assert "resuming at step 10" in resumed.stdout
  assert_bit_identical(straight, split)


def test_a_resource_the_export_cannot_find_is_one_line(model_dir):
  process = run_cli(*TEXT, "--task.hide_vectorizer=true", f"--model_dir={model_dir}",
                    python_path=TESTS)
  one_line_error(process, "uses StaticHashTable (a TensorFlow resource) that is "
                 "neither the model's nor an attribute of the task", code=8)
  assert read_results(model_dir)["status"] == "unexported"
  assert os.path.exists(os.path.join(model_dir, "checkpoints", "ckpt-20.index"))


def test_a_resume_that_prepares_another_vocabulary_is_refused(model_dir):
  first = run_cli(*TEXT, "--mode=train", f"--model_dir={model_dir}", python_path=TESTS)
  assert first.returncode == 0, first.stderr
  resumed = run_cli(*TEXT, "--mode=train", "--train_steps=30", "--task.extra_words=5",
                    f"--model_dir={model_dir}", python_path=TESTS)
  one_line_error(resumed, "trained on other data (prepared differ")


def test_tensorflow_work_before_the_devices_names_the_task(model_dir):
  process = run_cli(*TEXT, "--task=user_tasks:EarlyAdapt", f"--model_dir={model_dir}",
                    python_path=TESTS)
  one_line_error(process, "EarlyAdapt(...) (its __init__ or __post_init__) ran "
                  "TensorFlow before the devices were set up; do that work in "
                  "Task.prepare()")
  assert not os.path.exists(model_dir)


def test_a_batched_dataset_trains_on_its_examples(model_dir):
  """A Keras user's windows as they had them, batched by 32: unbatched and
  batched again to the per-replica batch, said once (it was refused)."""
  process = run_cli("--task=user_tasks:BatchedSeries", "--train_steps=20",
                    "--per_replica_batch_size=8", f"--model_dir={model_dir}",
                    python_path=TESTS)
  assert process.returncode == 0, process.stderr[-2000:]
  assert ("Task.train_data(): the dataset yields batches; the framework unbatches "
          "them and batches the examples again") in process.stdout
  assert read_results(model_dir)["replica_examples"] == {"replica_0": 160}


def test_the_export_takes_the_models_input_shape_where_the_data_has_none(model_dir):
  process = run_cli("--task=user_tasks:BatchedSeries", "--task.batched=false",
                    "--train_steps=4", f"--model_dir={model_dir}", python_path=TESTS)
  assert process.returncode == 0, process.stderr
  served = subprocess.run(
      [sys.executable, "-c", "import tensorflow as tf; s = tf.saved_model.load("
       f"{os.path.join(model_dir, 'export')!r}).signatures['serving_default']; "
       "print(s.structured_input_signature[1]['inputs'].shape)"],
      env=cli_env(), capture_output=True, text=True, timeout=120, check=False)
  assert served.stdout.strip() == "(None, 12, 3)", served.stderr


def test_preprocess_runs_once_over_arrays_bit_exactly_and_the_export_takes_raw_text(
    tmp_path):
  """--preprocess_once (the default) vectorizes the string arrays once, before
  training, and the replicas gather the token ids: the same weights, bit for
  bit, as vectorizing every batch; the export still takes the raw strings."""
  import numpy as np
  import tensorflow as tf

  import trainer
  import user_tasks
  from trainer.data.preprocessed import PreprocessedArrays
  from trainer.training import setup
  flags = [*TEXT, "--task=user_tasks:TextArrays", "--mode=train", "--deterministic"]
  once, per_batch = str(tmp_path / "once"), str(tmp_path / "per_batch")
  assert run_cli(*flags, f"--model_dir={once}", python_path=TESTS).returncode == 0
  assert run_cli(*flags, "--preprocess_once=false", f"--model_dir={per_batch}",
                 python_path=TESTS).returncode == 0
  assert_bit_identical(once, per_batch)
  config, task = setup.resolve_task(trainer.Config(
      task="user_tasks:TextArrays", cpu_devices=2, model_dir=str(tmp_path / "b")))
  built = setup.build(config, task)
  assert isinstance(built.train_data, PreprocessedArrays)
  assert built.train_data.features["tokens"].dtype == np.int64  # Gathered ids.
  assert built.train_data.feature_spec["text"].dtype == tf.string  # As stored.
  features, _ = user_tasks.TextArrays()._arrays(5, seed=7)
  loaded = tf.saved_model.load(os.path.join(once, "export"))
  served = loaded.serve(
      {"text": tf.constant(features["text"].astype(str)),
       "length": tf.constant(features["length"])})
  task, model = trainer.load(once)
  expected = model(task.preprocess({k: tf.constant(v.astype(str) if k == "text"
                                                   else v)
                                    for k, v in features.items()}))
  np.testing.assert_allclose(served["outputs"], expected, atol=1e-6)


def test_a_random_preprocess_under_deterministic_runs_per_batch(tmp_path):
  """--preprocess_once traced a random preprocess to decide whether it could
  run once; under --deterministic an unseeded random op cannot be traced
  without a global seed, and the run exited 1 blaming Task.preprocess. Now it
  runs per batch (one line says so), as with --preprocess_once=false."""
  flags = ["--task=user_tasks:NoisyPreprocess", "--train_steps=10",
           "--deterministic", "--mode=train"]
  once = run_cli(*flags, f"--model_dir={tmp_path / 'once'}", python_path=TESTS)
  assert once.returncode == 0, once.stderr[-2000:]
  assert ("Task.train_data(): Task.preprocess draws random numbers or keeps "
          "state, so it runs on every batch") in once.stdout
  per_batch = run_cli(*flags, "--preprocess_once=false",
                      f"--model_dir={tmp_path / 'per_batch'}", python_path=TESTS)
  assert per_batch.returncode == 0, per_batch.stderr[-2000:]
  assert_bit_identical(tmp_path / "once", tmp_path / "per_batch")
