"""The compiled train loop: K steps per call (K a tensor, so changing K never
retraces), each one update of the model.

One (micro-)step is one `next(iterator)` on the distributed iterator (or, for data
held in memory, one in-graph gather per replica: data.GatherInput) and one
`strategy.run`:
every replica gets exactly one batch, asserted in-graph and counted by the ledger.
Gradients come back from the replicas unreduced; the outer function all-reduces
them once (`batch_reduce_to`, SUM, which equals single-device gradients because
the loss is averaged over the global batch), sums duplicate rows of sparse ones,
takes their global norm, clips, sets the scheduled rate and applies them. The
parts of a step run in name scopes that a profiler trace is broken down by
(trainer.outputs.profile).
"""

import dataclasses

import tensorflow as tf

from trainer.distribute import communication
from trainer.outputs import profile
from trainer.training import blame, replica_layers
from trainer.training.objective import Objective
from trainer.training.steps import check_batch, float32_outputs, loss_scale

# A history row's columns besides the step, the totals and each replica's ledger
# (replica_0, replica_1, ...): no task metric may take these names (probe.py).
ROW_STATE = ("learning_rate", "gradient_norm", "clipped")

_SUM = tf.distribute.ReduceOp.SUM


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
    rate_set: a task's own optimizer: the rate the rule set last (a variable);
      a rate set from outside since (an action's or a Keras callback's
      `model.optimizer.learning_rate = x`) becomes the new rate_base. None:
      the flags' optimizer, whose rate is the flags'.
    rate_factor: `step -> factor` (schedules.rate_factor).
    ema_decay: decay of the weights' moving average (0 = off).
    ema_variables: the averages, one per trainable variable.
    gradient_copies: variables that keep each update's gradients (unclipped,
      unscaled), one per trainable variable, for --histogram_every; or none.
  """
  accum_steps: int = 1
  clip_norm: float = 0.0
  rate_variable: object = None
  rate_base: object = None
  rate_set: object = None
  rate_factor: object = None
  ema_decay: float = 0.0
  ema_variables: tuple = ()
  gradient_copies: tuple = ()


class TrainLoop:
  """`loop(iterator, num_steps) -> dict of tensors`, and `diagnose(iterator)`, which
  runs one step exactly as the loop does and returns what a divergence report
  needs.

  The loop's dict holds everything the host needs after a call, reduced in-graph,
  so one call costs one dispatch and no eager ops (which cost ~0.1 ms each, many
  per call): "loss" (sum of the steps' losses), "examples" and each task metric
  (sums over the call's examples), "ledger_batches" and "ledger_examples" (per
  replica, this call), "gradient_norm" (of the last step, before clipping),
  "clipped" (steps whose norm was clipped), "all_finite" (every step's loss and
  gradients), "step" and "learning_rate" (the rate of the call's last step), and
  "history": a row (`history_columns`) at every global step that is a multiple
  of `record_every`, with the running sums at that step, so that summaries get
  points inside a call without ending it ([0, width] when none).

  `diagnose` returns "loss" (of the step), "gradient_norm", "gradient_norms" (per
  variable, before clipping) and "gradients" (all-reduced and dense, still scaled
  by a loss scale), and applies the update like a step of the loop.
  """

  def __init__(self, *, strategy, objective: Objective, model, optimizer,
               global_step, ledger, totals, per_replica_batch_size,
               global_batch_size, jit_compile=False, rule: UpdateRule = UpdateRule(),
               gather=None, record_every: int = 0, averaged_statistics=None):
    """Builds the loop's tf.functions (traced at their first call).

    Args:
      strategy: the tf.distribute strategy the variables live under.
      objective: the task's loss and metrics, on (labels, outputs, weights).
      model: the task's Keras model.
      optimizer: a Keras optimizer built on `model.trainable_variables`.
      global_step: int64 variable, incremented once per update.
      ledger: a ReplicaLedger for training (micro-)batches.
      totals: Totals of "loss", "examples", "weight" and the task's metric names.
      per_replica_batch_size: examples each replica must receive per micro-step.
      global_batch_size: examples per micro-step over all replicas.
      jit_compile: compile the replica's forward and backward pass with XLA.
      rule: accumulation, clipping, the learning-rate schedule and EMA.
      gather: a data.GatherInput of training data: each replica gathers its
        batch in-graph, by the global step (ArrayOrderGather) or by the ids set
        before the call (StreamedIdsGather) (the loops' `iterator` is
        then `Trainer.loop_input`'s None), instead of next().
      record_every: a history row every this many global steps (0: none). The
        same on every worker: reading the sums is a collective.
      averaged_statistics: a replica_layers.Averaged: the moving statistics
        that each replica updates on its own (an unsynchronized
        BatchNormalization's), set to their mean over the replicas after every
        micro-step, in the gradients' all-reduce.
    """
    self._strategy, self._objective, self._model = strategy, objective, model
    self._optimizer, self._global_step = optimizer, global_step
    self._ledger, self._totals = ledger, totals
    self._per_replica_batch_size = per_replica_batch_size
    self._rule, self._gather = rule, gather
    self._variables = model.trainable_variables
    self._record_every = record_every
    self._averaged = averaged_statistics or replica_layers.Averaged()
    self._reduce_options = communication.gradient_options(strategy)
    self._packed = bool(self._reduce_options.bytes_per_pack)
    self.history_columns = ("step", *totals.variables,
                            *(f"replica_{i}" for i in range(ledger.num_replicas)),
                            *ROW_STATE, *objective.scalar_streaming)
    # The loss of an update averages over all its micro-batches, so N accumulated
    # micro-batches of B give the gradients of one batch of N * B.
    self._update_batch_size = global_batch_size * rule.accum_steps
    # `(features, labels, weights) -> (gradients, loss, outputs)` of one replica's
    # batch, as a step computes it (equivalence.py checks it against one device).
    self.forward_backward = (tf.function(self._forward_backward_fn,
                                         jit_compile=True, autograph=False)
                             if jit_compile else self._forward_backward_fn)
    # Graph code as written, traced without AutoGraph (autograph.graph_code says
    # why).
    # The profile finds the loop's calls by this name (profile.LOOP_FUNCTION).
    self.loop = tf.function(self.train_loop, autograph=False)
    self.diagnose = tf.function(self._diagnose, autograph=False)

  def _forward_backward_fn(self, features, labels, weights):
    model, objective, rule = self._model, self._objective, self._rule
    with tf.GradientTape() as tape:
      with blame.scope("model", type(model).__name__):
        outputs = float32_outputs(model(features, training=True))
      # Keras' sum_over_batch_size: the weighted losses' sum over the examples.
      loss = tf.nn.compute_average_loss(
          objective.loss(labels, outputs, weights, training=True),
          global_batch_size=self._update_batch_size)
      if model.losses:
        loss += tf.nn.scale_regularization_loss(
            tf.cast(tf.add_n(model.losses), tf.float32)) / rule.accum_steps
      scaled_loss = self._optimizer.scale_loss(loss)
    gradients = tape.gradient(scaled_loss, self._variables)
    return gradients, loss, outputs

  def _replica_step(self, features, labels, weights):
    batch_size = check_batch(features, self._per_replica_batch_size)
    self._ledger.record(batch_size)
    # Around the call, so that under --jit_compile the compiled op is in it too.
    with tf.name_scope(profile.FORWARD_BACKWARD):
      gradients, loss, outputs = self.forward_backward(features, labels, weights)
    objective = self._objective
    objective.update_streaming(labels, outputs, weights)
    self._totals.add(dict(objective.metric_sums(labels, outputs, weights),
                          loss=loss, examples=batch_size,
                          weight=tf.reduce_sum(weights)))
    return gradients

  def _gathered_replica_step(self, step_input, arrays):
    with tf.name_scope(profile.INPUT):
      batch = self._gather.replica_batch(step_input, arrays)
    return self._replica_step(*batch)

  def _micro_step(self, iterator, index):
    """One next() (or one in-graph gather per replica, of micro-step `index` or
    of the ids its iterator gives) and one strategy.run: the all-reduced
    gradients of a batch."""
    strategy = self._strategy
    if self._gather is None:
      with tf.name_scope(profile.INPUT):
        batch = next(iterator)
      per_replica = strategy.run(self._replica_step, args=batch)
    else:
      with tf.name_scope(profile.INPUT):
        step_input = self._gather.step_input(iterator, index)
      per_replica = strategy.run(self._gathered_replica_step,
                                 args=(step_input, self._gather.arrays))
    pairs = [(g, v.value) for g, v in zip(per_replica, self._variables)]
    if self._packed:
      # The backward pass makes the last layers' gradients first: reduced in
      # that order, in packs, the first packs' all-reduce runs while earlier
      # layers' gradients are still being computed.
      pairs.reverse()
    averaged = self._averaged
    if averaged:  # The replicas' own moving statistics ride along.
      pairs.append((strategy.run(averaged.local_values), averaged.variables[0]))
    with tf.name_scope(profile.ALL_REDUCE):
      reduced = strategy.extended.batch_reduce_to(_SUM, pairs,
                                                  options=self._reduce_options)
    if averaged:
      averaged.assign_mean(strategy.experimental_local_results(reduced.pop())[0],
                           strategy.num_replicas_in_sync)
    if self._packed:
      reduced.reverse()
    return [_dense_semantics(strategy, g) for g in reduced]

  def _gradients(self, iterator):
    """The all-reduced gradients of one update: its micro-steps' sum."""
    rule = self._rule
    first = (None if self._gather is None else
             self._global_step.read_value() * rule.accum_steps)
    gradients = self._micro_step(iterator, first)
    if rule.accum_steps == 1:
      return gradients

    def accumulate(micro, gradients):
      index = None if self._gather is None else first + micro
      return micro + 1, [a + _dense(b) for a, b in
                         zip(gradients, self._micro_step(iterator, index))]

    # A loop variable keeps its shape: sparse gradients are summed densely.
    _, gradients = tf.while_loop(
        lambda micro, _: micro < rule.accum_steps, accumulate,
        (tf.constant(1, tf.int64), [_dense(g) for g in gradients]))
    return gradients

  def _step(self, iterator, diagnosis=None):
    """One update; fills `diagnosis` (a dict) with its gradients when given.
    Returns the gradients' global norm (before clipping) and whether it clipped."""
    rule, optimizer = self._rule, self._optimizer
    gradients = self._gradients(iterator)
    norm = tf.linalg.global_norm(gradients)
    scale = loss_scale(optimizer)
    scale = tf.constant(1.0) if scale is None else tf.cast(scale, norm.dtype)
    norm = norm / scale
    if diagnosis is not None:
      diagnosis["gradients"] = [_dense(g) for g in gradients]
      diagnosis["gradient_norms"] = [_norm(g) / scale
                                     for g in diagnosis["gradients"]]
      diagnosis["gradients_finite"] = [tf.reduce_all(tf.math.is_finite(g))
                                       for g in diagnosis["gradients"]]
    for copy, gradient in zip(rule.gradient_copies, gradients):
      copy.assign(_dense(gradient) / tf.cast(scale, copy.dtype))
    clipped = tf.constant(False)
    if rule.clip_norm:
      clipped = norm > rule.clip_norm
      gradients, _ = tf.clip_by_global_norm(gradients, rule.clip_norm * scale,
                                            use_norm=norm * scale)
    if rule.rate_variable is not None:
      step = self._global_step
      if rule.rate_set is not None:  # A rate set from outside is adopted.
        earlier = rule.rate_factor(step - 1)
        outside = tf.logical_and(tf.not_equal(rule.rate_variable, rule.rate_set),
                                 earlier > 0)
        rule.rate_base.assign(tf.where(
            outside, rule.rate_variable / tf.where(earlier > 0, earlier, 1.0),
            rule.rate_base))
      rate = rule.rate_base * rule.rate_factor(step)
      rule.rate_variable.assign(rate)
      if rule.rate_set is not None:
        rule.rate_set.assign(rate)
    with tf.name_scope(profile.OPTIMIZER):
      optimizer.apply(gradients, self._variables)
    for average, variable in zip(rule.ema_variables, self._variables):
      average.assign(rule.ema_decay * average + (1.0 - rule.ema_decay) * variable)
    self._global_step.assign_add(1)
    return norm, clipped

  def train_loop(self, iterator, num_steps):
    """K = `num_steps` updates (traced once, whatever K); see the class."""
    strategy, totals, ledger = self._strategy, self._totals, self._ledger
    strategy.run(totals.reset)
    strategy.run(ledger.reset)
    strategy.run(self._objective.reset_streaming)
    history = tf.TensorArray(tf.float64, size=0, dynamic_size=True,
                             element_shape=[len(self.history_columns)])

    def step(done, norm, all_finite, clipped, history):
      norm, step_clipped = self._step(iterator)
      all_finite = tf.logical_and(all_finite, tf.math.is_finite(norm))
      clipped += tf.cast(step_clipped, tf.int32)
      if self._record_every:
        history = self._recorded(history, norm, clipped)
      return done + 1, norm, all_finite, clipped, history

    num_steps = tf.convert_to_tensor(num_steps)
    _, norm, all_finite, clipped, history = tf.while_loop(
        lambda done, *_: done < num_steps, step,
        (tf.zeros_like(num_steps), tf.constant(0.0), tf.constant(True),
         tf.constant(0), history))
    outputs = dict(totals.values(), **self._objective.streaming_results(),
                   history=history.stack(),
                   gradient_norm=norm,
                   step=self._global_step.read_value(),
                   learning_rate=tf.cast(self._optimizer.learning_rate, tf.float32),
                   ledger_batches=ledger.batches.read_value(),
                   ledger_examples=ledger.examples.read_value(), clipped=clipped)
    # A NaN loss with finite gradients is possible (e.g. inf logits): check both.
    outputs["all_finite"] = tf.logical_and(all_finite,
                                           tf.math.is_finite(outputs["loss"]))
    return outputs

  def _recorded(self, history, norm, clipped):
    """`history` with a row added when the global step is a multiple of
    `record_every`."""
    step = self._global_step.read_value()
    return tf.cond(
        tf.equal(step % self._record_every, 0),
        lambda: history.write(history.size(), self._history_row(step, norm, clipped)),
        lambda: history)

  def _history_row(self, step, norm, clipped):
    """The running sums after `step` as one float64 row (`history_columns`)."""
    sums = [*self._totals.variables.values(), self._ledger.batches]
    # One all-reduce of every replica's parts of the sums: reading each ON_READ
    # variable here would be one each, and under multi-worker each is a
    # collective between the workers (they cost 2 workers a quarter of their
    # speed at a row every 2 steps).
    summed = self._strategy.reduce(_SUM, self._strategy.run(
        lambda: tf.concat([tf.reshape(v.read_value(), [-1]) for v in sums], 0)),
                                   axis=None)
    streaming = self._objective.streaming_results()
    values = [step, *tf.unstack(summed),
              self._optimizer.learning_rate, norm, clipped,
              *(tf.reshape(streaming[name], [])
                for name in self._objective.scalar_streaming)]
    return tf.stack([tf.cast(v, tf.float64) for v in values])

  def _diagnose(self, iterator):
    self._strategy.run(self._totals.reset)
    self._strategy.run(self._ledger.reset)
    self._strategy.run(self._objective.reset_streaming)
    diagnosis = {}
    norm, _ = self._step(iterator, diagnosis)
    return dict(diagnosis, loss=self._totals.values()["loss"], gradient_norm=norm,
                step=self._global_step.read_value())
