"""SavedModel export: a serving signature from stored features to the task's outputs.

The signature applies the task's `preprocess` (as training did) before the model and
its `serving_outputs` after it, so a served model takes raw stored values. Which
dtypes it declares and hands `preprocess`: serving_inputs.py; which of the task's
objects it saves, and naming one that cannot be: served_objects.py.
"""

import contextlib
import os
import warnings
from typing import Optional

import keras
import tensorflow as tf

from trainer.autograph import graph_code
from trainer.errors import TaskError, no_space, one_line
from trainer.outputs import served_objects, serving_inputs

KERAS_FILE = "model.keras"  # Keras' own format, beside the SavedModel's files.


class ExportFailure(Exception):
  """An export failed; its message is the cause, in one line."""


def named_outputs(outputs) -> dict:
  """A signature's outputs as one flat {name: tensor}: a dict by its keys (nested
  keys joined by "_"), a list or tuple as output_0, output_1, ..., one tensor as
  "outputs"."""
  if not isinstance(outputs, (dict, list, tuple)):
    return {"outputs": outputs}
  return dict(_named_leaves(outputs, prefix=""))


def _named_leaves(value, *, prefix: str):
  if isinstance(value, dict):
    items = [(str(key), item) for key, item in value.items()]
  elif isinstance(value, (list, tuple)):
    items = [(str(index) if prefix else f"output_{index}", item)
             for index, item in enumerate(value)]
  else:
    yield prefix, value
    return
  for name, item in items:
    yield from _named_leaves(item, prefix=f"{prefix}_{name}" if prefix else name)


def check_serving_signature(task, feature_spec):
  """Checks early (before training) that the task's serving signature is specs.

  Raises:
    TaskError: `Task.serving_signature` returned something else.
  """
  signature = task.serving_signature(feature_spec)
  leaves = tf.nest.flatten(signature)
  if not leaves or not all(isinstance(s, tf.TensorSpec) for s in leaves):
    raise TaskError("Task.serving_signature() must return a tf.TensorSpec or a dict "
                    f"of them, got {signature!r}"[:300])


def export_saved_model(model, task, export_dir: str, *, feature_spec) -> str:
  """Saves `model` as a SavedModel whose `serving_default` maps stored features to
  `task.serving_outputs(model(task.preprocess(features)))`.

  The signature takes any batch, in the dtypes training's `preprocess` received
  (serving_inputs.offered; a task's `serving_signature` may declare others,
  which are honoured: serving_inputs.for_preprocess). Its `serve` function also
  takes the features as one dict (for dict features), and int and float
  features in the other width (int32 or int64, float32 or float64).

  Args:
    model: the trained Keras model.
    task: the run's Task.
    export_dir: destination directory (replaced if it exists).
    feature_spec: specs of a batch of stored features (see data.feature_spec).

  Returns:
    export_dir.

  Raises:
    ExportFailure: naming the cause, and the task attribute that cannot be
      saved where one is.
  """
  stored = tf.nest.map_structure(serving_inputs.batch_free, feature_spec)
  signature = task.serving_signature(
      serving_inputs.offered(feature_spec, model, task))
  specs = serving_inputs.named_specs(signature)
  structured = isinstance(signature, dict)

  # Converted here, outside the (unconverted) serving function's tracing.
  preprocess, serving_outputs = (graph_code(task.preprocess),
                                 graph_code(task.serving_outputs))

  def serve(*inputs):
    if structured and len(inputs) == 1 and isinstance(inputs[0], dict):
      features = inputs[0]  # serve({"age": ..., ...})
    else:
      features = tf.nest.pack_sequence_as(signature, list(inputs))
    features = serving_inputs.for_preprocess(features, signature, stored)
    with _blamed("Task.preprocess"):
      features = preprocess(features)
    with _blamed(f"the model's call ({type(model).__name__})"):
      outputs = model(features, training=False)
    with _blamed("Task.serving_outputs"):
      return named_outputs(serving_outputs(outputs))

  module = tf.Module()
  module.model = model
  # Not converted by AutoGraph itself (so that _blamed sees the task's errors);
  # the task's methods are, as in a tf.function.
  module.serve = tf.function(serve, autograph=False)
  kept = []
  try:
    default = module.serve.get_concrete_function(*specs)
    variants = serving_inputs.serve_variants(signature)
    functions = [default] + [
        module.serve.get_concrete_function(*serving_inputs.named_specs(variant))
        for variant in variants]
    if structured:
      functions += [module.serve.get_concrete_function(variant)
                    for variant in [signature, *variants]]
    # What preprocess and the serving methods read besides the model (a
    # vocabulary's lookup table, a normalisation's variables) is saved with
    # them; nothing only the training pipeline uses.
    kept = served_objects.served(task, functions)
    module.task_objects = [item.owner for item in kept]
    # Every variable tracked directly, the ones the traced functions read and
    # the model's own (a seed generator's state is no layer's weight, but the
    # Keras model's default signature reads it): the session-based loader
    # (saved_model_cli, TensorFlow Serving) restores only what is tracked.
    module.variables_read = [v for f in functions for v in f.variables]
    module.model_variables = list(model.variables)
    with _quiet_tf_data():
      tf.saved_model.save(module, export_dir,
                          signatures={"serving_default": default})
  except _TaskMethodFailed as e:
    raise ExportFailure(f"{e.method} raised {type(e.cause).__name__}: "
                        f"{one_line(e.cause)}") from e.cause
  except (AssertionError, KeyError, ValueError, TypeError, RuntimeError,
          tf.errors.OpError) as e:
    with _quiet_tf_data():
      why = served_objects.unsaveable(kept, export_dir)
    raise ExportFailure(why or served_objects.untracked(e) or _cause(e)) from e
  return export_dir


@contextlib.contextmanager
def _quiet_tf_data():
  """Without tf.data's warning, when a save meets an iterator, that its options
  are read in graph mode: the one line that follows says what matters."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="To make it possible to preserve "
                            "tf.data options")
    yield


class _TaskMethodFailed(Exception):
  """A task method (or the model) raised while the serving function traced."""

  def __init__(self, method: str, cause: Exception):
    super().__init__(method)
    self.method, self.cause = method, cause


@contextlib.contextmanager
def _blamed(method: str):
  try:
    yield
  except _TaskMethodFailed:
    raise
  except Exception as e:  # noqa: BLE001 (the user's code: any error is theirs)
    raise _TaskMethodFailed(method, e) from e



def save_keras_model(model, export_dir: str) -> Optional[str]:
  """Writes EXPORT_DIR/model.keras (the model alone, without Task.preprocess)
  where Keras loads it back without the task's code: `keras.models.load_model`
  of the file is tried before it takes its name.

  Returns:
    None, or why the file is not written (one line).

  Raises:
    NoSpaceError: the disk is full.
  """
  path = os.path.join(export_dir, KERAS_FILE)
  partial = os.path.join(export_dir, "partial." + KERAS_FILE)
  try:
    model.save(partial)
    keras.models.load_model(partial, compile=False)
  except Exception as e:  # noqa: BLE001 (any failure: not loadable; the SavedModel stands)
    if os.path.exists(partial):
      os.remove(partial)
    if no_space(e):
      raise no_space(e) from None
    return (f"{KERAS_FILE} not written: keras.models.load_model cannot load "
            f"{type(model).__name__} without your code ({one_line(e, limit=None)}); "
            "register its classes with @keras.saving.register_keras_serializable()")
  os.replace(partial, path)
  return None


def _cause(error: Exception) -> str:
  """The one line that says why an export failed."""
  return f"{type(error).__name__}: {one_line(error)}"
