"""Building the trainer of a run: the model and its checked objective, the
optimizer (built in the strategy's scope, before any step), the global step, the
ledgers and totals, the replica layers' patches and the compiled loops."""

import contextlib
import functools

import keras
import tensorflow as tf

from trainer.config import OptimizationConfig
from trainer.data import Order, TaskData
from trainer.distribute.cluster import Cluster
from trainer.errors import ConfigError, user_code
from trainer.tasks import Task
from trainer.training import (graph_passes, ledger, optimizers, patch_check,
                              probe, replica_layers, steps)
from trainer.training.train_loop import TrainLoop
from trainer.training.trainer import Trainer
from trainer.training.weights import Weights


def build_trainer(*, task: Task, strategy, cluster: Cluster, train_data: TaskData,
                  optimization: OptimizationConfig, order: Order,
                  per_replica_batch_size: int, seed: int, train_steps: int,
                  gather: bool, gather_eval: bool = False,
                  keep_gradients: bool = False, record_every: int = 0,
                  sync_batchnorm=None) -> Trainer:
  """Builds the model, optimizer (built in scope, before any step), step and
  loops.

  Args:
    task: the task (prepared).
    strategy: the strategy to build under.
    cluster: this process's place in the run.
    train_data: the task's checked training data (probed for the model).
    optimization: the OptimizationConfig.
    order: the training data's order.
    per_replica_batch_size: examples per replica per (micro-)step.
    seed: Keras' seed before build_model.
    train_steps: --train_steps (where the schedule's decay ends by default).
    gather: gather arrays in-graph when they allow it (--array_input=gather).
    gather_eval: the same for eval splits.
    keep_gradients: keep a copy of each update's gradients (histograms).
    record_every: a history row every this many steps inside loop calls
      (summary points; 0: none).
    sync_batchnorm: when training, whether BatchNormalization normalises with
      the global batch's statistics (True) or each replica's (False; their
      moving statistics are averaged at every step), and random layers
      draw per replica either way (replica_layers); None (evaluating,
      loading): the model stays as the task built it.

  Raises:
    TaskError: the task's model, loss or metrics do not fit the framework.
  """
  with _global_policy(optimization.mixed_precision), strategy.scope():
    keras.utils.set_random_seed(seed)
    model, objective, metric_names, reported = probe.model_and_objective(
        task, train_data, probe.probe_size(per_replica_batch_size),
        class_weight=optimization.class_weights,
        replicas=strategy.num_replicas_in_sync)
    with user_code("Task.build_optimizer"):
      own = task.build_optimizer()
    optimizer = optimizers.build_optimizer(optimization, own)
    optimizer.build(model.trainable_variables)
    rule = optimizers.update_rule(optimization, model=model, optimizer=optimizer,
                                  train_steps=train_steps,
                                  keep_gradients=keep_gradients,
                                  task_optimizer=own is not None)
    global_step, ledgers, totals = _counters(strategy, metric_names)
  left_alone, averaged = (), replica_layers.Averaged()
  if sync_batchnorm is not None:
    left_alone, averaged = _replica_layers(model, strategy, optimization,
                                           sync_batchnorm=sync_batchnorm)
  gather_input = train_data.gather_input(
      strategy, cluster, order, per_replica_batch_size=per_replica_batch_size,
      preprocess=objective.preprocess) if gather else None
  train = TrainLoop(
      strategy=strategy, objective=objective, model=model, optimizer=optimizer,
      global_step=global_step, ledger=ledgers[0], totals=totals[0],
      per_replica_batch_size=per_replica_batch_size,
      global_batch_size=order.global_batch_size,
      jit_compile=optimization.jit_compile, rule=rule, gather=gather_input,
      record_every=record_every, averaged_statistics=averaged)
  build_eval_loop = functools.partial(
      steps.make_eval_loop, strategy=strategy, objective=objective, model=model,
      ledger=ledgers[1], totals=totals[1],
      per_replica_batch_size=per_replica_batch_size)
  return Trainer(
      task=task, objective=objective, strategy=strategy, cluster=cluster,
      model=model, optimizer=optimizer, global_step=global_step, rule=rule,
      weights=Weights(model=model, averages=rule.ema_variables,
                      eval_with_ema=optimization.eval_with_ema),
      metric_names=metric_names, reported_metrics=reported,
      base_learning_rate=optimizers.learning_rate(optimizer),
      task_optimizer=own is not None,
      per_replica_batch_size=per_replica_batch_size, order=order,
      train_ledger=ledgers[0], eval_ledger=ledgers[1], train_totals=totals[0],
      eval_totals=totals[1], train_loop=train.loop,
      history_columns=train.history_columns, diagnose_step=train.diagnose,
      forward_backward=train.forward_backward, build_eval_loop=build_eval_loop,
      gather=gather_input, vote=steps.make_vote(strategy), gather_eval=gather_eval,
      jit_compile=optimization.jit_compile,
      own_moments_layers=tuple(left_alone), averaged_statistics=averaged,
      lean_graph_passes=graph_passes.lean_for(strategy))


def _replica_layers(model, strategy, optimization, *, sync_batchnorm: bool) -> tuple:
  """Makes `model`'s random layers draw per replica and (with `sync_batchnorm`,
  on several replicas) its BatchNormalization layers use the global batch, after
  checking that these patches take effect. Returns (the layers left with their
  own moments, the replica_layers.Averaged statistics).

  Raises:
    ConfigError: the patches do not take effect with this Keras; XLA with a
      synchronized BatchNormalization.
    TaskError: a BatchNormalization inside a recurrent cell, under sync.
  """
  patch_check.check_patches()
  replica_layers.draw_per_replica(model)
  replicas = strategy.num_replicas_in_sync
  if replicas == 1:
    return (), replica_layers.Averaged()
  left_alone = ()
  if sync_batchnorm:
    left_alone = replica_layers.synchronize_batchnorm(model)
    if optimization.jit_compile and len(left_alone) < len(
        replica_layers.batchnorm_layers(model)):
      # Its all-reduce runs inside the step XLA compiles: a merge_call there
      # fails at the first trace.
      raise ConfigError(
          f"--jit_compile: BatchNormalization synchronized over {replicas} "
          "replicas (--sync_batchnorm) all-reduces inside the compiled step, "
          "which XLA cannot; use --sync_batchnorm=false (each replica's "
          "statistics) or leave out --jit_compile")
  return left_alone, replica_layers.per_replica_statistics(model)


@contextlib.contextmanager
def _global_policy(name: str):
  """Keras' global dtype policy set to `name` ("none": unchanged) while the model
  and optimizer are built, then restored."""
  previous = keras.mixed_precision.global_policy()
  if name != "none":
    keras.mixed_precision.set_global_policy(name)
  try:
    yield
  finally:
    keras.mixed_precision.set_global_policy(previous)


def _counters(strategy, metric_names):
  """The global step, and the train and eval ReplicaLedgers and Totals, built in
  `strategy`'s scope."""
  global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  ledgers = [ledger.ReplicaLedger(num_replicas=strategy.num_replicas_in_sync,
                                  name=name) for name in ("train", "eval")]
  totals = [ledger.Totals("loss", "examples", "weight", *metric_names) for _ in "te"]
  return global_step, ledgers, totals
