"""The distributed step: equivalence to one device, the per-replica batch assertion,
the ledger, and K steps per call without retracing."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.eager import context as eager_context

from trainer.errors import ReplicaBatchError
from trainer.training import divergence, graph_passes, setup, steps

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


_REWRITER = rewriter_config_pb2.RewriterConfig


def _rewrite_options():
  """The rewrite options a function called now is compiled with."""
  options = eager_context.context().function_call_options
  return config_pb2.ConfigProto.FromString(
      options.config_proto_serialized).graph_options.rewrite_options


def test_the_loops_and_a_replay_are_compiled_with_lean_grappler_passes_on_cpu(
    tmp_path):
  built = _built(tmp_path, cpu_devices=2, per_replica_batch_size=4,
                 mode="train_and_eval")
  trainer = built.trainer
  before = eager_context.context().function_call_options
  seen = {}

  def spied(name, function):
    def call(*args):
      seen.setdefault(name, []).append(_rewrite_options())
      return function(*args)
    return call

  spy = dataclasses.replace(
      trainer, train_loop=spied("train", trainer.train_loop),
      build_eval_loop=lambda gather: spied(
          "eval", trainer.build_eval_loop(gather=gather)),
      diagnose_step=spied("replay", trainer.diagnose_step))
  built.checkpoints.save()  # Step 0, to replay from.
  spy.run_train_loop(built.train_data, spy.train_iterator(built.train_data),
                     tf.constant(2), step=0)
  spy.evaluate(built.eval_data)
  divergence.replay_to(spy, built.train_data, built.checkpoints,
                       model_dir=str(tmp_path), step=1, stop_at_nonfinite=False)
  assert sorted(seen) == ["eval", "replay", "train"]
  for rewrite in sum(seen.values(), []):
    assert rewrite.meta_optimizer_iterations == _REWRITER.ONE
    assert rewrite.memory_optimization == _REWRITER.NO_MEM_OPT
    assert rewrite.layout_optimizer == _REWRITER.OFF
  # Only around the calls: the thread's options are as they were.
  assert eager_context.context().function_call_options is before


def test_lean_passes_keep_a_users_options_and_end_with_the_call():
  context = eager_context.context()
  before = context.function_call_options
  config = config_pb2.ConfigProto.FromString(before.config_proto_serialized)
  config.graph_options.rewrite_options.layout_optimizer = _REWRITER.ON
  users = eager_context.FunctionCallOptions(config_proto=config)
  context.function_call_options = users
  try:
    with pytest.raises(ValueError, match="a loop failed"):
      with graph_passes.applied(True):
        rewrite = _rewrite_options()
        raise ValueError("a loop failed")
    assert context.function_call_options is users  # Restored on the error too.
    with graph_passes.applied(False):
      assert context.function_call_options is users
  finally:
    context.function_call_options = before
  assert rewrite.layout_optimizer == _REWRITER.ON  # The user's.
  assert rewrite.meta_optimizer_iterations == _REWRITER.ONE

  class GpuExtended:
    worker_devices = ("/job:localhost/replica:0/task:0/device:GPU:0",)

  class GpuStrategy:
    extended = GpuExtended()

  assert graph_passes.lean_for(tf.distribute.MirroredStrategy(["/cpu:0"]))
  assert not graph_passes.lean_for(GpuStrategy())
  assert not graph_passes.lean_for(
      object.__new__(tf.distribute.MultiWorkerMirroredStrategy))
