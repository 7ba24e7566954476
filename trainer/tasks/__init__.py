"""Tasks: the `Task` base class, the built-in tasks, and loading `--task=...`.

`--task` is a built-in name (`classification`, `regression`) or `MODULE:CLASS` of a
Task subclass importable from PYTHONPATH (the working directory included). Task
hyperparameters are the class's dataclass fields, set with `--task.NAME=VALUE`.
Loading a built-in task does not import TensorFlow.
"""

import dataclasses
import importlib
import sys
import typing

from trainer import tf_loader
from trainer.errors import ConfigError, TrainerError, one_line
from trainer.tasks.base import (RunContext, Task, hyperparameter, hyperparameters,
                                layout_field_names, metric_goal)

BUILTIN = {
    "classification": "trainer.tasks.classification:Classification",
    "regression": "trainer.tasks.regression:Regression",
}
PARAM_TYPES = (bool, int, float, str)


def load_task_class(spec: str) -> type:
  """The Task class named by `spec` (a built-in name or MODULE:CLASS).

  Raises:
    ConfigError: unknown name, a module that does not import, a missing class, a
      class that is not a Task, or a hyperparameter of an unsupported type.
  """
  target = BUILTIN.get(spec, spec)
  module_name, sep, class_name = target.partition(":")
  if not sep or not module_name or not class_name:
    raise ConfigError(f"--task={spec}: use a built-in task ({', '.join(BUILTIN)}) or "
                      "MODULE:CLASS of a trainer.Task subclass")
  if "" not in sys.path and "." not in sys.path:
    sys.path.insert(0, "")  # `python -m` adds the working directory; scripts do not.
  if spec not in BUILTIN:
    # A user's module imports TensorFlow itself: first load it quietly, so its
    # native start-up lines do not reach the terminal.
    tf_loader.load_tensorflow()
  try:
    with tf_loader.watch_start(f"importing {module_name}"):
      module = importlib.import_module(module_name)
  except Exception as e:  # noqa: BLE001
    # Any error while importing the user's module is the user's to fix.
    raise ConfigError(f"--task={spec}: cannot import {module_name} "
                      f"({type(e).__name__}: {one_line(e)})") from None
  task_class = getattr(module, class_name, None)
  if task_class is None:
    raise ConfigError(f"--task={spec}: module {module_name} has no {class_name}")
  if not (isinstance(task_class, type) and issubclass(task_class, Task)):
    raise ConfigError(f"--task={spec}: {class_name} is not a subclass of trainer.Task")
  for field in hyperparameters(task_class):
    param_type(task_class, field.name)  # Raises for unsupported types.
  return task_class


def task_spec(task_class) -> str:
  """The `--task` value that loads `task_class`."""
  target = f"{task_class.__module__}:{task_class.__qualname__}"
  return {v: k for k, v in BUILTIN.items()}.get(target, target)


def param_type(task_class, name: str) -> type:
  """The type of hyperparameter `name`'s flag: bool, int, float, str (also for
  Optional[str]), or list (a tuple of ints, e.g. an example shape).

  Raises:
    ConfigError: the field's type is not one a flag can hold.
  """
  kind = typing.get_type_hints(task_class).get(name)
  args = typing.get_args(kind)
  if kind in PARAM_TYPES:
    return kind
  if typing.get_origin(kind) is typing.Union and set(args) == {str, type(None)}:
    return str
  if typing.get_origin(kind) is tuple and args and args[0] is int and (
      len(args) == 1 or args[1:] == (Ellipsis,)):
    return list
  raise ConfigError(f"task {task_class.__name__}: field {name} has type {kind}; "
                    "task hyperparameters must be bool, int, float, str, "
                    "Optional[str] or Tuple[int, ...]")


def param_choices(task_class, name: str):
  """The values hyperparameter `name` allows (its field's metadata "choices"), or
  None."""
  for field in hyperparameters(task_class):
    if field.name == name:
      return field.metadata.get("choices")
  return None


def param_defaults(task_class) -> dict:
  """{name: default} of the class's hyperparameters (required ones absent)."""
  defaults = {}
  for field in hyperparameters(task_class):
    if field.default is not dataclasses.MISSING:
      defaults[field.name] = field.default
    elif field.default_factory is not dataclasses.MISSING:
      defaults[field.name] = field.default_factory()
  return defaults


def task_params(task: Task) -> dict:
  """{name: value} of a task instance's hyperparameters, each of its field's type
  (an int given for a float field is recorded as the float a flag would parse).

  Raises:
    ConfigError: a field's type is not one a flag can hold.
  """
  params = {}
  for field in hyperparameters(type(task)):
    kind, value = param_type(type(task), field.name), getattr(task, field.name)
    params[field.name] = float(value) if kind is float and isinstance(
        value, int) and not isinstance(value, bool) else value
  return params


def check_param_names(spec: str, task_class, names):
  """Raises ConfigError for the first of `names` that is not a hyperparameter."""
  known = [f.name for f in hyperparameters(task_class)]
  for name in names:
    if name not in known:
      raise ConfigError(f"--task.{name}: task {spec} has no hyperparameter {name} "
                        f"(it has: {', '.join(known) or 'none'})")


def build_task(spec: str, params: dict) -> Task:
  """Instantiates the task `spec` with hyperparameters `params`.

  Raises:
    ConfigError: an unknown hyperparameter, or a value the task rejects (its
      `__post_init__` raising ValueError or TypeError).
  """
  task_class = load_task_class(spec)
  check_param_names(spec, task_class, params)
  try:
    with tf_loader.watch_start(f"{task_class.__name__}(...) (its __init__ or "
                               "__post_init__)"):
      return task_class(**params)
  except TrainerError:
    raise  # Already names the flag (a built-in task's checks).
  except (ValueError, TypeError) as e:
    raise ConfigError(f"--task={spec}: {one_line(e)}") from None


__all__ = ["BUILTIN", "RunContext", "Task", "build_task", "check_param_names",
           "hyperparameter", "hyperparameters",
           "layout_field_names", "load_task_class", "metric_goal", "param_choices",
           "param_defaults", "param_type", "task_params", "task_spec"]
