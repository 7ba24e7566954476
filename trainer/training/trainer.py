"""The trainer: the model, optimizer, global step, update rule, ledgers, totals and
compiled loops of one run (trainer_build.py builds it under the strategy), and
what it runs: loop calls, evaluations, votes."""

import dataclasses

import keras
import tensorflow as tf

from trainer.data import Order, TaskData
from trainer.distribute.cluster import Cluster
from trainer.errors import user_code
from trainer.tasks import Task
from trainer.training import ledger, steps
from trainer.training.checkpoint_files import model_variables, rng_states
from trainer.training.objective import Objective
from trainer.training.train_loop import UpdateRule
from trainer.training.weights import Weights


@dataclasses.dataclass
class Trainer:
  """What trains: built by `trainer_build.build_trainer`, restored by
  `Checkpoints`.

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
    weights: the weights evaluations and exports use (the moving averages with
      --eval_with_ema, a best checkpoint's), swapped in for a block.
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
    vote: `(code, steps_per_loop) -> (largest code, fewest steps)` over every
      worker (steps.make_vote): `stop_vote` and `loop_vote`.
    gather_eval: gather eval arrays in-graph too (--array_input=gather).
    jit_compile: the replica's forward and backward pass is compiled with XLA
      (--jit_compile).
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
  weights: Weights
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
  vote: object
  gather_eval: bool = False
  jit_compile: bool = False
  lean_graph_passes: bool = False
  own_moments_layers: tuple = ()
  averaged_statistics: object = None
  _eval_loops: dict = dataclasses.field(default_factory=dict)

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
    return self.vote(int(code), 1)[0]

  def loop_vote(self, code: int, steps_per_loop: int) -> tuple:
    """`stop_vote` after a loop call, which also agrees on the next automatic
    loop length: (the largest code, the fewest steps any worker proposed, at most
    steps.MAX_AUTO_STEPS_PER_LOOP). One collective for both."""
    return self.vote(int(code), int(steps_per_loop))

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
    if self.rule.rate_set is not None:  # A resume adopts no rate it set itself.
      extra["learning_rate_set"] = self.rule.rate_set
    return core, extra

  def set_peak_rate(self, value: float):
    """Sets the rate the schedule scales (the flag's times the rollbacks')."""
    if self.rule.rate_base is not None:
      self.rule.rate_base.assign(value)

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
    with self.weights.evaluated():
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


def _mean(total: float, count: float) -> float:
  """total / count, 0 when nothing counted (as a Keras Mean of no weight)."""
  return float(total) / float(count) if count else 0.0


