"""The Grappler passes the trainer's loops are compiled with.

TensorFlow optimizes a function's graph when it is instantiated, with the rewrite
options of the calling thread's `function_call_options` (part of what the
instantiation is cached by). By default Grappler runs its passes twice and
includes the layout and memory optimizers, which rewrite graphs for GPUs (NCHW
layouts, swapping and recomputing tensors). On the quickstart's train loop (CPU,
2 replicas) the two passes took 190 ms of its first call; the second pass removed
4 of 947 nodes and the layout and memory optimizers none, so the loops of a run on
one machine's CPUs are compiled with one pass and without those two: 76 ms, with
the same step speed. GPU strategies keep TensorFlow's defaults, and so do several
workers (2 workers on one 2-core machine measured 5,200-6,400 examples/s with
these options against 6,470 without: not clearly the same), and an option a user
set (`tf.config.optimizer.set_experimental_options`) is kept.

The options apply only around the trainer's own calls of its loops and of the
diagnose step that replays one (`applied`, always with the same `lean`, so that
each is compiled once and a replay runs the graph training ran); other functions
of the process keep TensorFlow's. A tf.function called inside a replica function
(`--jit_compile`'s forward and backward pass) runs in the strategy's replica
thread with TensorFlow's options: it is compiled by XLA, not Grappler.

    lean = graph_passes.lean_for(strategy)
    with graph_passes.applied(lean):
      outputs = train_loop(iterator, num_steps)
"""

import contextlib

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2

from trainer import internals

_Rewriter = rewriter_config_pb2.RewriterConfig
_LEAN = {}  # id(a thread's options) -> (those options, their lean version).


def lean_for(strategy) -> bool:
  """Whether `strategy`'s loops get the lean passes: every device of it is a CPU
  and it spans one worker."""
  if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return False
  return all(tf.DeviceSpec.from_string(d).device_type == "CPU"
             for d in strategy.extended.worker_devices)


def lean_options(options):
  """`options` with one Grappler pass and neither the layout nor the memory
  optimizer, where they are TensorFlow's defaults (a user's explicit one stays)."""
  config = config_pb2.ConfigProto.FromString(options.config_proto_serialized)
  rewrite = config.graph_options.rewrite_options
  if rewrite.meta_optimizer_iterations == _Rewriter.DEFAULT_NUM_ITERS:
    rewrite.meta_optimizer_iterations = _Rewriter.ONE
  if rewrite.memory_optimization == _Rewriter.DEFAULT_MEM_OPT:
    rewrite.memory_optimization = _Rewriter.NO_MEM_OPT
  if rewrite.layout_optimizer == _Rewriter.DEFAULT:
    rewrite.layout_optimizer = _Rewriter.OFF
  return internals.function_call_options(executor_type=options.executor_type,
                                         config_proto=config)


@contextlib.contextmanager
def applied(lean: bool):
  """Functions called inside run with the lean version of the thread's current
  options (lean=False: the thread's own); the thread's options are restored
  after, also when the call raises."""
  if not lean:
    yield
    return
  context = internals.eager_context()
  before = context.function_call_options
  # The same options object until something changes them: build its lean
  # version once (a proto round trip per loop call otherwise).
  cached = _LEAN.get(id(before))
  if cached is None or cached[0] is not before:
    cached = _LEAN[id(before)] = (before, lean_options(before))
  context.function_call_options = cached[1]
  try:
    yield
  finally:
    context.function_call_options = before
