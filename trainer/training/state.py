"""Everything a run builds before its first step, created under the strategy."""

import contextlib
import dataclasses
import hashlib
import json
import os

import numpy as np

import keras
import tensorflow as tf

from trainer import data
from trainer.config import Config
from trainer.errors import TaskError
from trainer.outputs import run_dir
from trainer.tasks import Task
from trainer.tasks.base import METRIC_NAME
from trainer.training import ledger, schedules, steps
from trainer.training import checkpoints as checkpoints_lib
from trainer.training.checkpoints import CHECKPOINT_SUBDIR, Checkpoints
from trainer.training.optimizers import build_optimizer

_RESERVED = ("loss", "examples")
_FINGERPRINT_BYTES = 64 * 2**20  # Enough to tell data sets apart, fast to read.


class RunRecord:
  """The run's own numbers that a checkpoint must carry so a resume continues the
  run rather than starting a new record: the ledger's totals, the best evaluation
  and the learning rate the run was started with. JSON in a string variable.
  """

  def __init__(self):
    # Outside any strategy scope: a string variable cannot be mirrored to a GPU.
    self.variable = tf.Variable("{}", dtype=tf.string, trainable=False,
                                name="run_record")
    self.data = {}

  def load(self):
    try:
      self.data = json.loads(self.variable.numpy().decode() or "{}")
    except ValueError:
      self.data = {}

  def store(self):
    self.variable.assign(json.dumps(self.data, sort_keys=True))


@dataclasses.dataclass
class RunState:
  """The task, model, optimizer, counters and compiled loops of one run."""
  config: Config
  task: Task
  strategy: tf.distribute.Strategy
  train_data: object  # data.ArrayData, StreamData, TFRecords or PipelineData
  eval_data: object  # the same, or None when the task has no eval split
  is_chief: bool
  model: keras.Model
  optimizer: keras.optimizers.Optimizer
  global_step: tf.Variable
  metric_names: tuple  # The task's metrics, in the order it returns them.
  reported_metrics: tuple  # "loss" and what Task.finalize_metrics reports.
  checkpoints: Checkpoints
  record: RunRecord
  base_learning_rate: float  # The optimizer's rate as built (from the flags).
  rule: steps.UpdateRule  # Accumulation, clipping, schedule, EMA.
  data_identity: dict  # What the training data is (see data_identity()).
  train_ledger: ledger.ReplicaLedger
  eval_ledger: ledger.ReplicaLedger
  train_totals: ledger.Totals
  eval_totals: ledger.Totals
  train_loop: object
  diagnose_step: object  # One train step with its gradients (divergence.py).
  gather_input: object  # data.GatherInput (the loops then take no iterator), or None.
  eval_loop: object
  stop_vote: object
  per_replica_batch_size: int  # From the batch flags and the replica count.

  @property
  def num_replicas(self) -> int:
    return self.strategy.num_replicas_in_sync

  @property
  def num_workers(self) -> int:
    # pylint: disable-next=protected-access
    return getattr(self.strategy.extended, "_num_workers", 1)

  @property
  def global_batch_size(self) -> int:
    return self.per_replica_batch_size * self.num_replicas

  @property
  def step(self) -> int:
    return int(self.global_step.numpy())

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
    if not (self.rule.ema_variables and self.config.eval_with_ema):
      yield
      return
    variables = self.model.trainable_variables
    with _values_kept(variables):
      for variable, average in zip(variables, self.rule.ema_variables):
        variable.assign(average)
      yield

  def save_checkpoint(self) -> str:
    """Saves model, optimizer, step, RNGs and the run record at this step."""
    self.record.data.update(
        ledger_batches=self.train_ledger.total_batches.tolist(),
        ledger_examples=self.train_ledger.total_examples.tolist(),
        base_learning_rate=self.base_learning_rate, data=self.data_identity,
        global_batch_size=self.global_batch_size, num_replicas=self.num_replicas,
        num_workers=self.num_workers,
        input_pipelines=data.input_pipelines(self.strategy)[0])
    self.record.store()
    return self.checkpoints.save()

  @contextlib.contextmanager
  def best_weights(self, path: str):
    """The model's (and averages') weights of the best checkpoint at `path`, for
    the block; the current ones back afterwards."""
    objects = {"model": checkpoints_lib.model_variables(self.model)}
    if self.rule.ema_variables:
      objects["ema"] = list(self.rule.ema_variables)
    with _values_kept([v for group in objects.values() for v in group]):
      tf.train.Checkpoint(**objects).read(path).expect_partial()
      yield

  def save_best_checkpoint(self) -> str:
    """Saves this step's state as the best checkpoint (checkpoints/best/)."""
    self.record.store()
    return self.checkpoints.save_best()

  def restore_checkpoint(self, *, before: int = None):
    """Restores the newest readable checkpoint and its run record.

    Args:
      before: the newest of the steps before this one (a replay).

    Returns:
      The restored step, or None if there was none.
    """
    step = self.checkpoints.restore_latest(before=before)
    if step is None:
      self.record.data.clear()
    else:
      self.record.load()
    self._restore_ledger_totals(step)
    return step

  def _restore_ledger_totals(self, step):
    """The ledger's totals from the record; on another replica count (an elastic
    resume) the old totals move to the record's ledger_history."""
    record = self.record.data
    totals = [record.get("ledger_batches"), record.get("ledger_examples")]
    if totals[0] is not None and len(totals[0]) != self.num_replicas:
      record["ledger_history"] = record.get("ledger_history", []) + [{
          "until_step": step, "num_replicas": len(totals[0]),
          "replica_batches": totals[0], "replica_examples": totals[1]}]
      totals = [None, None]
    for name, values in zip(("batches", "examples"), totals):
      setattr(self.train_ledger, f"total_{name}",
              np.zeros(self.num_replicas, np.int64) if values is None
              else np.array(values, np.int64))

  def resume_changes(self) -> list:
    """What makes the restored checkpoint another run than this one: a different
    global batch (the replica count may change; the batches may not) or other
    training data. One phrase per change; empty when the run can go on."""
    record, changes = self.record.data, []
    was = record.get("global_batch_size")
    if was is None:  # A checkpoint of an earlier version: its results.json says.
      previous = run_dir.read_json(os.path.join(self.config.model_dir,
                                                run_dir.RESULTS_FILE))
      was = previous.get("global_batch_size") if isinstance(previous, dict) else None
    if was is not None and was != self.global_batch_size:
      changes.append(f"global batch {self.global_batch_size} ({self.num_replicas} "
                     f"replica(s) x {self.per_replica_batch_size}; the run has {was})")
    recorded = record.get("data")
    if recorded and recorded != self.data_identity:
      changed = sorted(k for k in set(recorded) | set(self.data_identity)
                       if recorded.get(k) != self.data_identity.get(k))
      changes.append(f"trained on other data ({', '.join(changed)} differ: "
                     f"{recorded.get(changed[0])} then, "
                     f"{self.data_identity.get(changed[0])} now)")
    return changes

  def layout_change_line(self):
    """"resuming on 4 replicas (was 2), global batch 64 unchanged" after an
    elastic resume; None when the replicas and workers are those of the run."""
    record = self.record.data
    was = (record.get("num_replicas"), record.get("num_workers", 1))
    now = (self.num_replicas, self.num_workers)
    if was[0] is None or was == now:
      return None

    def where(replicas, workers):
      return f"{replicas} replicas" + (f" on {workers} workers" if workers > 1 else "")

    before = was[0] if was[1] == now[1] else where(*was)  # "(was 2)" if only replicas.
    return (f"resuming on {where(*now)} (was {before}), global batch "
            f"{self.global_batch_size} unchanged ({self.per_replica_batch_size} per "
            "replica)")


def _probe(task: Task, model, train_data, size: int) -> tuple:
  """Calls the model on a few training examples (building a subclassed model's
  weights) and checks the task's loss and metrics on them.

  Returns:
    (the metric names the task computes, the names it reports after
    `finalize_metrics`, "loss" included).

  Raises:
    TaskError: the loss or a metric is not one value per example, metrics() is
      not a dict, or a metric name cannot be a tag.
  """
  features, labels = train_data.first(size)
  outputs = steps.float32_outputs(model(task.preprocess(features), training=False))
  batch = int(tf.shape(tf.nest.flatten(features)[0])[0])
  metrics = task.metrics(labels, outputs)
  if not isinstance(metrics, dict):
    raise TaskError(f"Task.metrics() must return a dict of per-example values, got "
                    f"{type(metrics).__name__}")
  for name in metrics:
    if not isinstance(name, str) or name in _RESERVED or not METRIC_NAME.match(name):
      raise TaskError(f"Task.metrics(): {name!r} cannot be a metric name (use "
                      "letters, digits, _ . -; not loss or examples)")
  for name, values in {"loss": task.loss(labels, outputs), **metrics}.items():
    shape = tuple(tf.convert_to_tensor(values).shape)
    if shape != (batch,):
      what = "Task.loss" if name == "loss" else f"Task.metrics()[{name!r}]"
      raise TaskError(f"{what} must return one value per example, shape ({batch},) "
                      f"for a batch of {batch}, got shape {shape}")
  reported = task.finalize_metrics({"loss": 1.0, **{name: 1.0 for name in metrics}})
  return tuple(metrics), tuple(reported)


def fingerprint(value) -> str:
  """A short digest of a JSON-like value (lists, dicts, numbers, strings, bytes,
  arrays and tensors inside), the same in every process that builds it."""

  def plain(item):
    if hasattr(item, "numpy"):
      item = item.numpy()
    if isinstance(item, np.ndarray):
      return item.tolist()
    if isinstance(item, bytes):
      return item.decode("utf-8", "backslashreplace")
    return repr(item)

  text = json.dumps(value, sort_keys=True, default=plain)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def data_identity(config: Config, train_data, prepared=None) -> dict:
  """What the training data is, recorded in the checkpoint and checked on resume:
  its features' shapes and types, its size (arrays), a fingerprint of
  --data_path and of what Task.prepare() returned (a vocabulary), so a data set
  changed under the same flags is refused."""
  identity = {"features": str(data.feature_spec(train_data))}
  if prepared is not None:
    identity["prepared"] = fingerprint(prepared)
  if isinstance(train_data, data.ArrayData):
    identity["examples"] = train_data.num_examples
  elif hasattr(train_data, "identity"):  # TFRecords: the files.
    identity.update(train_data.identity())
  if config.data_path:
    digest = hashlib.sha256()
    with open(config.data_path, "rb") as f:
      digest.update(f.read(_FINGERPRINT_BYTES))
    identity["data_path"] = (f"{os.path.getsize(config.data_path)} bytes, sha256 "
                             f"{digest.hexdigest()[:16]}")
  return identity


def _scratch_dir(config: Config, strategy, is_chief: bool):
  """Where a non-chief worker saves its (collective) checkpoints: under the run's
  checkpoints, so a killed worker's leftovers are found and removed next time."""
  if is_chief:
    return None
  resolver = strategy.cluster_resolver
  return os.path.join(config.model_dir, CHECKPOINT_SUBDIR,
                      f".{resolver.task_type}-{resolver.task_id}")


def build_state(config: Config, task: Task, strategy: tf.distribute.Strategy, *,
                train_data, eval_data, is_chief: bool, read_only: bool = False,
                prepared=None) -> RunState:
  """Builds model, optimizer (built in scope, before any step), step and loops.

  Args:
    config: the run's config.
    task: the task, bound to `config`.
    strategy: the strategy to build under.
    train_data: the task's checked training data.
    eval_data: the task's checked eval data, or None.
    is_chief: whether this process writes the real checkpoints.
    read_only: open another process's run (evaluation): never write into it.
    prepared: what Task.prepare() returned (part of the data's identity).

  Returns:
    A RunState, with nothing restored yet.
  """
  num_replicas = strategy.num_replicas_in_sync
  per_replica, global_batch = config.batch_sizes(num_replicas,
                                                 exact=config.mode != "eval")
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
      metric_names, reported_metrics = _probe(task, model, train_data,
                                              min(per_replica, 8))
      task_items = task.checkpoint_items()
      optimizer = build_optimizer(config, task)
      optimizer.build(model.trainable_variables)
      rule = _update_rule(config, model, optimizer)
      # Its own variable, not optimizer.iterations: loss scaling skips updates.
      global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      train_ledger = ledger.ReplicaLedger(num_replicas=num_replicas, name="train")
      eval_ledger = ledger.ReplicaLedger(num_replicas=num_replicas, name="eval")
      train_totals = ledger.Totals("loss", "examples", *metric_names)
      eval_totals = ledger.Totals("loss", "examples", *metric_names)
  finally:
    keras.mixed_precision.set_global_policy(previous_policy)
  record = RunRecord()
  checkpoints = Checkpoints(model_dir=config.model_dir, model=model,
                            optimizer=optimizer, global_step=global_step,
                            keep=config.keep_checkpoints,
                            extra={"record": record.variable,
                                   **({"ema": list(rule.ema_variables)}
                                      if rule.ema_variables else {}),
                                   **{f"task_{k}": v for k, v in task_items.items()}},
                            scratch=_scratch_dir(config, strategy, is_chief),
                            read_only=read_only)
  gather_input = None
  if (config.array_input == "gather" and config.mode != "eval" and
      data.gather_fits(train_data, strategy)):
    gather_input = data.GatherInput(
        strategy=strategy, data=train_data, global_batch_size=global_batch,
        per_replica_batch_size=per_replica, seed=config.seed, shuffle=config.shuffle,
        preprocess=task.preprocess)
  train_loop, diagnose_step = steps.make_train_loop(
      strategy=strategy, task=task, model=model, optimizer=optimizer,
      global_step=global_step, ledger=train_ledger, totals=train_totals,
      per_replica_batch_size=per_replica, global_batch_size=global_batch,
      jit_compile=config.jit_compile, rule=rule, gather=gather_input)
  eval_loop = steps.make_eval_loop(
      strategy=strategy, task=task, model=model, ledger=eval_ledger,
      totals=eval_totals, per_replica_batch_size=per_replica)
  return RunState(config=config, task=task, strategy=strategy, train_data=train_data,
                  eval_data=eval_data, is_chief=is_chief, model=model,
                  optimizer=optimizer, global_step=global_step,
                  metric_names=metric_names, reported_metrics=reported_metrics,
                  checkpoints=checkpoints, record=record,
                  base_learning_rate=_learning_rate(optimizer), rule=rule,
                  data_identity=data_identity(config, train_data, prepared),
                  train_ledger=train_ledger, eval_ledger=eval_ledger,
                  train_totals=train_totals, eval_totals=eval_totals,
                  train_loop=train_loop, diagnose_step=diagnose_step,
                  gather_input=gather_input,
                  eval_loop=eval_loop,
                  stop_vote=steps.make_stop_vote(strategy),
                  per_replica_batch_size=per_replica)


@contextlib.contextmanager
def _values_kept(variables):
  """Gives `variables` back the values they have now when the block ends."""
  kept = [tf.convert_to_tensor(v) for v in variables]  # Eager reads: copies.
  try:
    yield
  finally:
    for variable, value in zip(variables, kept):
      variable.assign(value)


def _rate_variable(optimizer):
  """The variable holding the optimizer's learning rate; None under a schedule."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer.
  rate = getattr(inner, "_learning_rate", None)
  return rate if hasattr(rate, "assign") else None


def _learning_rate(optimizer):
  """The optimizer's current learning rate, or None under a schedule."""
  rate = _rate_variable(optimizer)
  return None if rate is None else float(rate.numpy())


def _update_rule(config: Config, model, optimizer) -> steps.UpdateRule:
  """The update's options from the flags; call inside `strategy.scope()`."""
  rate_variable = _rate_variable(optimizer)
  rate_base = None
  if rate_variable is not None:  # Not a task optimizer's own schedule.
    rate_base = tf.Variable(float(rate_variable.numpy()), trainable=False,
                            name="peak_learning_rate",
                            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  ema_variables = ()
  if config.ema_decay:
    ema_variables = tuple(
        tf.Variable(v.value, trainable=False, name=f"ema_{i}",
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        for i, v in enumerate(model.trainable_variables))
  return steps.UpdateRule(
      accum_steps=config.grad_accum_steps, clip_norm=config.clip_norm,
      rate_variable=rate_variable, rate_base=rate_base,
      rate_factor=schedules.config_rate_factor(config),
      ema_decay=config.ema_decay, ema_variables=ema_variables)
