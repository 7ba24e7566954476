"""The distributed step: equivalence to one device, the per-replica batch assertion,
the ledger, and K steps per call without retracing."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from trainer.errors import ReplicaBatchError
from trainer.training import setup, steps

from conftest import float_values
from presets import MLP_SGD, config, train

SGD_MLP = (*MLP_SGD, "--learning_rate=0.5", "--train_steps=10", "--summaries=false")



def test_four_replicas_match_one_device(tmp_path):
  four = train(*SGD_MLP, model_dir=str(tmp_path / "four"), cpu_devices=4,
               per_replica_batch_size=8)
  one = train(*SGD_MLP, model_dir=str(tmp_path / "one"), strategy="one_device",
              per_replica_batch_size=32)
  assert four["num_replicas"] == 4 and one["num_replicas"] == 1
  assert four["global_batch_size"] == one["global_batch_size"] == 32
  a, b = float_values(tmp_path / "four"), float_values(tmp_path / "one")
  assert a.keys() == b.keys()
  assert sum(k.startswith("model/") for k in a) == 4  # Two dense layers.
  for key in a:
    np.testing.assert_allclose(a[key], b[key], atol=1e-5, err_msg=key)


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_ledger_counts_one_batch_per_replica_per_step(tmp_path, replicas):
  results = train(*SGD_MLP, model_dir=str(tmp_path / "run"), cpu_devices=replicas,
                  per_replica_batch_size=4, steps_per_loop=3, train_steps=7)
  assert results["replica_batches"] == {f"replica_{i}": 7 for i in range(replicas)}
  assert results["replica_examples"] == {f"replica_{i}": 28 for i in range(replicas)}


def _built(tmp_path, **changes):
  run = config(*SGD_MLP, model_dir=str(tmp_path), **changes)
  run, task = setup.resolve_task(run)
  return setup.build(run, task)


def test_wrong_batch_size_fires_the_in_graph_assertion(tmp_path):
  # The iterator path (the gather path builds exactly 4 per replica itself).
  built = _built(tmp_path, cpu_devices=2, per_replica_batch_size=4,
                 array_input="dataset")
  trainer = built.trainer
  # Global batches of 6 split into 3 + 3: not the 4 each replica must get.
  wrong = dataclasses.replace(trainer.order, global_batch_size=6, shuffle=False)
  iterator = iter(built.train_data.train_input(
      trainer.strategy, trainer.cluster, wrong, start_step=0,
      preprocess=trainer.task.preprocess))
  with pytest.raises(tf.errors.InvalidArgumentError) as e:
    trainer.train_loop(iterator, tf.constant(1))
  error = steps.replica_batch_error(e.value)
  assert isinstance(error, ReplicaBatchError)
  assert "got 3 examples, expected 4" in str(error)


def test_ledger_mismatch_names_the_replica(tmp_path):
  built = _built(tmp_path, cpu_devices=2, per_replica_batch_size=4)
  trainer = built.trainer
  iterator = trainer.train_iterator(built.train_data)
  trainer.train_loop(iterator, tf.constant(2))
  assert trainer.train_ledger.check(expected_batches=2,
                                    per_replica_batch_size=4).tolist() == [2, 2]
  with pytest.raises(ReplicaBatchError, match="replica 0 received 2 batches and 8 "
                     "examples in a loop call, expected 3 and 12"):
    trainer.train_ledger.check(expected_batches=3, per_replica_batch_size=4)
  trainer.train_loop(iterator, tf.constant(3))  # Counts restart with each call...
  assert trainer.train_ledger.check(expected_batches=3,  # ...and add up on the host.
                                    per_replica_batch_size=4).tolist() == [5, 5]


def test_k_steps_per_call_match_single_steps_and_trace_once(tmp_path):
  single_built = _built(tmp_path / "a", cpu_devices=2, per_replica_batch_size=4)
  single = single_built.trainer
  iterator = single.train_iterator(single_built.train_data)
  for _ in range(6):
    single.train_loop(iterator, tf.constant(1))
  looped_built = _built(tmp_path / "b", cpu_devices=2, per_replica_batch_size=4)
  looped = looped_built.trainer
  iterator = looped.train_iterator(looped_built.train_data)
  for k in (1, 2, 3):
    looped.train_loop(iterator, tf.constant(k))
  assert single.step == looped.step == 6
  for a, b in zip(single.model.weights, looped.model.weights):
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6, err_msg=a.path)
  assert looped.train_loop.experimental_get_tracing_count() == 1
