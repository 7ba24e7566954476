"""Everything a run builds before its first step, created under the strategy."""

import dataclasses
import re

import keras
import tensorflow as tf

from trainer.config import Config
from trainer.errors import TaskError
from trainer.tasks import Task
from trainer.training import ledger, steps
from trainer.training.checkpoints import Checkpoints
from trainer.training.optimizers import build_optimizer

_METRIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
_RESERVED = ("loss", "examples")


@dataclasses.dataclass
class RunState:
  """The task, model, optimizer, counters and compiled loops of one run."""
  config: Config
  task: Task
  strategy: tf.distribute.Strategy
  train_data: object  # data.ArrayData or data.StreamData
  eval_data: object  # the same, or None when the task has no eval split
  is_chief: bool
  model: keras.Model
  optimizer: keras.optimizers.Optimizer
  global_step: tf.Variable
  metric_names: tuple  # The task's metrics, in the order it returns them.
  checkpoints: Checkpoints
  train_ledger: ledger.ReplicaLedger
  eval_ledger: ledger.ReplicaLedger
  train_totals: ledger.Totals
  eval_totals: ledger.Totals
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


def _probe(task: Task, model, train_data, size: int) -> tuple:
  """Calls the model on a few training examples (building a subclassed model's
  weights) and checks the task's loss and metrics on them.

  Returns:
    The metric names, in the task's order.

  Raises:
    TaskError: the loss or a metric is not one value per example, or a metric
      name cannot be a tag.
  """
  features, labels = train_data.first(size)
  outputs = model(task.preprocess(features), training=False)
  batch = int(tf.shape(tf.nest.flatten(features)[0])[0])
  named = {"loss": task.loss(labels, outputs), **task.metrics(labels, outputs)}
  for name, values in named.items():
    shape = tuple(tf.convert_to_tensor(values).shape)
    if shape != (batch,):
      what = "Task.loss" if name == "loss" else f"Task.metrics()[{name!r}]"
      raise TaskError(f"{what} must return one value per example, shape ({batch},) "
                      f"for a batch of {batch}, got shape {shape}")
  metric_names = tuple(named)[1:]
  for name in metric_names:
    if name in _RESERVED or not _METRIC_NAME.match(name):
      raise TaskError(f"Task.metrics(): {name!r} cannot be a metric name (use "
                      "letters, digits, _ . -; not loss or examples)")
  return metric_names


def build_state(config: Config, task: Task, strategy: tf.distribute.Strategy, *,
                train_data, eval_data, is_chief: bool) -> RunState:
  """Builds model, optimizer (built in scope, before any step), step and loops.

  Args:
    config: the run's config.
    task: the task, bound to `config`.
    strategy: the strategy to build under.
    train_data: the task's checked training data.
    eval_data: the task's checked eval data, or None.
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
      keras.utils.set_random_seed(config.seed)
      model = task.build_model()
      if not isinstance(model, keras.Model):
        raise TaskError(f"Task.build_model() must return a keras.Model, got "
                        f"{type(model).__name__}")
      metric_names = _probe(task, model, train_data, min(
          config.per_replica_batch_size, 8))
      optimizer = build_optimizer(config, task)
      optimizer.build(model.trainable_variables)
      # Its own variable, not optimizer.iterations: loss scaling skips updates.
      global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      train_ledger = ledger.ReplicaLedger(num_replicas=num_replicas, name="train")
      eval_ledger = ledger.ReplicaLedger(num_replicas=num_replicas, name="eval")
      train_totals = ledger.Totals("loss", "examples", *metric_names)
      eval_totals = ledger.Totals("loss", "examples", *metric_names)
  finally:
    keras.mixed_precision.set_global_policy(previous_policy)
  checkpoints = Checkpoints(model_dir=config.model_dir, model=model,
                            optimizer=optimizer, global_step=global_step,
                            keep=config.keep_checkpoints, is_chief=is_chief)
  train_loop = steps.make_train_loop(
      strategy=strategy, task=task, model=model, optimizer=optimizer,
      global_step=global_step, ledger=train_ledger, totals=train_totals,
      per_replica_batch_size=config.per_replica_batch_size,
      global_batch_size=config.per_replica_batch_size * num_replicas,
      jit_compile=config.jit_compile)
  eval_loop = steps.make_eval_loop(
      strategy=strategy, task=task, model=model, ledger=eval_ledger,
      totals=eval_totals, per_replica_batch_size=config.per_replica_batch_size)
  return RunState(config=config, task=task, strategy=strategy, train_data=train_data,
                  eval_data=eval_data, is_chief=is_chief, model=model,
                  optimizer=optimizer, global_step=global_step,
                  metric_names=metric_names, checkpoints=checkpoints,
                  train_ledger=train_ledger, eval_ledger=eval_ledger,
                  train_totals=train_totals, eval_totals=eval_totals,
                  train_loop=train_loop, eval_loop=eval_loop,
                  stop_vote=steps.make_stop_vote(strategy))
