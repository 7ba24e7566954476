"""SavedModel export: a serving signature from stored features to the task's outputs.

The signature applies the task's `preprocess` (as training did) before the model and
its `serving_outputs` after it, so a served model takes raw stored values.
"""

import os
import re
from typing import Optional

import keras
import tensorflow as tf

from trainer.errors import TaskError, no_space, one_line

KERAS_FILE = "model.keras"  # Keras' own format, beside the SavedModel's files.


class ExportFailure(Exception):
  """An export failed; its message is the cause, in one line."""


def _named_specs(signature) -> list:
  """The signature's TensorSpecs in `tf.nest.flatten` order, each named: its own
  name, else its path of dict keys ("image", "meta_age"), else "inputs"."""
  return [tf.TensorSpec(spec.shape, spec.dtype, name=spec.name or path)
          for spec, path in zip(tf.nest.flatten(signature), _paths(signature))]


def _paths(structure, prefix: str = "") -> list:
  """Names of a nest's leaves, in `tf.nest.flatten` order (dict keys sorted)."""
  if isinstance(structure, dict):
    return [path for key in sorted(structure)
            for path in _paths(structure[key], f"{prefix}{key}_")]
  if isinstance(structure, (list, tuple)):
    return [path for index, item in enumerate(structure)
            for path in _paths(item, f"{prefix}{index}_")]
  return [prefix.rstrip("_") or "inputs"]


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


def task_objects(task) -> list:
  """The TensorFlow objects (layers, lookup tables, variables, modules) a task
  keeps as attributes, directly or in a list, tuple or dict."""
  found = []
  for value in vars(task).values():
    items = (list(value.values()) if isinstance(value, dict) else
             list(value) if isinstance(value, (list, tuple)) else [value])
    found += [item for item in items
              if isinstance(item, tf.__internal__.tracking.Trackable)]
  return found


def with_model_shapes(feature_spec, model, task):
  """The stored features' specs, with the dimensions the data leaves unknown taken
  from the model's input (e.g. windows of a series that tf.data does not know are
  all 120 long), where the features go to the model as they are: one input, and
  no Task.preprocess."""
  from trainer.tasks.base import Task  # Not at the top: tasks import outputs.
  inputs = getattr(model, "inputs", None) or []
  leaves = tf.nest.flatten(feature_spec)
  if (type(task).preprocess is not Task.preprocess or len(inputs) != 1 or
      len(leaves) != 1):
    return feature_spec
  try:
    shape = tf.TensorShape(leaves[0].shape).merge_with(inputs[0].shape)
  except ValueError:  # The model takes another shape: the data's spec stands.
    return feature_spec
  return tf.nest.pack_sequence_as(
      feature_spec, [tf.TensorSpec(shape, leaves[0].dtype, name=leaves[0].name)])


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

  Args:
    model: the trained Keras model.
    task: the run's Task.
    export_dir: destination directory (replaced if it exists).
    feature_spec: specs of a batch of stored features (see data.feature_spec).

  Returns:
    export_dir.
  """
  signature = task.serving_signature(with_model_shapes(feature_spec, model, task))
  specs = _named_specs(signature)

  def serve(*inputs):
    features = tf.nest.pack_sequence_as(signature, list(inputs))
    outputs = model(task.preprocess(features), training=False)
    return named_outputs(task.serving_outputs(outputs))

  module = tf.Module()
  module.model = model
  # What preprocess and the serving methods use besides the model (a vocabulary's
  # lookup table, a normalisation's variables) is saved with them.
  module.task_objects = task_objects(task)
  module.serve = tf.function(serve, input_signature=specs)
  try:
    # Every variable tracked directly, the ones the traced function reads and
    # the model's own (a seed generator's state is no layer's weight, but the
    # Keras model's default signature reads it): the session-based loader
    # (saved_model_cli, TensorFlow Serving) restores only what is tracked.
    module.variables_read = list(module.serve.get_concrete_function().variables)
    module.model_variables = list(model.variables)
    tf.saved_model.save(module, export_dir,
                        signatures={"serving_default": module.serve})
  except (AssertionError, KeyError, ValueError, TypeError, tf.errors.OpError) as e:
    raise ExportFailure(_cause(e)) from e
  return export_dir


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
            f"{type(model).__name__} without your code ({one_line(str(e))[:200]}); "
            "register its classes with @keras.saving.register_keras_serializable()")
  os.replace(partial, path)
  return None


def _cause(error: Exception) -> str:
  """The one line that says why an export failed."""
  message = str(error)
  if isinstance(error, AssertionError) and "untracked" in message:
    found = re.search(r"Trackable referencing this tensor = <([\w.]+)", message)
    what = found[1].rsplit(".", 1)[-1] if found else "a resource"
    return (f"Task.preprocess or a serving method uses {what} (a TensorFlow "
            "resource) that is neither the model's nor an attribute of the task: "
            "keep it on the task (self.NAME = ..., e.g. in Task.prepare()) so the "
            "export can save it")
  # TensorFlow's "in user code:" errors put the cause on their last lines.
  lines = [line.strip() for line in message.splitlines() if line.strip()]
  cause = lines[-1] if lines and lines[0].endswith("in user code:") else message
  return f"{type(error).__name__}: {one_line(cause)}"
