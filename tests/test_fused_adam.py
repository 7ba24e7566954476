"""--optimizer=adam and adamw as one fused op per variable
(trainer.training.fused_adam): Adam's arithmetic with float32 constants, on every
replica's copy, one op per variable in the traced step; Keras's own ops where the
kernel does not apply, under --fused_optimizer=false, and for a task's own
optimizer."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer import config as config_lib
from trainer.training import fused_adam, optimizers

from conftest import float_values
from presets import train

RATE = 0.01
START = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)
GRADIENTS = [np.random.default_rng(i).normal(size=(3, 4)).astype(np.float32)
             for i in range(5)]


def _adam_in_float32(gradients, *, rate=RATE, beta_1=0.9, beta_2=0.999,
                     epsilon=1e-7):
  """Adam in NumPy float32, its constants 1 - beta taken from the float32 betas."""
  f = np.float32
  b1, b2, eps, rate = f(beta_1), f(beta_2), f(epsilon), f(rate)
  var, m, v = START.copy(), np.zeros_like(START), np.zeros_like(START)
  for t, g in enumerate(gradients, 1):
    alpha = rate * np.sqrt(f(1) - b2 ** f(t)) / (f(1) - b1 ** f(t))
    m += (g - m) * (f(1) - b1)
    v += (g * g - v) * (f(1) - b2)
    var -= (m * alpha) / (np.sqrt(v) + eps)
  return var


def _applied(make_optimizer, gradients, strategy=None):
  """The variable after the optimizer `make_optimizer()` applied `gradients` one
  by one in a tf.function (on every replica of `strategy`), and that function's
  ops."""
  strategy = strategy or tf.distribute.get_strategy()
  with strategy.scope():
    variable = keras.Variable(START)
    optimizer = make_optimizer()
    optimizer.build([variable])

  @tf.function
  def apply(gradient):
    # tf.identity: the replica's own copy, on its device (all_reduce's source).
    strategy.run(lambda g: optimizer.apply([tf.identity(g)], [variable]),
                 args=(gradient,))

  for gradient in gradients:
    apply(tf.constant(gradient))
  graph = apply.get_concrete_function(tf.constant(gradients[0])).graph
  ops = [op.type for op in graph.get_operations()]
  for function in graph.as_graph_def().library.function:  # strategy.run's bodies.
    ops += [node.op for node in function.node_def]
  copies = strategy.experimental_local_results(variable.value)
  return [copy.numpy() for copy in copies], ops


def test_the_fused_update_is_adam_in_one_op_per_variable():
  (fused,), ops = _applied(lambda: fused_adam.FusedAdam(RATE), GRADIENTS)
  np.testing.assert_allclose(fused, _adam_in_float32(GRADIENTS), rtol=1e-6)
  assert ops.count("ResourceApplyAdam") == 1 and "Sqrt" not in ops
  # Keras's own Adam: the same algorithm in a dozen element-wise ops.
  (theirs,), keras_ops = _applied(lambda: keras.optimizers.Adam(RATE), GRADIENTS)
  np.testing.assert_allclose(fused, theirs, rtol=1e-4)
  assert "ResourceApplyAdam" not in keras_ops and "Sqrt" in keras_ops


def test_every_replica_copy_gets_the_fused_update():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  copies, _ = _applied(lambda: fused_adam.FusedAdam(RATE), GRADIENTS,
                       strategy=strategy)
  assert len(copies) == 2
  for copy in copies:  # Each replica's gradient is summed over 2 replicas.
    np.testing.assert_allclose(copy, _adam_in_float32([2 * g for g in GRADIENTS]),
                               rtol=1e-6)


def test_what_the_kernel_does_not_do_is_keras_own():
  (fused,), ops = _applied(lambda: fused_adam.FusedAdam(RATE, amsgrad=True),
                         GRADIENTS)
  (theirs,), _ = _applied(lambda: keras.optimizers.Adam(RATE, amsgrad=True),
                         GRADIENTS)
  np.testing.assert_array_equal(fused, theirs)
  assert "ResourceApplyAdam" not in ops


@pytest.mark.parametrize("flags, expected", [
    ([], fused_adam.FusedAdam), (["--optimizer=adamw"], fused_adam.FusedAdamW),
    (["--fused_optimizer=false"], keras.optimizers.Adam),
    (["--optimizer=adamw", "--fused_optimizer=false"], keras.optimizers.AdamW)])
def test_the_flags_choose_the_update(flags, expected):
  optimization = config_lib.from_argv(flags).optimization
  assert type(optimizers.build_optimizer(optimization)) is expected
  own = keras.optimizers.Adam(RATE)  # A task's own optimizer is used as it is.
  assert optimizers.build_optimizer(optimization, task_optimizer=own) is own


def test_a_run_resumes_across_the_flag(tmp_path):
  # The moments are Keras's own variables: a checkpoint of Keras's Adam resumes
  # under the fused one, which trains on as the fused run does.
  flags = ("--dataset=digits", "--model=mlp", "--learning_rate=0.01",
           "--per_replica_batch_size=8", "--summaries=false", "--mode=train")
  resumed, fused = str(tmp_path / "resumed"), str(tmp_path / "fused")
  train(*flags, "--fused_optimizer=false", model_dir=resumed, cpu_devices=2,
        train_steps=10, checkpoint_every=10)
  results = train(*flags, model_dir=resumed, cpu_devices=2, train_steps=20)
  assert results["status"] == "completed" and results["global_step"] == 20
  train(*flags, model_dir=fused, cpu_devices=2, train_steps=20)
  a, b = float_values(resumed), float_values(fused)
  assert a.keys() == b.keys()
  assert any("optimizer" in key for key in a)
  for key in a:
    np.testing.assert_allclose(a[key], b[key], rtol=1e-3, atol=1e-4, err_msg=key)


def test_a_run_older_than_the_flag_is_rebuilt_as_it_trained(tmp_path):
  # Evaluation, replay and trainer.load rebuild a run from its flags.txt: one
  # written before --fused_optimizer existed trained with Keras's own Adam ops.
  from trainer.training import open_run
  old, new = tmp_path / "old", tmp_path / "new"
  for run, lines in ((old, ["--optimizer=adam"]),
                     (new, ["--optimizer=adam", "--fused_optimizer=true"])):
    run.mkdir()
    (run / "flags.txt").write_text("\n".join(lines) + "\n")
  assert open_run.run_config(str(old)).fused_optimizer is False
  assert open_run.run_config(str(new)).fused_optimizer is True
