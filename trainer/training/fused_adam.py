"""--optimizer=adam and adamw as TensorFlow's fused Adam kernel: one op per variable.

Keras 3's Adam updates each variable with about a dozen element-wise ops (a
subtraction, a product, an assignment, and so on for m, v and the weights), each a
pass over the variable's memory. TensorFlow's `ResourceApplyAdam` does the same
update in one pass. On the benchmark's CNN on CPU (a 346k-weight dense kernel,
2 replicas) that is about 10% of a step, and it traces in a fraction of the time,
which shortens a run's first call.

The arithmetic is Adam's and the kernel's order of operations is Keras's; the one
difference is the rounding of the constants `1 - beta`: the kernel takes them from
the float32 betas (1 - 0.999f), Keras from Python floats (float32(1 - 0.999)), so
the two optimizers' weights part in the last digits after a few steps (the kernel
rounds as Keras 2's Adam did). `--fused_optimizer=false` keeps Keras's ops. A
task's own optimizer (`Task.build_optimizer`) is never replaced: what a Keras user
brings trains with Keras's numbers.

The optimizer's variables (its moments, its step) are Keras's own, so checkpoints
move freely between the two.

  >>> import keras
  >>> optimizer = FusedAdam(1e-3)
  >>> isinstance(optimizer, keras.optimizers.Adam)
  True
"""

import keras
import tensorflow as tf

# The dtypes ResourceApplyAdam has CPU and GPU kernels for.
KERNEL_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def _handle(variable):
  """The resource handle of a Keras or TensorFlow variable (inside a strategy's
  update, the current device's copy)."""
  if isinstance(variable, keras.Variable):
    variable = variable.value
  return variable.handle


class _FusedUpdate:
  """Adam's `update_step` as one `ResourceApplyAdam` op; Keras's own for what the
  kernel does not do (AMSGrad, sparse gradients, other dtypes)."""

  def update_step(self, gradient, variable, learning_rate):
    """Updates `variable` and its moments by `gradient` at `learning_rate`."""
    if (self.amsgrad or isinstance(gradient, tf.IndexedSlices)
        or variable.dtype not in KERNEL_DTYPES):
      return super().update_step(gradient, variable, learning_rate)
    dtype = variable.dtype
    index = self._get_variable_index(variable)
    step = tf.cast(self.iterations + 1, dtype)
    beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
    return tf.raw_ops.ResourceApplyAdam(
        var=_handle(variable), m=_handle(self._momentums[index]),
        v=_handle(self._velocities[index]), beta1_power=tf.pow(beta_1, step),
        beta2_power=tf.pow(beta_2, step), lr=tf.cast(learning_rate, dtype),
        beta1=beta_1, beta2=beta_2, epsilon=tf.cast(self.epsilon, dtype),
        grad=tf.cast(gradient, dtype))


@keras.saving.register_keras_serializable(package="trainer")
class FusedAdam(_FusedUpdate, keras.optimizers.Adam):
  """keras.optimizers.Adam, updating each variable with one fused op."""


@keras.saving.register_keras_serializable(package="trainer")
class FusedAdamW(_FusedUpdate, keras.optimizers.AdamW):
  """keras.optimizers.AdamW (its decay is Keras's own step), updating each
  variable with one fused op."""
