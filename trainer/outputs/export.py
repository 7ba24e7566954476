"""SavedModel export: a serving signature from stored features to the task's outputs.

The signature applies the task's `preprocess` (as training did) before the model and
its `serving_outputs` after it, so a served model takes raw stored values.
"""

import contextlib
import os
import re
import shutil
from typing import Optional

import keras
import tensorflow as tf

from trainer.autograph import graph_code
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
  """(attribute name, object) of the TensorFlow objects (layers, lookup tables,
  variables, modules) a task keeps as attributes, directly or in a list, tuple or
  dict."""
  found = []
  for name, value in vars(task).items():
    items = (list(value.values()) if isinstance(value, dict) else
             list(value) if isinstance(value, (list, tuple)) else [value])
    found += [(name, item) for item in items
              if isinstance(item, tf.__internal__.tracking.Trackable)]
  return found


def _resource_handles(trackable) -> set:
  """The ids of the resource handles (variables, lookup tables) that `trackable`
  and everything it tracks hold."""
  handles = set()
  for item in [trackable, *tf.train.TrackableView(trackable).descendants()]:
    variable = item if isinstance(item, tf.Variable) else getattr(
        item, "value", None)  # A Keras variable wraps a tf one.
    if isinstance(variable, tf.Variable):
      handles.add(id(variable.handle))
    elif hasattr(type(item), "resource_handle"):  # A lookup table, a resource.
      handles.add(id(item.resource_handle))
  return handles


def served_objects(task, functions) -> list:
  """(name, object) of the task's objects that the traced serving `functions`
  read (a vocabulary's lookup table, a normalisation's variables): what the
  export must save. What only the training pipeline uses (an augmentation model
  mapped over the data, say) is left out."""
  captured = {id(t) for f in functions for t in f.captured_inputs}
  return [(name, item) for name, item in task_objects(task)
          if _resource_handles(item) & captured]


def _batch_free(spec):
  """`spec` with a batch dimension of None: a signature serves any batch (a
  spec other than a TensorSpec, ragged or sparse, as it is)."""
  if type(spec) is not tf.TensorSpec:
    return spec
  shape = tf.TensorShape(spec.shape)
  if shape.rank:
    shape = tf.TensorShape([None]).concatenate(shape[1:])
  return tf.TensorSpec(shape, spec.dtype, name=spec.name)


def with_model_shapes(feature_spec, model, task):
  """The stored features' specs, with the batch dimension None and, where the
  features go to the model as they are (one input, no Task.preprocess), the
  dimensions the data leaves unknown taken from the model's input (e.g. windows
  of a series that tf.data does not know are all 120 long), and its dtype (as
  Keras's own export does). Only non-batch dimensions come from the model: a
  model built by a call (no keras.Input) has the batch it was built on."""
  from trainer.tasks.base import Task  # Not at the top: tasks import outputs.
  feature_spec = tf.nest.map_structure(_batch_free, feature_spec)
  inputs = getattr(model, "inputs", None) or []
  leaves = tf.nest.flatten(feature_spec)
  if (type(task).preprocess is not Task.preprocess or len(inputs) != 1 or
      len(leaves) != 1):
    return feature_spec
  model_shape = tf.TensorShape(inputs[0].shape)
  if model_shape.rank:
    model_shape = tf.TensorShape([None]).concatenate(model_shape[1:])
  try:
    shape = tf.TensorShape(leaves[0].shape).merge_with(model_shape)
  except ValueError:  # The model takes another shape: the data's spec stands.
    return feature_spec
  dtype = tf.as_dtype(inputs[0].dtype)
  if not (_numeric(dtype) and _numeric(leaves[0].dtype)):
    dtype = leaves[0].dtype
  return tf.nest.pack_sequence_as(
      feature_spec, [tf.TensorSpec(shape, dtype, name=leaves[0].name)])


def _numeric(dtype) -> bool:
  dtype = tf.as_dtype(dtype)
  return dtype.is_floating or dtype.is_integer


# What Python numbers become (tf.convert_to_tensor: int32, float32) and what
# numpy and pandas store (int64, float64): `serve` takes either.
_NARROW = {tf.int64: tf.int32, tf.float64: tf.float32}
_WIDE = {tf.int32: tf.int64, tf.float32: tf.float64}


def _retyped(signature, table: dict):
  return tf.nest.map_structure(
      lambda s: tf.TensorSpec(s.shape, table.get(s.dtype, s.dtype), name=s.name),
      signature)


def _as_stored(features, stored):
  """`features` cast to the stored features' numeric dtypes (what preprocess and
  the model saw in training), where the structures match."""
  try:
    tf.nest.assert_same_structure(features, stored)
  except (ValueError, TypeError):
    return features
  return tf.nest.map_structure(
      lambda value, spec: tf.cast(value, spec.dtype)
      if value.dtype != spec.dtype and _numeric(value.dtype) and _numeric(spec.dtype)
      else value, features, stored)


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

  The signature takes any batch, and floats as float32 (the model computes in
  it) where the data stores float64. Its `serve` function also takes the
  features as one dict (for dict features), and numbers as int32 and float32
  (Python numbers) or int64 and float64 (numpy, pandas): each is cast to the
  stored dtype before `preprocess`, as in training.

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
  stored = tf.nest.map_structure(_batch_free, feature_spec)
  served = with_model_shapes(feature_spec, model, task)
  signature = task.serving_signature(
      tf.nest.map_structure(lambda s: tf.TensorSpec(
          s.shape, tf.float32 if s.dtype == tf.float64 else s.dtype, name=s.name),
                            served))
  specs = _named_specs(signature)
  structured = isinstance(signature, dict)

  # Converted here, outside the (unconverted) serving function's tracing.
  preprocess, serving_outputs = (graph_code(task.preprocess),
                                 graph_code(task.serving_outputs))

  def serve(*inputs):
    if structured and len(inputs) == 1 and isinstance(inputs[0], dict):
      features = inputs[0]  # serve({"age": ..., ...})
    else:
      features = tf.nest.pack_sequence_as(signature, list(inputs))
    features = _as_stored(features, stored)
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
    functions = [default]
    for variant in (_retyped(signature, _NARROW), _retyped(signature, _WIDE)):
      variant_specs = _named_specs(variant)
      if variant_specs != specs:
        functions.append(module.serve.get_concrete_function(*variant_specs))
    if structured:
      functions += [module.serve.get_concrete_function(variant) for variant in (
          signature, _retyped(signature, _NARROW), _retyped(signature, _WIDE))]
    # What preprocess and the serving methods use besides the model (a
    # vocabulary's lookup table, a normalisation's variables) is saved with
    # them; nothing only the training pipeline uses.
    kept = served_objects(task, functions)
    module.task_objects = [item for _, item in kept]
    # Every variable tracked directly, the ones the traced functions read and
    # the model's own (a seed generator's state is no layer's weight, but the
    # Keras model's default signature reads it): the session-based loader
    # (saved_model_cli, TensorFlow Serving) restores only what is tracked.
    module.variables_read = [v for f in functions for v in f.variables]
    module.model_variables = list(model.variables)
    tf.saved_model.save(module, export_dir, signatures={"serving_default": default})
  except _TaskMethodFailed as e:
    raise ExportFailure(f"{e.method} raised {type(e.cause).__name__}: "
                        f"{one_line(e.cause)}") from e.cause
  except (AssertionError, KeyError, ValueError, TypeError, tf.errors.OpError) as e:
    raise ExportFailure(_unsaveable(kept, export_dir) or _cause(e)) from e
  return export_dir


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



def _unsaveable(kept: list, export_dir: str) -> Optional[str]:
  """Why the first of the task's served objects that cannot be saved on its own
  fails, naming it (`Task.NAME`); None when each saves."""
  probe = export_dir.rstrip("/") + ".probe"
  try:
    for name, item in kept:
      try:
        tf.saved_model.save(item, probe)
      except (AssertionError, KeyError, ValueError, TypeError,
              tf.errors.OpError) as e:
        return (f"Task.{name} ({type(item).__name__}), which preprocess or a "
                f"serving method uses, cannot be saved: {_cause(e)}")
      finally:
        shutil.rmtree(probe, ignore_errors=True)
  finally:
    shutil.rmtree(probe, ignore_errors=True)
  return None


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
  message = str(error)
  if isinstance(error, AssertionError) and "untracked" in message:
    found = re.search(r"Trackable referencing this tensor = <([\w.]+)", message)
    what = found[1].rsplit(".", 1)[-1] if found else "a resource"
    return (f"Task.preprocess or a serving method uses {what} (a TensorFlow "
            "resource) that is neither the model's nor an attribute of the task: "
            "keep it on the task (self.NAME = ..., e.g. in Task.prepare()) so the "
            "export can save it")
  return f"{type(error).__name__}: {one_line(error)}"
