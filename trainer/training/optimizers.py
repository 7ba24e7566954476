"""The optimizer (the task's own, or the one --optimizer names) and the update rule
around it: the learning-rate schedule, clipping, accumulation and the moving
average of the weights."""

import keras
import tensorflow as tf

from trainer.config import OptimizationConfig
from trainer.training import fused_adam, schedules
from trainer.training.train_loop import UpdateRule


# The flags a task's own optimizer (Task.build_optimizer) makes moot.
TASK_OPTIMIZER_IGNORES = ("optimizer", "learning_rate", "momentum", "weight_decay",
                          "fused_optimizer")


def build_optimizer(optimization: OptimizationConfig,
                    task_optimizer=None) -> keras.optimizers.Optimizer:
  """`task_optimizer` (Task.build_optimizer's) if any, else --optimizer at
  --learning_rate.

  The rate is then driven by the train loop (--lr_schedule). Adam and AdamW
  update with one fused op per variable unless --fused_optimizer=false
  (trainer.training.fused_adam); a task's own optimizer is used as it is. Under
  --mixed_precision=mixed_float16 it is wrapped for dynamic loss scaling. Call it
  inside `strategy.scope()`.
  """
  o = optimization
  optimizer = task_optimizer
  if optimizer is None:
    rate = o.learning_rate
    if o.optimizer == "adam":
      adam = fused_adam.FusedAdam if o.fused_optimizer else keras.optimizers.Adam
      optimizer = adam(rate)
    elif o.optimizer == "adamw":
      adamw = fused_adam.FusedAdamW if o.fused_optimizer else keras.optimizers.AdamW
      optimizer = adamw(rate, weight_decay=o.weight_decay)
    elif o.optimizer == "lion":
      optimizer = keras.optimizers.Lion(rate, weight_decay=o.weight_decay or None)
    elif o.optimizer == "sgd":
      optimizer = keras.optimizers.SGD(rate)
    else:
      optimizer = keras.optimizers.SGD(rate, momentum=o.momentum)
  if o.mixed_precision == "mixed_float16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer


def rate_variable(optimizer):
  """The variable holding the optimizer's learning rate; None under a schedule."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer.
  rate = getattr(inner, "_learning_rate", None)  # Keras has no public handle.
  return rate if hasattr(rate, "assign") else None


def learning_rate(optimizer):
  """The optimizer's current learning rate, or None under a schedule."""
  rate = rate_variable(optimizer)
  return None if rate is None else float(rate.numpy())


def update_rule(optimization: OptimizationConfig, *, model, optimizer,
                train_steps: int, keep_gradients: bool = False,
                task_optimizer: bool = False) -> UpdateRule:
  """The update's options from the flags (and `keep_gradients`: a copy of each
  update's gradients, for histograms; `task_optimizer`: the optimizer is the
  task's, whose rate may also be set from outside); call inside
  `strategy.scope()`."""
  variable = rate_variable(optimizer)
  rate_base = rate_set = None
  if variable is not None:  # Not a task optimizer's own schedule.
    rate_base = tf.Variable(float(variable.numpy()), trainable=False,
                            name="peak_learning_rate",
                            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    if task_optimizer:
      rate_set = tf.Variable(float(variable.numpy()), trainable=False,
                             name="learning_rate_set",
                             aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  ema_variables = ()
  if optimization.ema_decay:
    ema_variables = tuple(
        tf.Variable(v.value, trainable=False, name=f"ema_{i}",
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        for i, v in enumerate(model.trainable_variables))
  gradient_copies = tuple(
      tf.Variable(tf.zeros_like(v.value), trainable=False, name=f"gradient_{i}",
                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      for i, v in enumerate(model.trainable_variables)) if keep_gradients else ()
  return UpdateRule(
      accum_steps=optimization.grad_accum_steps, clip_norm=optimization.clip_norm,
      rate_variable=variable, rate_base=rate_base, rate_set=rate_set,
      rate_factor=schedules.schedule_of(optimization, train_steps=train_steps),
      ema_decay=optimization.ema_decay, ema_variables=ema_variables,
      gradient_copies=gradient_copies)


def applied_flags(flag_lines: list, *, task_optimizer: bool) -> list:
  """The run's flag lines without those a task's own optimizer makes moot:
  flags.txt claims no rate that was not applied."""
  moot = tuple(f"--{name}=" for name in TASK_OPTIMIZER_IGNORES)
  return [line for line in flag_lines
          if not (task_optimizer and line.startswith(moot))]


def describe_task_optimizer(optimizer) -> str:
  """"optimizer SGD from Task.build_optimizer, learning rate 0.01 (--optimizer,
  ... do not apply)"."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  rate = learning_rate(optimizer)
  return (f"optimizer {type(inner).__name__} from Task.build_optimizer, "
          + (f"learning rate {rate:g}" if rate is not None else
             "with its own learning-rate schedule")
          + f" ({', '.join('--' + n for n in TASK_OPTIMIZER_IGNORES)} do not apply)")
