"""The tf.function train and eval loops around a task's model, loss and metrics.

One step is one `next(iterator)` on the distributed iterator (or, for arrays, one
in-graph gather per replica: data.GatherInput) and one `strategy.run`: every replica
gets exactly one batch, asserted in-graph. Gradients come back from the
replicas unreduced; the outer function all-reduces them once (`batch_reduce_to`, SUM,
which equals single-device gradients because the loss is averaged over the global
batch), takes their global norm and applies them. K steps run per call, K a tensor,
so changing K never retraces. The parts of a step run in name scopes that a
profiler trace is broken down by (trainer.training.profile).

Helpers that are graph code as written (no Python control flow on tensors) are
marked `do_not_convert`, here and in the ledger, schedules and array order: AutoGraph
converting each cost 10-130 ms of the first loop call's tracing, 0.3 s in all.
A task's own functions are still converted, as in any tf.function.
"""

import dataclasses
import re

import keras
import tensorflow as tf

from trainer.errors import ReplicaBatchError
from trainer.training import profile

_BATCH_CHECK = "per-replica batch check failed"
_SUM = tf.distribute.ReduceOp.SUM


@tf.autograph.experimental.do_not_convert
def _check_batch(features, per_replica_batch_size):
  """Asserts in-graph that this replica's batch has exactly the expected size."""
  batch_size = tf.shape(tf.nest.flatten(features)[0])[0]
  replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
  tf.debugging.Assert(
      tf.equal(batch_size, per_replica_batch_size),
      [f"{_BATCH_CHECK}: expected {per_replica_batch_size} examples;", "replica",
       replica_id, "got", batch_size])
  return batch_size


def replica_batch_error(error: tf.errors.InvalidArgumentError):
  """Turns the in-graph batch assertion into a ReplicaBatchError, else None."""
  message = str(error)
  if _BATCH_CHECK not in message:
    return None
  match = re.search(r"replica\D*(\d+)\D+got\D*(\d+)", message)
  detail = (f"replica {match.group(1)} got {match.group(2)} examples"
            if match else "a replica got a batch of the wrong size")
  expected = re.search(r"expected (\d+) examples", message)
  return ReplicaBatchError(
      f"per-replica batch check failed: {detail}, expected "
      f"{expected.group(1) if expected else '?'} (a data set or global batch whose "
      "size is not per_replica_batch_size x replicas)")


def call_checked(loop, *args, explain_input_error=None):
  """Calls a train or eval loop; its in-graph batch assertion becomes a
  ReplicaBatchError naming the replica, and an error `explain_input_error(error)`
  explains (a bad record: a DataError) becomes that error; others pass through."""
  try:
    return loop(*args)
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
    error = (replica_batch_error(e) if isinstance(e, tf.errors.InvalidArgumentError)
             else None)
    if error is None and explain_input_error is not None:
      error = explain_input_error(e)
    if error is None:
      raise
    raise error from None


@tf.autograph.experimental.do_not_convert
def _loss_scale(optimizer):
  return getattr(optimizer, "dynamic_scale", None) if isinstance(
      optimizer, keras.optimizers.LossScaleOptimizer) else None


@tf.autograph.experimental.do_not_convert
def float32_outputs(outputs):
  """Model outputs with floating tensors cast to float32 (as Keras' compile does),
  so a task's loss and metrics see float32 under mixed precision too."""
  return tf.nest.map_structure(
      lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t, outputs)


@tf.autograph.experimental.do_not_convert
def _per_example(values):
  """A task's per-example loss or metric as float32 (shapes were checked on a
  probe batch before the first step: see state.py)."""
  return tf.cast(values, tf.float32)


@tf.autograph.experimental.do_not_convert
def _norm(tensor):
  """The L2 norm as float32, computed without overflowing where the values are
  finite: max|x| * ||x / max|x|||."""
  tensor = tf.cast(tensor, tf.float32)
  largest = tf.reduce_max(tf.abs(tensor))
  scaled = tf.math.divide_no_nan(tensor, largest)
  return largest * tf.norm(scaled)


@tf.autograph.experimental.do_not_convert
def _dense_semantics(strategy, gradient):
  """An all-reduced gradient whose update is the dense one, on any replica count.

  A sparse gradient (an Embedding's `tf.IndexedSlices`) holds one slice per
  lookup, so a row looked up twice appears twice; on several replicas the
  all-reduce concatenates the replicas' slices. Keras's optimizers square or take
  the sign of each slice before summing duplicates, which is not the update of
  the summed (dense) gradient, and differs with the replica count. Summing
  duplicate rows first makes every optimizer apply its dense definition, while the
  gradient stays sparse: one slice per distinct row, not a vocabulary-sized
  tensor. Dense gradients pass through untouched.
  """
  if isinstance(gradient, tf.distribute.DistributedValues):
    local = strategy.experimental_local_results(gradient)[0]
    if not isinstance(local, tf.IndexedSlices):
      return gradient
    gradient = local
  if not isinstance(gradient, tf.IndexedSlices):
    return gradient
  rows, position = tf.unique(gradient.indices)
  values = tf.math.unsorted_segment_sum(gradient.values, position, tf.size(rows))
  return tf.IndexedSlices(values, rows, gradient.dense_shape)


@tf.autograph.experimental.do_not_convert
def _dense(gradient):
  """A gradient as a dense tensor (a sparse one's rows scattered into zeros)."""
  return tf.convert_to_tensor(gradient)


@dataclasses.dataclass(frozen=True)
class UpdateRule:
  """How a step's gradients become an update; the defaults are the plain step.

  Attributes:
    accum_steps: micro-batches per update (--grad_accum_steps): each is one
      next() and one strategy.run, so the ledger counts micro-batches.
    clip_norm: clip the all-reduced gradients to this global norm (0 = off).
    rate_variable: the optimizer's learning-rate variable, set before each update
      to rate_base * rate_factor(step); None leaves the optimizer's own rate.
    rate_base: a variable: --learning_rate times the rollbacks' multiplier.
    rate_factor: `step -> factor` (schedules.rate_factor).
    ema_decay: decay of the weights' moving average (0 = off).
    ema_variables: the averages, one per trainable variable.
  """
  accum_steps: int = 1
  clip_norm: float = 0.0
  rate_variable: object = None
  rate_base: object = None
  rate_factor: object = None
  ema_decay: float = 0.0
  ema_variables: tuple = ()


def make_train_loop(*, strategy, task, model, optimizer, global_step, ledger, totals,
                    per_replica_batch_size, global_batch_size, jit_compile=False,
                    rule: UpdateRule = UpdateRule(), gather=None):
  """Builds `train_loop(iterator, num_steps) -> dict of tensors`, and
  `diagnose_step(iterator)`, which runs one step exactly as the loop does and
  returns what a divergence report needs.

  The dict holds everything the host needs after a call, reduced in-graph, so one
  call costs one dispatch and no eager ops (which cost ~0.1 ms each, many per
  call): "loss" (sum of the steps' losses), "examples" and each task metric (sums
  over the call's examples), "ledger_batches" and "ledger_examples" (per replica,
  this call), "gradient_norm" (of the last step, before clipping), "clipped"
  (steps whose norm was clipped), "all_finite" (every step's loss and gradients),
  "step" and "learning_rate" (the rate of the call's last step).

  Args:
    strategy: the tf.distribute strategy the variables live under.
    task: the Task: its loss and metrics, on (labels, outputs).
    model: the task's Keras model.
    optimizer: a Keras optimizer built on `model.trainable_variables`.
    global_step: int64 variable, incremented once per update.
    ledger: a ReplicaLedger for training (micro-)batches.
    totals: Totals of "loss", "examples" and the task's metric names.
    per_replica_batch_size: examples each replica must receive per micro-step.
    global_batch_size: examples per micro-step over all replicas.
    jit_compile: compile the replica's forward and backward pass with XLA.
    rule: accumulation, clipping, the learning-rate schedule and EMA.
    gather: a data.GatherInput: each replica gathers its batch in-graph from the
      global step (the loops' `iterator` is then None), instead of next().

  Returns:
    (train_loop, diagnose_step), tf.functions. diagnose_step returns "loss" (of
    the step), "gradient_norm", "gradient_norms" (per variable, before clipping)
    and "gradients" (all-reduced, still scaled by a loss scale) and applies the
    update like a step of train_loop.
  """
  variables = model.trainable_variables
  # The loss of an update averages over all its micro-batches, so N accumulated
  # micro-batches of B give the gradients of one batch of N * B.
  update_batch_size = global_batch_size * rule.accum_steps

  def forward_backward(features, labels):
    with tf.GradientTape() as tape:
      outputs = float32_outputs(model(features, training=True))
      per_example = _per_example(task.loss(labels, outputs))
      loss = tf.nn.compute_average_loss(per_example,
                                        global_batch_size=update_batch_size)
      if model.losses:
        loss += tf.nn.scale_regularization_loss(
            tf.cast(tf.add_n(model.losses), tf.float32)) / rule.accum_steps
      scaled_loss = optimizer.scale_loss(loss)
    gradients = tape.gradient(scaled_loss, variables)
    metrics = {name: tf.reduce_sum(_per_example(values))
               for name, values in task.metrics(labels, outputs).items()}
    return gradients, loss, metrics

  if jit_compile:
    forward_backward = tf.function(forward_backward, jit_compile=True)

  def replica_step(features, labels):
    batch_size = _check_batch(features, per_replica_batch_size)
    ledger.record(batch_size)
    # Around the call, so that under --jit_compile the compiled op is in it too.
    with tf.name_scope(profile.FORWARD_BACKWARD):
      gradients, loss, metrics = forward_backward(features, labels)
    totals.add(dict(metrics, loss=loss, examples=batch_size))
    return gradients

  def gathered_replica_step(micro_step_index, arrays):
    with tf.name_scope(profile.INPUT):
      batch = gather.replica_batch(micro_step_index, arrays)
    return replica_step(*batch)

  def micro_step(iterator, index):
    """One next() (or one in-graph gather per replica, at micro-step `index`) and
    one strategy.run: the all-reduced gradients of a batch."""
    if gather is None:
      with tf.name_scope(profile.INPUT):
        features, labels = next(iterator)
      per_replica_gradients = strategy.run(replica_step, args=(features, labels))
    else:
      per_replica_gradients = strategy.run(gathered_replica_step,
                                           args=(index, gather.arrays))
    with tf.name_scope(profile.ALL_REDUCE):
      reduced = strategy.extended.batch_reduce_to(
          _SUM, [(g, v.value) for g, v in zip(per_replica_gradients, variables)])
      return [_dense_semantics(strategy, g) for g in reduced]

  def train_step(iterator, diagnosis=None):
    """One update; fills `diagnosis` (a dict) with its gradients when given."""
    first = None if gather is None else global_step.read_value() * rule.accum_steps
    gradients = micro_step(iterator, first)
    if rule.accum_steps > 1:
      # A loop variable keeps its shape: sparse gradients are summed densely.
      gradients = [_dense(g) for g in gradients]
      for micro in tf.range(1, rule.accum_steps, dtype=tf.int64):
        index = None if gather is None else first + micro
        gradients = [a + _dense(b)
                     for a, b in zip(gradients, micro_step(iterator, index))]
    norm = tf.linalg.global_norm(gradients)
    scale = _loss_scale(optimizer)
    scale = tf.constant(1.0) if scale is None else tf.cast(scale, norm.dtype)
    norm = norm / scale
    if diagnosis is not None:
      diagnosis["gradients"] = [_dense(g) for g in gradients]
      diagnosis["gradient_norms"] = [_norm(g) / scale
                                     for g in diagnosis["gradients"]]
      diagnosis["gradients_finite"] = [tf.reduce_all(tf.math.is_finite(g))
                                       for g in diagnosis["gradients"]]
    clipped = tf.constant(False)
    if rule.clip_norm:
      clipped = norm > rule.clip_norm
      gradients, _ = tf.clip_by_global_norm(gradients, rule.clip_norm * scale,
                                            use_norm=norm * scale)
    if rule.rate_variable is not None:
      rule.rate_variable.assign(rule.rate_base * rule.rate_factor(global_step))
    with tf.name_scope(profile.OPTIMIZER):
      optimizer.apply(gradients, variables)
    for average, variable in zip(rule.ema_variables, variables):
      average.assign(rule.ema_decay * average + (1.0 - rule.ema_decay) * variable)
    global_step.assign_add(1)
    return norm, clipped

  @tf.function
  def train_loop(iterator, num_steps):
    strategy.run(totals.reset)
    strategy.run(ledger.reset)
    norm, all_finite = tf.constant(0.0), tf.constant(True)
    clipped = tf.constant(0)
    for _ in tf.range(num_steps):
      norm, step_clipped = train_step(iterator)
      all_finite = tf.logical_and(all_finite, tf.math.is_finite(norm))
      clipped += tf.cast(step_clipped, tf.int32)
    outputs = dict(totals.values(), gradient_norm=norm, step=global_step.read_value(),
                   learning_rate=tf.cast(optimizer.learning_rate, tf.float32),
                   ledger_batches=ledger.batches.read_value(),
                   ledger_examples=ledger.examples.read_value(), clipped=clipped)
    # A NaN loss with finite gradients is possible (e.g. inf logits): check both.
    outputs["all_finite"] = tf.logical_and(all_finite,
                                           tf.math.is_finite(outputs["loss"]))
    return outputs

  @tf.function
  def diagnose_step(iterator):
    strategy.run(totals.reset)
    strategy.run(ledger.reset)
    diagnosis = {}
    norm, _ = train_step(iterator, diagnosis)
    return dict(diagnosis, loss=totals.values()["loss"], gradient_norm=norm,
                step=global_step.read_value())

  return train_loop, diagnose_step


def make_eval_loop(*, strategy, task, model, ledger, totals, per_replica_batch_size):
  """Builds `eval_loop(iterator, num_steps)` accumulating weighted sums in `totals`.

  Args:
    strategy: the tf.distribute strategy.
    task: the Task: its loss and metrics, on (labels, outputs).
    model: the task's Keras model.
    ledger: a ReplicaLedger for eval batches.
    totals: Totals of "loss", "examples" and the task's metric names, sums
      weighted by example weight (0 for padding).
    per_replica_batch_size: examples each replica must receive per step.

  Returns:
    A tf.function.
  """

  def replica_step(features, labels, weight):
    ledger.record(_check_batch(features, per_replica_batch_size))
    outputs = float32_outputs(model(features, training=False))
    sums = {name: tf.reduce_sum(_per_example(values) * weight)
            for name, values in task.metrics(labels, outputs).items()}
    sums["loss"] = tf.reduce_sum(_per_example(task.loss(labels, outputs))
                                 * weight)
    sums["examples"] = tf.reduce_sum(weight)
    totals.add(sums)

  @tf.function
  def eval_loop(iterator, num_steps):
    strategy.run(totals.reset)
    strategy.run(ledger.reset)
    for _ in tf.range(num_steps):
      strategy.run(replica_step, args=next(iterator))

  return eval_loop


def make_stop_vote(strategy, *, codes: int = 8):
  """Builds `stop_vote(code) -> the largest code of every worker` (codes below
  `codes`).

  Workers of a multi-worker run receive signals (or run out of time) at different
  moments; voting after every loop call makes them all stop after the same step,
  for the most urgent reason any of them has (a collective that one worker skipped
  would hang the others). Outside multi-worker it is the identity.
  """
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return lambda code: code

  @tf.function
  def stop_vote(code):
    # A sum of one-hot votes: collectives sum, and the largest code voted for is
    # the last non-zero entry.
    votes = strategy.run(lambda c: tf.one_hot(c, codes), args=(code,))
    total = strategy.reduce(_SUM, votes, axis=None)
    return tf.reduce_max(tf.where(total > 0, tf.range(codes), 0))

  return lambda code: int(stop_vote(tf.constant(code, tf.int32)))
