"""What a Keras user brings keeps Keras's numbers: streaming metric objects
(`Task.build_metrics`) over replicas and workers equal `model.evaluate` on one
device; sample and class weights train as `fit` does; the eval loss is weighted
only by the eval data's own weights."""

import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_tasks
import presets
import trainer
from conftest import (REPO, TESTS, cli_env, one_line_error, read_results, run_cli,
                      run_workers)

TOLERANCE = 1e-6
STREAMING = ("auc", "precision", "recall", "f1", "false_negatives")


def _keras_evaluate(model, task) -> dict:
  """Keras's own evaluate of `model` on the task's eval split, one device, one
  batch per call as Keras picks it (here 64)."""
  metrics = list(keras_tasks.streaming_metrics().values())
  x, y, *weights = task.eval_data()
  # The task's metrics are weighted by the data's weights: Keras' weighted_metrics.
  model.compile(loss=keras.losses.BinaryCrossentropy(),
                **{"weighted_metrics" if weights else "metrics": metrics})
  return model.evaluate(x, y, sample_weight=weights[0] if weights else None,
                        batch_size=64, verbose=0, return_dict=True)


def _check_against_keras(model_dir, task):
  reported = read_results(model_dir)["eval"]
  _, model = trainer.load(model_dir)
  expected = _keras_evaluate(model, task)
  assert reported["examples"] == task.eval_examples
  # Within 1e-6; counts (weighted sums of float32, summed in another order) to
  # 1e-6 of their size.
  for name in ("loss", *STREAMING):
    theirs = float(np.ravel(expected[name])[0])
    assert abs(reported[name] - theirs) <= TOLERANCE * max(1.0, abs(theirs)), (
        name, reported[name], expected[name])
  np.testing.assert_allclose(reported["confusion"], expected["confusion"],
                             rtol=TOLERANCE, atol=TOLERANCE)
  _, _, *weights = task.eval_data()  # Padding counts nowhere:
  np.testing.assert_allclose(np.sum(reported["confusion"]),
                             np.sum(weights[0]) if weights else task.eval_examples,
                             rtol=1e-6)


def test_streaming_metrics_on_two_replicas_equal_keras_evaluate(model_dir):
  task = keras_tasks.Imbalanced()
  results = presets.train(
      "--optimizer=sgd", "--learning_rate=0.2", "--per_replica_batch_size=16",
      "--steps_per_loop=10", task=task, model_dir=model_dir, cpu_devices=2,
      train_steps=40, mode="train_and_eval")
  assert results["status"] == "completed"
  _check_against_keras(model_dir, task)
  record = read_results(model_dir)
  # Training reports them too, reset per loop call: a call of 10 steps counts
  # 10 x 32 examples in its confusion matrix.
  assert np.sum(record["train"]["confusion"]) == 320
  assert set(STREAMING) <= set(record["train"])


@pytest.mark.slow
def test_streaming_metrics_on_two_workers_equal_keras_evaluate(tmp_path):
  model_dir = str(tmp_path / "run")
  result = run_workers("--task=keras_tasks:Imbalanced", "--optimizer=sgd",
                       "--learning_rate=0.2", "--per_replica_batch_size=16",
                       "--train_steps=40", "--steps_per_loop=10",
                       "--mode=train_and_eval", "--cpu_devices=1",
                       f"--model_dir={model_dir}", python_path=TESTS)
  assert result.returncode == 0, result.stdout[-3000:]
  _check_against_keras(model_dir, keras_tasks.Imbalanced())


def test_eval_weights_weigh_the_eval_loss_and_metrics_as_keras_does(model_dir):
  task = keras_tasks.Imbalanced(eval_weights=True)
  presets.train("--optimizer=sgd", "--learning_rate=0.2",
                "--per_replica_batch_size=16", task=task, model_dir=model_dir,
                cpu_devices=2, train_steps=40, mode="train_and_eval")
  _check_against_keras(model_dir, task)


@pytest.mark.parametrize("replicas", [1, 2])
def test_the_eval_padding_never_reaches_a_metric(model_dir, replicas):
  """A metric that counts its examples, ignoring their weights: 100 eval
  examples padded to 128 (Keras evaluate: 100) counted 128."""
  results = presets.train(
      f"--per_replica_batch_size={64 // replicas}", task=keras_tasks.CountingMetric(),
      model_dir=model_dir, cpu_devices=replicas, train_steps=2,
      mode="train_and_eval")
  assert results["eval"]["examples"] == 100
  assert results["eval"]["count"] == 100


@pytest.mark.parametrize("task, name, declared", [
    ("MaxErrorMetric", "max_error", "sum"), ("UnmergeableMetric", "last", "mean")])
def test_a_metric_whose_state_does_not_merge_is_refused_in_one_line(
    model_dir, task, name, declared):
  """A running maximum declared "sum" (Keras's default) summed over 2 replicas
  reported twice the true maximum error; a last batch's mean merged by "mean"
  is no device's. Both are refused before anything is written."""
  process = run_cli(f"--task=keras_tasks:{task}", "--train_steps=5",
                    "--cpu_devices=2", f"--model_dir={model_dir}",
                    python_path=TESTS)
  one_line_error(process, f"Task.build_metrics()[{name!r}]: its state does not "
                 f"merge over replicas by its variables' declared aggregation "
                 f"({declared}): on 8 training examples it gives ")
  assert not os.path.exists(model_dir)


def test_the_merge_check_runs_at_a_per_replica_batch_of_two(model_dir):
  """The probe ran on the per-replica batch (2 here), under the 4 examples the
  check splits: a running maximum declared "sum" passed without a word."""
  process = run_cli("--task=keras_tasks:MaxErrorMetric", "--train_steps=5",
                    "--cpu_devices=2", "--per_replica_batch_size=2",
                    f"--model_dir={model_dir}", python_path=TESTS)
  one_line_error(process, "Task.build_metrics()['max_error']: its state does not "
                 "merge over replicas by its variables' declared aggregation "
                 "(sum): on 4 training examples it gives ")


def test_a_running_maximum_is_right_on_one_replica(model_dir):
  results = presets.train(task=keras_tasks.MaxErrorMetric(), model_dir=model_dir,
                          cpu_devices=1, train_steps=5, mode="train_and_eval")
  _, model = trainer.load(model_dir)
  x, y = keras_tasks.MaxErrorMetric().eval_data()
  largest = np.max(np.abs(y - model.predict(x, verbose=0)))
  assert results["eval"]["max_error"] == pytest.approx(largest, rel=1e-5)


@pytest.mark.slow
def test_a_running_maximum_is_refused_on_two_workers(tmp_path):
  model_dir = str(tmp_path / "run")
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "launch_workers.py"),
       "--num_workers=2", "--grace_seconds=5", "--",
       "--task=keras_tasks:MaxErrorMetric", "--train_steps=5", "--cpu_devices=1",
       f"--model_dir={model_dir}"], cwd=REPO,
      env=cli_env(PYTHONPATH=os.pathsep.join([TESTS, REPO]), TMPDIR=str(tmp_path)),
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 2, result.stdout[-3000:]
  assert ("[worker 0] error: Task.build_metrics()['max_error']: its state does not "
          "merge over replicas") in result.stdout
  assert "Traceback" not in result.stdout
  assert not os.path.exists(model_dir)


def _fit_like_keras(task, *, batch_size, steps, **fit_kwargs):
  """Plain Keras: the task's model, SGD, unshuffled batches of `batch_size`."""
  keras.utils.set_random_seed(0)
  model = keras_tasks.imbalanced_model()
  model.compile(optimizer=keras.optimizers.SGD(0.2),
                loss=keras.losses.BinaryCrossentropy())
  x, y, *weights = task.train_data()
  epochs = steps * batch_size // len(x)
  model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
            sample_weight=weights[0] if weights else None, **fit_kwargs)
  return model


@pytest.mark.parametrize("task, fit_kwargs", [
    (keras_tasks.ImbalancedWeighted(), {}),
    (keras_tasks.ImbalancedClassWeight(), {"class_weight": {0: 0.6, 1: 4.0}}),
], ids=["sample_weight", "class_weight"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_weights_train_as_keras_fit(task, fit_kwargs, replicas, tmp_path):
  model_dir = str(tmp_path / "run")
  # 512 examples in batches of 64, unshuffled: the batches Keras' fit makes.
  presets.train("--optimizer=sgd", "--learning_rate=0.2", "--shuffle=false",
                "--global_batch_size=64", task=task, model_dir=model_dir,
                cpu_devices=replicas, train_steps=24, mode="train_and_eval")
  expected = _fit_like_keras(task, batch_size=64, steps=24, **fit_kwargs)
  _, model = trainer.load(model_dir)
  for ours, theirs in zip(model.weights, expected.weights):
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-5,
                               err_msg=ours.path)
  # The eval loss is not weighted by the class weights: Keras' val_loss.
  reported = read_results(model_dir)["eval"]
  assert abs(reported["loss"] - _keras_evaluate(model, task)["loss"]) <= TOLERANCE


def test_class_weight_flag_overrides_the_tasks(tmp_path):
  flags = ("--optimizer=sgd", "--learning_rate=0.2", "--shuffle=false",
           "--global_batch_size=64")
  by_flag, by_task = str(tmp_path / "flag"), str(tmp_path / "task")
  presets.train(*flags, "--class_weight=0:0.6,1:4", task=keras_tasks.Imbalanced(),
                model_dir=by_flag, train_steps=8)
  presets.train(*flags, task=keras_tasks.ImbalancedClassWeight(), model_dir=by_task,
                train_steps=8)
  _, a = trainer.load(by_flag)
  _, b = trainer.load(by_task)
  for x, y in zip(a.weights, b.weights):
    np.testing.assert_array_equal(x.numpy(), y.numpy())


@pytest.mark.parametrize("value", ["0:1,x:2", "1:-2", "0:1,1:inf", ""])
def test_bad_class_weight_flag_is_one_line(value, model_dir):
  process = run_cli("--dataset=digits", "--model=mlp", f"--class_weight={value}",
                    f"--model_dir={model_dir}")
  one_line_error(process, f"--class_weight={value}: must be CLASS:WEIGHT pairs")


def test_dict_outputs_name_the_output_a_metric_reads_and_finalize_sees_sums(
    model_dir):
  task = keras_tasks.DictOutputs()
  results = presets.train("--per_replica_batch_size=16", "--steps_per_loop=5",
                          task=task, model_dir=model_dir, cpu_devices=2,
                          train_steps=10, mode="train_and_eval")
  x, y = task.eval_data()
  _, model = trainer.load(model_dir)
  auc = keras.metrics.AUC()
  auc.update_state(y, model(x)["probability"])
  assert results["eval"]["auc"] == pytest.approx(float(auc.result()), abs=TOLERANCE)
  assert results["eval"]["positives"] == float(np.sum(y))  # A sum, not a mean.
  assert results["eval"]["counted"] == 203 == results["eval"]["examples"]
  assert results["train"]["counted"] == 5 * 32  # The last call's 5 steps.


def test_class_weights_of_soft_and_float_labels_are_keras_fits():
  """Keras rounds a single column of labels (0.9 is class 1) and takes the argmax
  of rows; trainer truncated 0.9 to class 0."""
  import tensorflow as tf
  from keras.src.trainers.data_adapters import data_adapter_utils
  from trainer.training.objective import Objective
  class_weight = {0: 1.0, 1: 0.0, 2: 3.0}
  objective = Objective(keras_tasks.Imbalanced(), streaming={},
                        class_weight=class_weight)
  for labels in (np.array([[0.9], [0.2], [0.5], [1.5], [2.2]], np.float32),
                 np.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0, 0, 1.0]],
                          np.float32)):
    outputs = np.full(labels.shape[:1] + (1,), 0.3, np.float32)
    if labels.shape[-1] > 1:
      outputs = np.full(labels.shape, 0.3, np.float32)
    ones = tf.ones(len(labels))
    unweighted = objective.loss(labels, outputs, ones, training=False).numpy()
    weighted = objective.loss(labels, outputs, ones, training=True).numpy()
    expected = data_adapter_utils.class_weight_to_sample_weights(labels,
                                                                 class_weight)
    np.testing.assert_allclose(weighted, unweighted * expected, rtol=1e-6)


def test_class_weights_need_class_labels(model_dir):
  """The regression task's targets (negative, not integers) are no class ids:
  refused before training, naming the flag (it ended mid-run in a GatherV2
  traceback)."""
  with pytest.raises(trainer.errors.ConfigError, match=re.escape(
      "--class_weight: class weights need class labels (integers >= 0, one-hot "
      "rows, or soft binary labels in [0, 1]), but Task.train_data()'s labels "
      "include -")):
    presets.train("--task=regression", "--class_weight=0:2", model_dir=model_dir)
  assert not os.path.exists(model_dir)


def test_a_huge_class_id_builds_no_table_as_large(model_dir):
  """--class_weight=100000000000:1 ended in MemoryError (a dense table)."""
  results = presets.train(*presets.FAST, "--class_weight=100000000000:1,3:2",
                          model_dir=model_dir, train_steps=3)
  assert results["status"] == "completed"


def test_a_tasks_negative_class_weight_is_refused_as_the_flags_is(model_dir):
  task = keras_tasks.ImbalancedClassWeight()
  task.class_weight = {0: -5}
  with pytest.raises(trainer.errors.TaskError, match=re.escape(
      "Task.class_weight must be a dict of class ids (int >= 0) to finite weights "
      ">= 0, got {0: -5}")):
    presets.train(task=task, model_dir=model_dir, train_steps=2)
  assert not os.path.exists(model_dir)
