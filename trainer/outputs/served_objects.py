"""What of a task an export saves: the resources (variables, lookup tables) that
`Task.preprocess` and the serving methods read, found wherever the task keeps
them, and, when one cannot be saved, which attribute holds it.

The search follows Python attributes, not TensorFlow's tracking: a
`keras.utils.FeatureSpace` keeps its lookup layers in dicts that TensorFlow
does not track, so only a walk of the attributes reaches their tables. What
only the training pipeline uses (an augmentation model mapped over the data) is
never read by the serving functions, so it is left out.
"""

import re
import shutil
import types
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf

from trainer import internals
from trainer.errors import one_line


class Served(NamedTuple):
  """A resource the serving functions read, and where the task keeps it."""
  attribute: str  # The task's attribute it was found under (Task.NAME).
  holder: object  # That attribute's value (a FeatureSpace, a layer, an iterator).
  owner: object  # The object whose resource it is (a tf.Variable, a table).
  handle: tf.Tensor  # The resource handle the functions capture.


# Values whose attributes hold no resource: not walked.
_LEAVES = (str, bytes, int, float, bool, type(None), np.ndarray, np.generic,
           types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
           types.MethodType, tf.Graph, tf.Operation, tf.TypeSpec,
           tf.types.experimental.GenericFunction,
           tf.types.experimental.ConcreteFunction)


def _resources(task) -> dict:
  """{id of a resource handle: Served} of every resource the task's attributes
  hold, at any depth: in dicts, lists and tuples, and in the attributes of the
  objects in them."""
  found, seen = {}, set()
  for attribute, holder in vars(task).items():
    stack = [holder]
    while stack:
      value = stack.pop()
      if id(value) in seen or isinstance(value, _LEAVES):
        continue
      seen.add(id(value))
      if isinstance(value, dict):
        stack += list(value.values())
      elif isinstance(value, (list, tuple, set, frozenset)):
        stack += list(value)
      elif isinstance(value, tf.Tensor):
        continue  # Any resource tensor is an attribute of its owner, below.
      elif hasattr(value, "__dict__"):  # Not properties: nothing runs.
        for item in vars(value).values():
          if (isinstance(item, tf.Tensor) and item.dtype == tf.resource and
              isinstance(value, internals.trackable_type())):
            found.setdefault(id(item), Served(attribute, holder, value, item))
          else:
            stack.append(item)
  return found


def served(task, functions) -> list:
  """The task's resources that the traced serving `functions` capture (a
  vocabulary's lookup table, a normalisation's variables): what the export
  must save beside the model, each once."""
  resources = _resources(task)
  kept = {}
  for function in functions:
    for captured in function.captured_inputs:
      found = resources.get(id(captured))
      if found is not None:
        kept.setdefault(id(found.owner), found)
  return list(kept.values())


def unsaveable(kept: list, export_dir: str) -> Optional[str]:
  """Why the first of `kept` that a SavedModel cannot hold fails, naming the
  task's attribute (Task.NAME); None when each saves. Each is tried on its own,
  read by a function as the serving function reads it."""
  probe_dir = export_dir.rstrip("/") + ".probe"
  try:
    for item in kept:
      probe = tf.Module()
      probe.item = item.owner
      probe.read = _reader(item.handle)
      probe.read.get_concrete_function()
      try:
        tf.saved_model.save(probe, probe_dir)
      except Exception as e:  # noqa: BLE001 (any failure: this one cannot be saved)
        return _named(item, e)
      finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
  finally:
    shutil.rmtree(probe_dir, ignore_errors=True)
  return None


def _reader(handle):
  """A function that captures `handle`, as the serving function does."""
  return tf.function(lambda: tf.shape(handle))


def _named(item: Served, error: Exception) -> str:
  what = type(item.holder).__name__
  if item.owner is not item.holder:
    what += f"'s {type(item.owner).__name__}"
  # TensorFlow's own words ask to track what is tracked: say what it refused.
  kind = re.search(r'type="([^"]+)"', str(error))
  why = (f"TensorFlow saves no {kind[1].rsplit('::', 1)[-1]}" if kind else
         f"{type(error).__name__}: {one_line(error).rstrip('.')}")
  return (f"Task.{item.attribute} ({what}), which preprocess or a serving method "
          f"uses, cannot be saved in a SavedModel ({why}): serving must not read "
          "it; read it in the input pipeline (train_data) instead, and keep what "
          "preprocess needs in variables, lookup tables or Keras layers")


def untracked(error: Exception) -> Optional[str]:
  """The one line for TensorFlow's "untracked resource" error: a resource that
  serving reads and that no attribute of the task holds, at any depth (a
  global's, a closure's)."""
  message = str(error)
  if not (isinstance(error, AssertionError) and "untracked" in message):
    return None
  named = re.search(r"Trackable referencing this tensor = <([\w.]+)", message)
  kind = re.search(r'type="([^"]+)"', message)
  what = (named[1].rsplit(".", 1)[-1] if named else
          kind[1].rsplit("::", 1)[-1] if kind else "a resource")
  return (f"Task.preprocess or a serving method uses {what} (a TensorFlow "
          "resource) that is neither the model's nor an attribute of the task: "
          "keep it on the task (self.NAME = ..., e.g. in Task.prepare()) so the "
          "export can save it")
