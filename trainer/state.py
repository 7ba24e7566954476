"""Everything a run builds before its first step, created under the strategy."""

import dataclasses

import keras
import tensorflow as tf

from trainer import models, steps
from trainer.checkpoints import Checkpoints
from trainer.config import Config
from trainer.data import Source


@dataclasses.dataclass
class RunState:
  """The model, optimizer, counters and compiled loops of one run."""
  config: Config
  strategy: tf.distribute.Strategy
  source: Source
  is_chief: bool
  model: keras.Model
  optimizer: keras.optimizers.Optimizer
  global_step: tf.Variable
  checkpoints: Checkpoints
  train_ledger: steps.ReplicaLedger
  eval_ledger: steps.ReplicaLedger
  train_totals: steps.Totals
  eval_totals: steps.Totals
  train_loop: object
  eval_loop: object
  stop_vote: object

  @property
  def num_replicas(self) -> int:
    return self.strategy.num_replicas_in_sync

  @property
  def global_batch_size(self) -> int:
    return self.config.per_replica_batch_size * self.num_replicas

  @property
  def step(self) -> int:
    return int(self.global_step.numpy())


def build_state(config: Config, strategy: tf.distribute.Strategy, source: Source, *,
                is_chief: bool) -> RunState:
  """Builds model, optimizer (built in scope, before any step), step and loops.

  Args:
    config: the run's config.
    strategy: the strategy to build under.
    source: the data set (for input shape and class count).
    is_chief: whether this process writes the real checkpoints.

  Returns:
    A RunState, with nothing restored yet.
  """
  num_replicas = strategy.num_replicas_in_sync
  previous_policy = keras.mixed_precision.global_policy()
  if config.mixed_precision != "none":
    keras.mixed_precision.set_global_policy(config.mixed_precision)
  try:
    with strategy.scope():
      model = models.build_model(config, input_shape=source.input_shape,
                                 num_classes=source.num_classes)
      optimizer = models.build_optimizer(config)
      optimizer.build(model.trainable_variables)
      # Its own variable, not optimizer.iterations: loss scaling skips updates.
      global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      train_ledger = steps.ReplicaLedger(num_replicas=num_replicas, name="train")
      eval_ledger = steps.ReplicaLedger(num_replicas=num_replicas, name="eval")
      train_totals = steps.Totals("loss", "correct", "examples")
      eval_totals = steps.Totals("loss", "correct", "examples")
  finally:
    keras.mixed_precision.set_global_policy(previous_policy)
  checkpoints = Checkpoints(model_dir=config.model_dir, model=model,
                            optimizer=optimizer, global_step=global_step,
                            keep=config.keep_checkpoints, is_chief=is_chief)
  train_loop = steps.make_train_loop(
      strategy=strategy, model=model, optimizer=optimizer, global_step=global_step,
      ledger=train_ledger, totals=train_totals,
      per_replica_batch_size=config.per_replica_batch_size,
      global_batch_size=config.per_replica_batch_size * num_replicas,
      jit_compile=config.jit_compile)
  eval_loop = steps.make_eval_loop(
      strategy=strategy, model=model, ledger=eval_ledger, totals=eval_totals,
      per_replica_batch_size=config.per_replica_batch_size)
  return RunState(config=config, strategy=strategy, source=source, is_chief=is_chief,
                  model=model, optimizer=optimizer, global_step=global_step,
                  checkpoints=checkpoints, train_ledger=train_ledger,
                  eval_ledger=eval_ledger, train_totals=train_totals,
                  eval_totals=eval_totals, train_loop=train_loop, eval_loop=eval_loop,
                  stop_vote=steps.make_stop_vote(strategy))
