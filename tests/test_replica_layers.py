"""The layers most models have, on N replicas: BatchNormalization normalises with
the global batch (N replicas equal one device), its moving statistics are one
value (the recorded evaluation is the saved model's), and random layers draw per
replica (trainer/training/replica_layers.py)."""

import re

import numpy as np
import pytest
import tensorflow as tf

import trainer
from trainer.training import setup

from conftest import assert_bit_identical, float_values
from layer_tasks import BatchNormTask, _blobs

SGD = dict(optimizer="sgd", learning_rate=0.1, train_steps=20, steps_per_loop=5,
           summaries=False)


def _train(model_dir, *, replicas, task=None, **changes):
  fields = dict(SGD, mode="train", cpu_devices=replicas,
                per_replica_batch_size=32 // replicas, model_dir=str(model_dir))
  fields.update(changes)
  return trainer.train(trainer.Config(**fields), task=task or BatchNormTask())


def _max_difference(run_a, run_b) -> float:
  a, b = float_values(run_a), float_values(run_b)
  keys = [k for k in a if k.startswith("model/")]
  assert keys and a.keys() == b.keys()
  return max(float(np.abs(a[k] - b[k]).max()) for k in keys)


@pytest.mark.parametrize("nested", [False, True])
def test_batchnorm_on_two_replicas_trains_as_one_device(tmp_path, nested):
  """Sequential, and a subclassed model with a user's layer holding a
  BatchNormalization and an inner Sequential with another: 2 replicas x 16 equal
  1 device x 32 (Keras's per-replica statistics: 2e-2 apart)."""
  task = BatchNormTask(nested=nested)
  _train(tmp_path / "one", replicas=1, task=task)
  _train(tmp_path / "two", replicas=2, task=task)
  assert _max_difference(tmp_path / "one", tmp_path / "two") <= 1e-5
  if not nested:
    _train(tmp_path / "own", replicas=2, task=task, sync_batchnorm=False)
    assert _max_difference(tmp_path / "one", tmp_path / "own") > 1e-3


@pytest.mark.parametrize("sync", [True, False])
def test_the_recorded_evaluation_is_the_saved_models(tmp_path, sync):
  """With per-replica statistics too (--sync_batchnorm=false), the moving
  statistics are one value: the evaluation recorded in training equals
  --mode=eval of the checkpoint and Keras's evaluate on trainer.load's model
  (they differed in the 4th digit when each replica kept its own copy)."""
  model_dir = tmp_path / "run"
  recorded = _train(model_dir, replicas=2, mode="train_and_eval",
                    sync_batchnorm=sync)["eval"]
  evaluated = trainer.train(trainer.Config(mode="eval", model_dir=str(model_dir)),
                            task=BatchNormTask())["eval"]
  assert evaluated["loss"] == pytest.approx(recorded["loss"], rel=1e-6, abs=1e-7)
  task, model = trainer.load(str(model_dir))
  model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  x, y = _blobs(203, seed=1)
  keras_loss = model.evaluate(x, y, batch_size=203, verbose=0)
  assert keras_loss == pytest.approx(recorded["loss"], rel=1e-5)
  del task


def test_a_start_line_says_when_batchnorm_is_per_replica(tmp_path, capsys):
  _train(tmp_path / "run", replicas=2, sync_batchnorm=False, train_steps=5)
  assert ("BatchNormalization on each replica's own batch (--sync_batchnorm=false: "
          "not one device's)") in capsys.readouterr().out


def _replica_outputs(tmp_path, task, replicas=2):
  """Each replica's training-mode outputs of the built model on the same batch."""
  config = trainer.Config(cpu_devices=replicas, model_dir=str(tmp_path), **SGD)
  config, task = setup.resolve_task(config, task)
  built = setup.build(config, task)
  strategy, model = built.trainer.strategy, built.trainer.model
  batch = tf.constant(_blobs(8, seed=2)[0])

  @tf.function
  def outputs():
    return strategy.run(lambda: model(batch, training=True))

  return [t.numpy() for t in strategy.experimental_local_results(outputs())]


def test_each_replica_draws_its_own_dropout_mask(tmp_path):
  """Identical inputs on 2 replicas: their Dropout masks differ (they were
  identical on every step: the seed generator's state is mirrored)."""
  first, second = _replica_outputs(tmp_path, BatchNormTask(dropout=0.5))
  assert not np.array_equal(first, second)


def test_a_rerun_and_a_resume_with_dropout_are_bit_exact(tmp_path):
  """Per-replica randomness is a function of (seed, step, replica): 20 steps,
  and 10 + resume + 10, give the same weights bit for bit."""
  task = BatchNormTask(dropout=0.5)
  run = dict(replicas=2, task=task, deterministic=True, checkpoint_every=10)
  _train(tmp_path / "straight", **run)
  _train(tmp_path / "resumed", **dict(run, train_steps=10))
  results = _train(tmp_path / "resumed", **run)
  assert results["global_step"] == 20
  assert_bit_identical(tmp_path / "straight", tmp_path / "resumed")


def test_jit_compile_with_synchronized_batchnorm_is_refused_in_one_line(tmp_path):
  """XLA cannot compile the all-reduce a synchronized BatchNormalization makes
  inside the step: a traceback at the first trace, now one line before it."""
  with pytest.raises(trainer.errors.ConfigError, match=re.escape(
      "--jit_compile: BatchNormalization synchronized over 2 replicas "
      "(--sync_batchnorm) all-reduces inside the compiled step, which XLA cannot")):
    _train(tmp_path / "run", replicas=2, jit_compile=True)
  assert not (tmp_path / "run").exists()


def test_a_replay_keeps_the_runs_batchnorm_setting(tmp_path):
  """--sync_batchnorm belongs to the run, not to the process that opens it: an
  invocation's value (a replay passing its own flags) replaced the run's."""
  from trainer.training.open_run import open_run
  model_dir = tmp_path / "run"
  _train(model_dir, replicas=2, train_steps=2, sync_batchnorm=False)
  built = open_run(str(model_dir), mode="train", invocation=trainer.Config(
      cpu_devices=2, sync_batchnorm=True, verify_equivalence="strict"))
  assert built.config.sync_batchnorm is False
  assert built.config.verify_equivalence == "false"
