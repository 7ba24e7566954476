"""The trainer: the model, optimizer, global step, update rule, ledgers, totals and
compiled loops of one run, built under the strategy before the first step."""

import contextlib
import dataclasses
import functools

import keras
import numpy as np
import tensorflow as tf

from trainer.config import OptimizationConfig
from trainer.data import Order, TaskData
from trainer.distribute.cluster import Cluster
from trainer.errors import ConfigError, user_code
from trainer.tasks import Task
from trainer.training import (graph_passes, ledger, optimizers, patch_check,
                              probe, replica_layers, steps)
from trainer.training.checkpoint_files import model_variables, rng_states
from trainer.training.objective import Objective
from trainer.training.train_loop import TrainLoop, UpdateRule


@dataclasses.dataclass
class Trainer:
  """What trains: built by `Trainer.build`, restored by `Checkpoints`.

  Attributes:
    task: the task.
    objective: its loss and metrics as a step computes them (streaming ones too).
    strategy: the strategy the variables live under.
    cluster: this process's place in the run.
    model: the task's Keras model.
    optimizer: its optimizer, built before the first step.
    global_step: the int64 step variable (not optimizer.iterations: loss scaling
      skips updates).
    rule: accumulation, clipping, the learning-rate schedule and EMA.
    eval_with_ema: evaluate and export the moving averages (--eval_with_ema).
    metric_names: the task's per-example metrics, in the order it returns them.
    reported_metrics: what a call or evaluation reports: "loss", the metrics and
      streaming metrics after Task.finalize_metrics.
    base_learning_rate: the optimizer's rate as built (None: the task's schedule).
    task_optimizer: whether the optimizer is the task's (Task.build_optimizer).
    per_replica_batch_size: examples per replica per (micro-)step.
    order: the training data's order (seed, shuffle, buffer, global batch).
    train_ledger, eval_ledger: batches and examples per replica.
    train_totals, eval_totals: a loop call's summed loss and metrics.
    train_loop: `(iterator, num_steps) -> outputs` (train_loop.TrainLoop).
    history_columns: the names of the columns of the loop's "history" rows.
    diagnose_step: one train step with its gradients (divergence.py).
    forward_backward: `(features, labels, weights) -> (gradients, loss,
      outputs)` of one replica's batch, as a step computes it (equivalence.py).
    build_eval_loop: `gather -> eval_loop(iterator, num_steps)`
      (steps.make_eval_loop of this trainer's model, objective, eval ledger and
      totals); `evaluate` builds one per eval split (the iterator's, or one
      gathering its arrays).
    gather: data.GatherInput when the replicas gather arrays in-graph (the loops
      then take no iterator), else None.
    gather_eval: gather eval arrays in-graph too (--array_input=gather).
    lean_graph_passes: compile the loops and the diagnose step with
      graph_passes' lean Grappler passes (graph_passes.lean_for).
    own_moments_layers: BatchNormalization subclasses with their own
      `_moments`, which --sync_batchnorm leaves alone (each replica's own).
    averaged_statistics: the moving statistics that each replica updates on its
      own and the train loop averages at every step (replica_layers.Averaged).
  """
  task: Task
  objective: Objective
  strategy: tf.distribute.Strategy
  cluster: Cluster
  model: keras.Model
  optimizer: keras.optimizers.Optimizer
  global_step: tf.Variable
  rule: UpdateRule
  eval_with_ema: bool
  metric_names: tuple
  reported_metrics: tuple
  base_learning_rate: object
  task_optimizer: bool
  per_replica_batch_size: int
  order: Order
  train_ledger: ledger.ReplicaLedger
  eval_ledger: ledger.ReplicaLedger
  train_totals: ledger.Totals
  eval_totals: ledger.Totals
  train_loop: object
  history_columns: tuple
  diagnose_step: object
  forward_backward: object
  build_eval_loop: object
  gather: object
  _vote: object
  gather_eval: bool = False
  lean_graph_passes: bool = False
  own_moments_layers: tuple = ()
  averaged_statistics: object = None
  _eval_loops: dict = dataclasses.field(default_factory=dict)

  @classmethod
  def build(cls, *, task: Task, strategy, cluster: Cluster, train_data: TaskData,
            optimization: OptimizationConfig, order: Order,
            per_replica_batch_size: int, seed: int, train_steps: int,
            gather: bool, gather_eval: bool = False, keep_gradients: bool = False,
            record_every: int = 0, sync_batchnorm=None) -> "Trainer":
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
        moving statistics are averaged after each loop call), and random layers
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
                                    keep_gradients=keep_gradients)
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
    return cls(task=task, objective=objective, strategy=strategy, cluster=cluster,
               model=model, optimizer=optimizer, global_step=global_step, rule=rule,
               eval_with_ema=optimization.eval_with_ema, metric_names=metric_names,
               reported_metrics=reported,
               base_learning_rate=optimizers.learning_rate(optimizer),
               task_optimizer=own is not None,
               per_replica_batch_size=per_replica_batch_size, order=order,
               train_ledger=ledgers[0], eval_ledger=ledgers[1],
               train_totals=totals[0], eval_totals=totals[1], train_loop=train.loop,
               history_columns=train.history_columns,
               diagnose_step=train.diagnose, forward_backward=train.forward_backward,
               build_eval_loop=build_eval_loop,
               gather=gather_input,
               _vote=steps.make_vote(strategy), gather_eval=gather_eval,
               own_moments_layers=tuple(left_alone),
               averaged_statistics=averaged,
               lean_graph_passes=graph_passes.lean_for(strategy))

  @property
  def step(self) -> int:
    return int(self.global_step.numpy())

  @property
  def num_replicas(self) -> int:
    return self.strategy.num_replicas_in_sync

  @property
  def global_batch_size(self) -> int:
    return self.order.global_batch_size

  @property
  def accum_steps(self) -> int:
    return self.rule.accum_steps

  def stop_vote(self, code: int) -> int:
    """The largest of every worker's `code` (a collective under multi-worker):
    every worker agrees on whether (and why) to stop."""
    return self._vote(int(code), 1)[0]

  def loop_vote(self, code: int, steps_per_loop: int) -> tuple:
    """`stop_vote` after a loop call, which also agrees on the next automatic
    loop length: (the largest code, the fewest steps any worker proposed, at most
    steps.MAX_AUTO_STEPS_PER_LOOP). One collective for both."""
    return self._vote(int(code), int(steps_per_loop))

  def checkpoint_objects(self) -> tuple:
    """({name: trackable} every checkpoint must hold, {name: trackable} a
    checkpoint of an earlier version may lack)."""
    core = dict(model=model_variables(self.model), optimizer=self.optimizer,
                global_step=self.global_step, rng=rng_states(self.model))
    with user_code("Task.checkpoint_items"):
      items = self.task.checkpoint_items()
    extra = {f"task_{k}": v for k, v in items.items()}
    if self.rule.ema_variables:
      extra["ema"] = list(self.rule.ema_variables)
    return core, extra

  def set_peak_rate(self, value: float):
    """Sets the rate the schedule scales (the flag's times the rollbacks')."""
    if self.rule.rate_base is not None:
      self.rule.rate_base.assign(value)

  def reset_averages(self):
    """Starts the moving averages from the current weights."""
    for average, variable in zip(self.rule.ema_variables,
                                 self.model.trainable_variables):
      average.assign(variable)

  @contextlib.contextmanager
  def evaluated_weights(self):
    """The weights to evaluate and export: the moving averages with --ema_decay and
    --eval_with_ema (swapped in for the block, then the raw weights back)."""
    if not (self.rule.ema_variables and self.eval_with_ema):
      yield
      return
    variables = self.model.trainable_variables
    with _values_kept(variables):
      for variable, average in zip(variables, self.rule.ema_variables):
        variable.assign(average)
      yield

  def _weight_groups(self) -> dict:
    groups = {"model": model_variables(self.model)}
    if self.rule.ema_variables:
      groups["ema"] = list(self.rule.ema_variables)
    return groups

  def read_weights(self, path: str):
    """Sets the model's (and averages') weights to the checkpoint's at `path`."""
    tf.train.Checkpoint(**self._weight_groups()).read(path).expect_partial()

  @contextlib.contextmanager
  def best_weights(self, path: str):
    """The model's (and averages') weights of the best checkpoint at `path`, for
    the block; the current ones back afterwards."""
    with _values_kept([v for group in self._weight_groups().values() for v in group]):
      self.read_weights(path)
      yield

  def use_evaluated_weights(self):
    """Makes the evaluated weights (see `evaluated_weights`) the model's own."""
    if self.rule.ema_variables and self.eval_with_ema:
      for variable, average in zip(self.model.trainable_variables,
                                   self.rule.ema_variables):
        variable.assign(average)

  def train_iterator(self, train_data: TaskData):
    """What the train loop reads from the global step on: the distributed
    iterator of training batches; with in-graph gathering, None (arrays: the
    order is computed in-graph) or a host reader of ids (decoded records, a
    dataset held in memory: data.gather.StreamedIdsGather)."""
    # Each update reads --grad_accum_steps global batches of the stream.
    if self.gather is not None:
      return self.gather.iterator(self.step * self.accum_steps)
    return iter(train_data.train_input(
        self.strategy, self.cluster, self.order,
        start_step=self.step * self.accum_steps, preprocess=self.task.preprocess))

  def loop_input(self, iterator, num_steps: int):
    """What a train loop (or diagnose) call of `num_steps` updates takes as its
    iterator, given `train_iterator`'s."""
    if self.gather is None:
      return iterator
    return self.gather.loop_input(iterator, num_steps * self.accum_steps)

  def run_train_loop(self, train_data: TaskData, iterator, num_steps,
                     *, step: int) -> dict:
    """One loop call of `num_steps` (a tensor) from `step`; its outputs as numpy.

    Raises:
      ReplicaBatchError: a replica's batch had the wrong size.
      DataError: a bad record (TFRecords) stopped the input.
    """
    # This worker's stream positions: its share of the global batches.
    per_step = (self.accum_steps * self.global_batch_size
                // self.cluster.num_pipelines)
    outputs = steps.call_checked(
        self.train_loop, self.loop_input(iterator, int(num_steps)), num_steps,
        lean_graph_passes=self.lean_graph_passes,
        explain_input_error=lambda e: train_data.explain_error(
            e, self.cluster, split="train", step=step, order=self.order,
            position=step * per_step, records=int(num_steps) * per_step))
    return {k: v.numpy() for k, v in outputs.items()}

  def call_metrics(self, outputs: dict, *, num_steps: int) -> dict:
    """What a loop call of `num_steps` steps reports, from its outputs: "loss"
    (the mean of the steps' losses), each metric's weighted mean and each
    streaming metric's result, after `Task.finalize_metrics`."""
    sums = {name: float(outputs[name]) for name in self.metric_names}
    weight = float(outputs["weight"])
    means = {"loss": float(outputs["loss"]) / num_steps}
    means.update({name: _mean(value, weight) for name, value in sums.items()})
    return self.objective.report(
        means, sums=dict(sums, loss=float(outputs["loss"]), weight=weight),
        examples=int(outputs["examples"]),
        streaming={name: outputs[name] for name in self.objective.streaming})

  def evaluate(self, eval_data: TaskData) -> dict:
    """Runs the padded eval split through the eval loop, with the evaluated
    weights.

    Returns:
      {"loss", each task metric (after `Task.finalize_metrics`), "examples"}:
      weighted means over the real examples, and their count, which equals the
      split's size on any replica count.

    Raises:
      ReplicaBatchError: a replica did not get exactly one full batch per step.
    """
    loop, gather = self._eval_loop_of(eval_data)
    if gather is None:
      dataset, num_batches = eval_data.eval_input(
          self.strategy, self.cluster, global_batch_size=self.global_batch_size,
          preprocess=self.task.preprocess)
      iterator = iter(dataset)
    else:
      iterator, num_batches = None, gather.eval_steps
    with self.evaluated_weights():
      streaming = steps.call_checked(
          loop, iterator, tf.constant(num_batches),
          lean_graph_passes=self.lean_graph_passes,
          explain_input_error=lambda e: eval_data.explain_error(
              e, self.cluster, split="eval", step=self.step))
    self.eval_ledger.check(expected_batches=num_batches,
                           per_replica_batch_size=self.per_replica_batch_size)
    sums = self.eval_totals.read()
    examples, weight = sums.pop("examples"), sums.pop("weight")
    # As Keras: the loss is the weighted losses' mean over the examples, a
    # metric its weighted mean (over the weights).
    means = {k: _mean(v, examples if k == "loss" else weight)
             for k, v in sums.items()}
    examples = int(round(examples))
    reported = self.objective.report(means, sums=dict(sums, weight=weight),
                                     examples=examples, streaming=streaming)
    return dict(reported, examples=examples)


  def _eval_loop_of(self, eval_data: TaskData) -> tuple:
    """(eval loop, data.gather.EvalGather or None) for an eval split, built at
    its first evaluation: arrays are gathered in-graph where training's are (no
    iterator to build per evaluation, no get_next per step)."""
    key = id(eval_data)
    if key not in self._eval_loops:
      gather = None
      if self.gather_eval:
        gather = eval_data.gather_input(
            self.strategy, self.cluster, None,
            per_replica_batch_size=self.per_replica_batch_size,
            preprocess=self.objective.preprocess)
      # eval_data is kept with its loop, so its id is not reused.
      self._eval_loops[key] = (self.build_eval_loop(gather=gather), gather,
                              eval_data)
    return self._eval_loops[key][:2]


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


def _mean(total: float, count: float) -> float:
  """total / count, 0 when nothing counted (as a Keras Mean of no weight)."""
  return float(total) / float(count) if count else 0.0


@contextlib.contextmanager
def _values_kept(variables):
  """Gives `variables` back the values they have now when the block ends."""
  kept = [tf.convert_to_tensor(v) for v in variables]  # Eager reads: copies.
  try:
    yield
  finally:
    for variable, value in zip(variables, kept):
      variable.assign(value)


def ledger_totals(trainer: Trainer) -> tuple:
  """(batches, examples) per replica over the run, as lists for the record."""
  return (trainer.train_ledger.total_batches.tolist(),
          trainer.train_ledger.total_examples.tolist())


def set_ledger_totals(trainer: Trainer, batches, examples):
  """Sets the run's ledger totals (zeros where None)."""
  zeros = np.zeros(trainer.num_replicas, np.int64)
  trainer.train_ledger.total_batches = zeros.copy() if batches is None else np.array(
      batches, np.int64)
  trainer.train_ledger.total_examples = zeros.copy() if examples is None else (
      np.array(examples, np.int64))


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
