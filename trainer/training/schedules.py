"""Learning-rate schedules: the factor that scales --learning_rate at a step.

`rate_factor(step, ...)` is written with TensorFlow ops so the train loop computes
it in-graph from the global step (a resume needs no schedule state), and tests can
call it eagerly. After `warmup_steps` of linear warm-up (step s trains at
(s + 1) / warmup of the rate), the decay runs from the end of warm-up to
`decay_steps` and never goes below `min_ratio` (--min_learning_rate over
--learning_rate):

  constant     1
  cosine       min + (1 - min) * (1 + cos(pi * p)) / 2
  linear       1 - (1 - min) * p
  exponential  factor ** p
  step         factor ** (number of boundaries <= step)

where p = (step - warmup) / (decay_steps - warmup), clipped to [0, 1].
"""

import math

import tensorflow as tf


@tf.autograph.experimental.do_not_convert
def rate_factor(step, *, schedule: str, warmup_steps: int, decay_steps: int,
                min_ratio: float, factor: float, boundaries=()):
  """The factor of the rate applied at `step` (0-based), as a float32 tensor.

  Args:
    step: the global step being trained (int tensor or int).
    schedule: constant, cosine, linear, step or exponential.
    warmup_steps: steps of linear warm-up.
    decay_steps: the step at which cosine, linear and exponential decay end.
    min_ratio: the floor, as a fraction of the peak rate.
    factor: the step and exponential schedules' factor.
    boundaries: the step schedule's steps.
  """
  step = tf.cast(step, tf.float32)
  one = tf.constant(1.0)
  if schedule == "constant":
    decayed = one
  elif schedule == "step":
    passed = tf.reduce_sum(tf.cast(
        step >= tf.constant(list(boundaries) or [math.inf], tf.float32), tf.float32))
    decayed = tf.pow(tf.constant(factor, tf.float32), passed)
  else:
    span = float(max(decay_steps - warmup_steps, 1))
    progress = tf.clip_by_value((step - warmup_steps) / span, 0.0, 1.0)
    if schedule == "cosine":
      decayed = min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + tf.cos(math.pi * progress))
    elif schedule == "linear":
      decayed = 1.0 - (1.0 - min_ratio) * progress
    elif schedule == "exponential":
      decayed = tf.pow(tf.constant(factor, tf.float32), progress)
    else:
      raise ValueError(f"unknown schedule {schedule!r}")
  decayed = tf.maximum(decayed, min_ratio)
  if warmup_steps:
    decayed = tf.where(step < warmup_steps, (step + 1.0) / warmup_steps, decayed)
  return decayed


def schedule_of(optimization, *, train_steps: int):
  """`step -> factor`: the schedule --lr_schedule and its flags describe.

  Args:
    optimization: the OptimizationConfig (lr_schedule, warmup_steps, ...).
    train_steps: --train_steps, where decay ends by default.
  """
  o = optimization
  min_ratio = o.min_learning_rate / o.learning_rate if o.learning_rate else 0.0

  @tf.autograph.experimental.do_not_convert
  def factor_at(step):
    return rate_factor(step, schedule=o.lr_schedule, warmup_steps=o.warmup_steps,
                       decay_steps=o.decay_steps or train_steps,
                       min_ratio=min_ratio, factor=o.lr_decay_factor,
                       boundaries=o.lr_boundaries)

  return factor_at
