"""What every loop shares: the in-graph batch assertion and its error, the call
that turns a loop's errors into the user's, float32 outputs, the eval loop and the
stop vote. The train loop is train_loop.py.

The loops are graph code as written (`tf.while_loop`, `tf.cond`) and are traced
without AutoGraph: converting the framework's functions cost 0.9 s of the first
loop call's tracing on the quickstart. A task's own functions are still converted,
as in any tf.function: the loops call them through `autograph.graph_code`. Helpers that
tf.data's map functions call are marked `do_not_convert`, for the same reason.
"""

import functools
import re

import keras
import tensorflow as tf

from trainer.errors import ReplicaBatchError, UserCodeError
from trainer.training import blame, graph_passes

_BATCH_CHECK = "per-replica batch check failed"
_SUM = tf.distribute.ReduceOp.SUM


@tf.autograph.experimental.do_not_convert
def check_batch(features, per_replica_batch_size):
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


def call_checked(loop, *args, lean_graph_passes=False, explain_input_error=None):
  """Calls a train or eval loop, compiled with graph_passes' lean passes where
  `lean_graph_passes` (Trainer.lean_graph_passes); its in-graph batch assertion
  becomes a ReplicaBatchError naming the replica, an error
  `explain_input_error(error)` explains (a bad record: a DataError) becomes that
  error, and an op of the user's code that fails (blame) a UserCodeError
  naming the method; others pass through."""
  try:
    with graph_passes.applied(lean_graph_passes):
      return loop(*args)
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
    error = (replica_batch_error(e) if isinstance(e, tf.errors.InvalidArgumentError)
             else None)
    if error is None and explain_input_error is not None:
      error = explain_input_error(e)
    if error is None:
      _raise_if_user_code(e)
      raise
    raise error from None
  except tf.errors.OpError as e:
    _raise_if_user_code(e)
    raise


# What a peer's loss or the machine causes, wherever the op was (a synchronized
# BatchNormalization's all-reduce sits in the model): never the user's code.
_NOT_THE_USERS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                  tf.errors.AbortedError, tf.errors.CancelledError,
                  tf.errors.ResourceExhaustedError)


def _raise_if_user_code(error: tf.errors.OpError):
  """Raises a UserCodeError naming the user's method whose op raised `error`."""
  if isinstance(error, _NOT_THE_USERS):
    return
  method = blame.method_of(error)
  if method is not None:
    raise UserCodeError(method, error) from error


@tf.autograph.experimental.do_not_convert
def loss_scale(optimizer):
  return getattr(optimizer, "dynamic_scale", None) if isinstance(
      optimizer, keras.optimizers.LossScaleOptimizer) else None


@tf.autograph.experimental.do_not_convert
def float32_outputs(outputs):
  """Model outputs with floating tensors cast to float32 (as Keras' compile does),
  so a task's loss and metrics see float32 under mixed precision too."""
  return tf.nest.map_structure(
      lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t, outputs)


def make_eval_loop(*, strategy, objective, model, ledger, totals,
                   per_replica_batch_size, gather=None):
  """Builds `eval_loop(iterator, num_steps) -> {streaming metric: result}`,
  accumulating weighted sums in `totals`.

  Args:
    strategy: the tf.distribute strategy.
    objective: the task's loss and metrics (training.objective).
    model: the task's Keras model.
    ledger: a ReplicaLedger for eval batches.
    totals: Totals of "loss", "examples", "weight" and the task's metric names:
      sums weighted by each example's weight, "examples" counting the real ones
      (padding has weight 0).
    per_replica_batch_size: examples each replica must receive per step.
    gather: a data.gather.EvalGather of an eval split: each replica gathers its
      batch of step s in-graph (the loop's `iterator` is then None), instead of
      next().

  Returns:
    A tf.function.
  """

  def replica_step(features, labels, weights, padding):
    ledger.record(check_batch(features, per_replica_batch_size))
    with blame.scope("model", type(model).__name__):
      outputs = float32_outputs(model(features, training=False))
    weights = weights * padding
    # The padding never reaches a user's metric as data: a metric that counts
    # its examples, ignoring the weights, counts only the real ones.
    objective.update_streaming(*_real_rows(padding, labels, outputs, weights))
    sums = objective.metric_sums(labels, outputs, weights)
    sums["loss"] = tf.reduce_sum(objective.loss(labels, outputs, weights,
                                                training=False))
    sums["examples"] = tf.reduce_sum(padding)
    sums["weight"] = tf.reduce_sum(weights)
    totals.add(sums)

  def gathered_step(step, arrays):
    replica_step(*gather.replica_batch(step, arrays))

  @functools.partial(tf.function, autograph=False)
  def eval_loop(iterator, num_steps):
    strategy.run(totals.reset)
    strategy.run(ledger.reset)
    strategy.run(objective.reset_streaming)

    def step(done):
      if gather is None:
        strategy.run(replica_step, args=next(iterator))
      else:
        strategy.run(gathered_step, args=(done, gather.arrays))
      return done + 1

    num_steps = tf.convert_to_tensor(num_steps)
    tf.while_loop(lambda done: done < num_steps, step, [tf.zeros_like(num_steps)])
    return objective.streaming_results()

  return eval_loop


@tf.autograph.experimental.do_not_convert
def _real_rows(padding, *nests):
  """`nests` with the rows of padded examples (padding 0) taken out."""
  rows = tf.reshape(tf.where(padding > 0), [-1])
  return tuple(tf.nest.map_structure(lambda t: tf.gather(t, rows), nest)
               for nest in nests)


# The most steps an automatic loop call may have (--steps_per_loop=0); the vote
# agrees on a count up to this.
MAX_AUTO_STEPS_PER_LOOP = 1000


def make_vote(strategy, *, codes: int = 8):
  """Builds `vote(code, steps_per_loop) -> (largest code, smallest steps_per_loop)`
  over every worker (codes below `codes`, steps in [1, MAX_AUTO_STEPS_PER_LOOP]).

  Workers of a multi-worker run receive signals (or run out of time) at different
  moments; voting after every loop call makes them all stop after the same step,
  for the most urgent reason any of them has (a collective that one worker skipped
  would hang the others). The same collective agrees on the next automatic loop
  length: each worker times its own calls, and two workers running loop calls of
  different lengths would wait forever in different collectives. Outside
  multi-worker it is the identity.
  """
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return lambda code, steps_per_loop: (code, steps_per_loop)
  span = MAX_AUTO_STEPS_PER_LOOP + 1

  @tf.function
  def vote(code, steps_per_loop):
    # A sum of one-hot votes: collectives sum, and the largest entry voted for is
    # the last non-zero one. Steps vote as MAX - steps, so the largest is the
    # fewest steps.
    def ballot(c, k):
      return tf.concat([tf.one_hot(c, codes), tf.one_hot(span - 1 - k, span)], 0)

    total = strategy.reduce(_SUM, strategy.run(ballot, args=(code, steps_per_loop)),
                            axis=None)
    last = lambda part: tf.reduce_max(tf.where(part > 0, tf.range(tf.size(part)), 0))
    return last(total[:codes]), span - 1 - last(total[codes:])

  def host_vote(code, steps_per_loop):
    steps = min(max(int(steps_per_loop), 1), MAX_AUTO_STEPS_PER_LOOP)
    agreed_code, agreed_steps = vote(tf.constant(code, tf.int32),
                                     tf.constant(steps, tf.int32))
    return int(agreed_code), int(agreed_steps)

  return host_vote
