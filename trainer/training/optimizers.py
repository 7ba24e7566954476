"""The optimizer: the task's own, or the one --optimizer names."""

import keras

from trainer.config import Config


def build_optimizer(config: Config, task) -> keras.optimizers.Optimizer:
  """The task's optimizer if it builds one, else --optimizer at --learning_rate.

  The rate is then driven by the train loop (--lr_schedule). Under
  --mixed_precision=mixed_float16 it is wrapped for dynamic loss scaling. Call it
  inside `strategy.scope()`.
  """
  optimizer = task.build_optimizer()
  if optimizer is None:
    rate = config.learning_rate
    if config.optimizer == "adam":
      optimizer = keras.optimizers.Adam(rate)
    elif config.optimizer == "adamw":
      optimizer = keras.optimizers.AdamW(rate, weight_decay=config.weight_decay)
    elif config.optimizer == "lion":
      optimizer = keras.optimizers.Lion(rate, weight_decay=config.weight_decay or None)
    elif config.optimizer == "sgd":
      optimizer = keras.optimizers.SGD(rate)
    else:
      optimizer = keras.optimizers.SGD(rate, momentum=config.momentum)
  if config.mixed_precision == "mixed_float16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer
