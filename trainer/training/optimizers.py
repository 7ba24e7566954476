"""The optimizer: the task's own, or the one --optimizer names."""

import keras

from trainer.config import Config


def build_optimizer(config: Config, task) -> keras.optimizers.Optimizer:
  """The task's optimizer if it builds one, else --optimizer at --learning_rate.

  Under --mixed_precision=mixed_float16 it is wrapped for dynamic loss scaling.
  Call it inside `strategy.scope()`.
  """
  optimizer = task.build_optimizer()
  if optimizer is None:
    if config.optimizer == "adam":
      optimizer = keras.optimizers.Adam(config.learning_rate)
    elif config.optimizer == "sgd":
      optimizer = keras.optimizers.SGD(config.learning_rate)
    else:
      optimizer = keras.optimizers.SGD(config.learning_rate, momentum=config.momentum)
  if config.mixed_precision == "mixed_float16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer
