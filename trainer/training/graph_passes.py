"""The Grappler passes the trainer's loops are compiled with.

TensorFlow optimizes a function's graph at its first call, with the rewrite
options of the calling thread's `function_call_options`. By default Grappler runs
its passes twice and includes the layout and memory optimizers, which rewrite
graphs for GPUs (NCHW layouts, swapping and recomputing tensors). On the
quickstart's train loop (CPU, 2 replicas) the two passes took 190 ms of its first
call; the second pass removed 4 of 947 nodes and the layout and memory optimizers
none, so the loops of a run on one machine's CPUs are compiled with one pass and
without those two: 76 ms, with the same step speed. GPU strategies keep TensorFlow's
defaults, and so do several workers (2 workers on one 2-core machine measured
5,200-6,400 examples/s with these options against 6,470 without: not clearly
the same), and an option a user set
(`tf.config.optimizer.set_experimental_options`) is kept.

The options apply only around the trainer's own loop calls (`applied`); other
functions of the process keep TensorFlow's.

    options = graph_passes.for_strategy(strategy)
    with graph_passes.applied(options):
      outputs = train_loop(iterator, num_steps)
"""

import contextlib
from typing import Optional

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.eager import context as eager_context

_Rewriter = rewriter_config_pb2.RewriterConfig


def for_strategy(strategy) -> Optional[eager_context.FunctionCallOptions]:
  """The calling thread's function options with the CPU's lean passes, or None
  (keep TensorFlow's) where a device of `strategy` is not a CPU, or it spans
  several workers."""
  if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or not all(
      tf.DeviceSpec.from_string(d).device_type == "CPU"
      for d in strategy.extended.worker_devices):
    return None
  current = eager_context.context().function_call_options
  config = config_pb2.ConfigProto.FromString(current.config_proto_serialized)
  rewrite = config.graph_options.rewrite_options
  # Only where the option is TensorFlow's default: a user's explicit one stays.
  if rewrite.meta_optimizer_iterations == _Rewriter.DEFAULT_NUM_ITERS:
    rewrite.meta_optimizer_iterations = _Rewriter.ONE
  if rewrite.memory_optimization == _Rewriter.DEFAULT_MEM_OPT:
    rewrite.memory_optimization = _Rewriter.NO_MEM_OPT
  if rewrite.layout_optimizer == _Rewriter.DEFAULT:
    rewrite.layout_optimizer = _Rewriter.OFF
  return eager_context.FunctionCallOptions(executor_type=current.executor_type,
                                           config_proto=config)


@contextlib.contextmanager
def applied(options: Optional[eager_context.FunctionCallOptions]):
  """Functions first called inside are compiled with `options` (None: the
  thread's own); the thread's options are restored after."""
  if options is None:
    yield
    return
  context = eager_context.context()
  before = context.function_call_options
  context.function_call_options = options
  try:
    yield
  finally:
    context.function_call_options = before
