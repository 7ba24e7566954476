"""The flags tests train with, in one place, and a Config from flags as the CLI
builds it (the built-in task's hyperparameters included)."""

import trainer
from trainer import config as config_lib

# The MLP on the 8x8 digits with plain SGD: fast, and weights compare meaningfully.
MLP_SGD = ("--dataset=digits", "--model=mlp", "--optimizer=sgd")
# The same, small: 8 examples per replica, a checkpoint every 10 steps, no events.
FAST = (*MLP_SGD, "--learning_rate=0.1", "--per_replica_batch_size=8",
        "--checkpoint_every=10", "--steps_per_loop=5", "--summaries=false")


def config(*flags, **fields) -> trainer.Config:
  """The Config of `flags` (parsed as the CLI parses them), with `fields` set."""
  return config_lib.from_argv(list(flags)).replace(**fields)


def train(*flags, task=None, actions=(), **fields) -> dict:
  """`trainer.train` in this process on the Config of `flags` and `fields`."""
  return trainer.train(config(*flags, **fields), task=task, actions=actions)
