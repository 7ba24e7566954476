"""A user's functions as a tf.function with AutoGraph would call them, inside
graph code that the framework traces without AutoGraph (the loops, the export's
serving function)."""

from trainer import internals


def graph_code(function):
  """`function` (a task's, or a Keras object's method) as a tf.function with
  AutoGraph would call it: converted when called, so that a task's Python
  `if`/`for` on tensors works inside the framework's loops, which are traced
  without AutoGraph. Keras's and TensorFlow's own code is not converted, nor the
  built-in tasks' (graph code as written: converting them cost 60 ms of start-up)."""
  if getattr(function, "__module__", "").startswith(__name__.split(".")[0] + "."):
    return function
  return internals.autograph_converted(function)
