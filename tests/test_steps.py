"""The distributed step: equivalence to one device, the per-replica batch assertion,
the ledger, and K steps per call without retracing."""

import numpy as np
import pytest
import tensorflow as tf

import trainer
from trainer import data
from trainer.config import Config
from trainer.errors import ReplicaBatchError
from trainer.tasks.classification import Classification
from trainer.training import steps
from trainer.training.controller import train_iterator
from trainer.training.setup import setup
from trainer.training.state import build_state

from conftest import float_values

SGD_MLP = dict(dataset="digits", model="mlp", optimizer="sgd", learning_rate=0.5,
               train_steps=10, summaries=False)



def test_four_replicas_match_one_device(tmp_path):
  four = trainer.train(Config(model_dir=str(tmp_path / "four"), cpu_devices=4,
                              per_replica_batch_size=8, **SGD_MLP))
  one = trainer.train(Config(model_dir=str(tmp_path / "one"), strategy="one_device",
                             per_replica_batch_size=32, **SGD_MLP))
  assert four["num_replicas"] == 4 and one["num_replicas"] == 1
  assert four["global_batch_size"] == one["global_batch_size"] == 32
  a, b = float_values(tmp_path / "four"), float_values(tmp_path / "one")
  assert a.keys() == b.keys()
  assert sum(k.startswith("model/") for k in a) == 4  # Two dense layers.
  for key in a:
    np.testing.assert_allclose(a[key], b[key], atol=1e-5, err_msg=key)


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_ledger_counts_one_batch_per_replica_per_step(tmp_path, replicas):
  results = trainer.train(Config(model_dir=str(tmp_path / "run"), cpu_devices=replicas,
                                 per_replica_batch_size=4, steps_per_loop=3,
                                 **dict(SGD_MLP, train_steps=7)))
  assert results["replica_batches"] == {f"replica_{i}": 7 for i in range(replicas)}
  assert results["replica_examples"] == {f"replica_{i}": 28 for i in range(replicas)}


def _state(tmp_path, **changes):
  config = Config(model_dir=str(tmp_path), **dict(SGD_MLP, **changes))
  found = setup(config, Classification())
  return build_state(config, found.task, found.strategy, train_data=found.train_data,
                     eval_data=found.eval_data, is_chief=found.is_chief)


def test_wrong_batch_size_fires_the_in_graph_assertion(tmp_path):
  # The iterator path (the gather path builds exactly 4 per replica itself).
  state = _state(tmp_path, cpu_devices=2, per_replica_batch_size=4,
                 array_input="dataset")
  # Global batches of 6 split into 3 + 3: not the 4 each replica must get.
  dataset = data.train_dataset(state.train_data, global_batch_size=6, seed=0,
                               shuffle=False, start_step=0,
                               preprocess=state.task.preprocess)
  iterator = iter(data.distribute(state.strategy, dataset))
  with pytest.raises(tf.errors.InvalidArgumentError) as e:
    state.train_loop(iterator, tf.constant(1))
  error = steps.replica_batch_error(e.value)
  assert isinstance(error, ReplicaBatchError)
  assert "got 3 examples, expected 4" in str(error)


def test_ledger_mismatch_names_the_replica(tmp_path):
  state = _state(tmp_path, cpu_devices=2, per_replica_batch_size=4)
  iterator = train_iterator(state)
  state.train_loop(iterator, tf.constant(2))
  assert state.train_ledger.check(expected_batches=2,
                                  per_replica_batch_size=4).tolist() == [2, 2]
  with pytest.raises(ReplicaBatchError, match="replica 0 received 2 batches and 8 "
                     "examples in a loop call, expected 3 and 12"):
    state.train_ledger.check(expected_batches=3, per_replica_batch_size=4)
  state.train_loop(iterator, tf.constant(3))  # Counts restart with each call...
  assert state.train_ledger.check(expected_batches=3,  # ...and add up on the host.
                                  per_replica_batch_size=4).tolist() == [5, 5]


def test_k_steps_per_call_match_single_steps_and_trace_once(tmp_path):
  single = _state(tmp_path / "a", cpu_devices=2, per_replica_batch_size=4)
  iterator = train_iterator(single)
  for _ in range(6):
    single.train_loop(iterator, tf.constant(1))
  looped = _state(tmp_path / "b", cpu_devices=2, per_replica_batch_size=4)
  iterator = train_iterator(looped)
  for k in (1, 2, 3):
    looped.train_loop(iterator, tf.constant(k))
  assert single.step == looped.step == 6
  for a, b in zip(single.model.weights, looped.model.weights):
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6, err_msg=a.path)
  assert looped.train_loop.experimental_get_tracing_count() == 1
