"""BatchNormalization on N replicas equals one device on the models people write:
masked (Masking, Embedding(mask_zero=True)), raw features of a large mean, a
replica-dependent number of rows, an empty replica; the statistics are exact
global moments (trainer/training/global_moments.py), and what cannot be
synchronized is refused or left alone in one line."""

import importlib.metadata
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
import tensorflow as tf

import trainer
from trainer import internals
from trainer.errors import TaskError
from trainer.training import global_moments

from conftest import (REPO, TESTS, assert_bit_identical, cli_env, float_values,
                      one_line_error, run_cli, run_workers)
from layer_tasks import (BatchNormTask, MaskedNormTask, OwnMomentsTask,
                         RawFeatureNormTask, RecurrentNormTask, RenormTask,
                         SelectedRowsNormTask)

SGD = dict(optimizer="sgd", learning_rate=0.1, train_steps=20, steps_per_loop=5,
           summaries=False, mode="train")


def _train(model_dir, *, replicas, task, **changes):
  fields = dict(SGD, cpu_devices=replicas, per_replica_batch_size=32 // replicas,
                model_dir=str(model_dir))
  fields.update(changes)
  return trainer.train(trainer.Config(**fields), task=task)


def max_difference(run_a, run_b) -> float:
  """The largest difference of the runs' model weights, each relative to the
  weight's magnitude where it is above 1 (a moving mean of 1e3 has a float32
  spacing of 6e-5)."""
  a, b = float_values(run_a), float_values(run_b)
  keys = [k for k in a if k.startswith("model/")]
  assert keys and a.keys() == b.keys()
  return max(float(np.max(np.abs(a[k] - b[k]) / np.maximum(1.0, np.abs(a[k]))))
             for k in keys)


@pytest.mark.parametrize("task", [
    MaskedNormTask(), MaskedNormTask(embedding=True), RawFeatureNormTask(scale=1e3)],
    ids=["masking", "embedding_mask", "raw_features_1e3"])
def test_two_replicas_equal_one_device(tmp_path, task):
  """Keras's synchronized moments ignore a mask (1.1e-2 apart) and take
  E[x²] - E[x]² in float32 (6.4e-3 apart at a mean of 1e3)."""
  _train(tmp_path / "one", replicas=1, task=task)
  _train(tmp_path / "two", replicas=2, task=task)
  assert max_difference(tmp_path / "one", tmp_path / "two") <= 1e-5


def test_a_replica_dependent_row_count_and_an_empty_replica(tmp_path):
  """A BatchNormalization of the rows a boolean mask selects: replica 1 selects
  none. The counts are reduced, not taken as the local shape times the replicas
  (which made the statistics NaN)."""
  task = SelectedRowsNormTask()
  _train(tmp_path / "one", replicas=1, task=task, shuffle=False,
         per_replica_batch_size=16)
  _train(tmp_path / "two", replicas=2, task=task, shuffle=False,
         per_replica_batch_size=8)
  assert max_difference(tmp_path / "one", tmp_path / "two") <= 1e-5


def _replica_moments(strategy, batches, masks=None):
  """global_moments on each replica's batch (and mask): one (mean, variance)
  per replica."""
  def moments(context):
    index = context.replica_id_in_sync_group
    mask = None if masks is None else tf.constant(masks[index])
    return tf.constant(batches[index]), mask

  values = strategy.experimental_distribute_values_from_function(moments)

  @tf.function
  def run():
    return strategy.run(lambda x, m: global_moments.global_moments(
        x, m, axes=list(range(len(batches[0].shape) - 1)),
        context=tf.distribute.get_replica_context()), args=values)

  means, variances = run()
  return list(zip(strategy.experimental_local_results(means),
                  strategy.experimental_local_results(variances)))


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e4])
def test_global_moments_are_exact_up_to_a_mean_of_1e4_times_the_spread(scale):
  """Four replicas of 0, 3, 9 and 20 rows, masked: every replica gets the
  float64 moments of all the unmasked rows, the mean to float32's spacing at
  its size and the variance to 1e-4 (Keras's E[x²] - E[x]² is off by the whole
  variance at 1e4)."""
  rng = np.random.default_rng(0)
  sizes = [0, 3, 9, 20]
  batches = [(scale + rng.normal(size=(n, 2, 3))).astype("float32") for n in sizes]
  masks = [rng.random((n, 2)) > 0.3 for n in sizes]
  strategy = tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(4)],
      cross_device_ops=tf.distribute.ReductionToOneDevice())
  rows = np.concatenate([b[m] for b, m in zip(batches, masks)]).astype(np.float64)
  for mean, variance in _replica_moments(strategy, batches, masks):
    expected = rows.mean(axis=0)  # Within 4 float32 spacings of its size.
    assert np.all(np.abs(mean.numpy() - expected) <=
                  4 * np.spacing(expected.astype(np.float32))), (mean, expected)
    np.testing.assert_allclose(variance.numpy(), rows.var(axis=0), rtol=1e-5)
  # Unmasked, with the empty replica: the same.
  rows = np.concatenate([b.reshape(-1, 3) for b in batches]).astype(np.float64)
  for mean, variance in _replica_moments(strategy, batches):
    np.testing.assert_allclose(mean.numpy(), rows.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(variance.numpy(), rows.var(axis=0), rtol=1e-5)


def test_a_resume_with_per_replica_statistics_is_bit_exact(tmp_path):
  """--sync_batchnorm=false: the replicas' moving statistics are averaged at
  every step, so 10 + resume + 10 equals 20 (averaged at loop-call ends, which
  a resume moves, they differed by 1.2e-7)."""
  # Automatic loop lengths: the resumed run's calls end at other steps.
  run = dict(replicas=2, task=BatchNormTask(), deterministic=True,
             checkpoint_every=10, sync_batchnorm=False, steps_per_loop=0)
  _train(tmp_path / "straight", **run)
  _train(tmp_path / "resumed", **dict(run, train_steps=10))
  _train(tmp_path / "resumed", **run)
  assert_bit_identical(tmp_path / "straight", tmp_path / "resumed")


@pytest.mark.parametrize("sync", [True, False])
def test_renormalization_keeps_its_moving_variance_consistent(tmp_path, sync):
  """renorm=True: the moving variance is relu(moving stddev² - epsilon) on
  every replica (averaging the two on their own broke it)."""
  _train(tmp_path / "run", replicas=2, task=RenormTask(), sync_batchnorm=sync)
  _, model = trainer.load(str(tmp_path / "run"))
  norm = model.layers[0]
  stddev, variance = norm.moving_stddev.numpy(), norm.moving_variance.numpy()
  np.testing.assert_array_equal(
      variance, np.maximum(stddev * stddev - np.float32(norm.epsilon), 0.0))
  assert not np.allclose(variance, 1.0)  # It trained.


def test_a_batchnorm_in_a_recurrent_cell_is_refused_in_one_line(tmp_path):
  """It runs in the RNN's tf.while_loop, where no all-reduce can: one line naming
  the layer and the flag, before anything is written (TensorFlow's merge_call
  traceback before)."""
  with pytest.raises(TaskError, match="layer 'cell_norm' .*BatchNormalization.* "
                     "runs inside control flow .*--sync_batchnorm=false"):
    _train(tmp_path / "run", replicas=2, task=RecurrentNormTask())
  assert not (tmp_path / "run").exists()
  _train(tmp_path / "own", replicas=2, task=RecurrentNormTask(), train_steps=2,
         sync_batchnorm=False)


def test_a_subclass_with_its_own_moments_is_left_alone_and_said(tmp_path, capsys):
  _train(tmp_path / "run", replicas=2, task=OwnMomentsTask(), train_steps=4)
  out = capsys.readouterr().out
  assert ("note: layer 'own_norm' (OwnMoments) computes its own _moments: left as "
          "written, on each replica's own batch") in out


@pytest.mark.slow
@pytest.mark.parametrize("task", ["MaskedNormTask", "RawFeatureNormTask"])
def test_two_workers_equal_one_device(tmp_path, task):
  """The same models on 2 workers (one replica each, 16 examples) against one
  device (32)."""
  flags = [f"--task=layer_tasks:{task}", "--optimizer=sgd", "--learning_rate=0.1",
           "--train_steps=20", "--steps_per_loop=5", "--mode=train",
           "--deterministic", "--summaries=false"]
  one = run_cli(*flags, "--per_replica_batch_size=32",
                f"--model_dir={tmp_path / 'one'}", python_path=TESTS)
  assert one.returncode == 0, one.stderr[-2000:]
  workers = run_workers(*flags, "--per_replica_batch_size=16",
                        f"--model_dir={tmp_path / 'two'}", python_path=TESTS)
  assert workers.returncode == 0, workers.stdout[-3000:]
  assert max_difference(tmp_path / "one", tmp_path / "two") <= 1e-5


@pytest.mark.parametrize("change, problem", [
    ("seed_generators", "a Dropout layer's seed generator cannot be found"),
    ("moments", "BatchNormalization no longer normalises with the moments of "
     "_moments")])
def test_a_keras_that_moved_what_the_patches_need_is_refused(tmp_path, change,
                                                             problem):
  """The start-up self-check: one line naming the Keras version and the
  supported range, exit 2, nothing written (before: replicas silently drew one
  Dropout mask, and a resume redrew other masks)."""
  model_dir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, "-m", "trainer.main", "--task=keras_changes:Dropout",
       "--cpu_devices=2", "--train_steps=5", f"--model_dir={model_dir}"],
      cwd=REPO, env=cli_env(PYTHONPATH=os.pathsep.join([TESTS, REPO]),
                            KERAS_CHANGE=change),
      capture_output=True, text=True, timeout=240, check=False)
  one_line_error(result, f"Keras {keras.__version__} is not supported: {problem}")
  assert "(trainer needs keras>=3.15,<3.16" in result.stderr
  assert not model_dir.exists()


def test_keras_is_bounded_to_the_versions_the_patches_were_checked_with():
  keras_requirements = [requirement for requirement in map(
      Requirement, importlib.metadata.requires("trainer"))
                        if requirement.name == "keras"]
  assert [r.specifier for r in keras_requirements] == [
      SpecifierSet(internals.SUPPORTED_KERAS)]
  assert internals.SUPPORTED_KERAS == ">=3.15,<3.16"
  assert keras.__version__.startswith(internals.CHECKED_WITH["keras"] + ".")
