"""The framework's flags, from the config fields' metadata, and the task's flags.

`define_flags` defines one absl flag per field of every section; `prepare_flags`
loads the task a command line names and defines its `--task.NAME` flags (and the
built-in tasks' short names: --dataset is --task.dataset); `from_flags` builds the
Config. `from_argv` parses a command line exactly as the CLI does, on private
FlagValues, for sweeps and scripts.
"""

import dataclasses
import os
import typing
from typing import Optional, Sequence

from trainer.config.config import Config
from trainer.config.sections import flag_fields, flag_names
from trainer.errors import ConfigError, one_line
from trainer.flag_spelling import TASK_FLAG_ALIASES


def _field_named(name: str) -> dataclasses.Field:
  """The config field of flag `name`; KeyError if there is none."""
  return {f.name: f for f in flag_fields()}[name]


def _base_type(hint) -> type:
  """The Python type a flag of type `hint` holds: str, int, float, bool or list."""
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  if typing.get_origin(hint) is typing.Union:
    hint = args[0]
  return list if typing.get_origin(hint) is not None or hint is Sequence else hint


def _item_type(hint) -> type:
  """The type of a list flag's items (int unless the hint says str)."""
  for arg in typing.get_args(hint):
    found = _item_type(arg) if typing.get_args(arg) else arg
    if found in (int, str):
      return found
  return int


def flag_kind(name: str, task_class=None) -> type:
  """The type flag `name` holds (str, int, float, bool or list): a framework flag,
  or `task.NAME` (or its short alias) of `task_class` (default: the default task).

  Raises:
    KeyError: no such flag.
  """
  if name.startswith("task.") or name in TASK_FLAG_ALIASES:
    from trainer import tasks  # The task registry imports this package.
    task_class = task_class or tasks.load_task_class(Config.task)
    param = name.split(".", 1)[-1]
    if param not in [f.name for f in tasks.hyperparameters(task_class)]:
      raise KeyError(name)
    return tasks.param_type(task_class, param)
  return _base_type(typing.get_type_hints(Config)[_field_named(name).name])


def field_choices(name: str, task_class=None):
  """The values flag `name` allows, or None when it is not an enum."""
  if name.startswith("task.") or name in TASK_FLAG_ALIASES:
    from trainer import tasks  # The task registry imports this package.
    task_class = task_class or tasks.load_task_class(Config.task)
    return tasks.param_choices(task_class, name.split(".", 1)[-1])
  return _field_named(name).metadata["choices"]


def as_typed(message: str, argv) -> str:
  """An absl error `message` naming a task flag as the command line spelled it:
  `--dataset`, when that is how it was given, not `--task.dataset`."""
  for alias in TASK_FLAG_ALIASES:
    typed = any(a.lstrip("-").split("=", 1)[0] in (alias, f"no{alias}")
                for a in argv if a.startswith("-"))
    if typed:
      message = message.replace(f"--task.{alias}", f"--{alias}")
  return message


def _define(flags, flag_values, *, name, kind, default, help_text, choices=None):
  kwargs = dict(name=name, default=default, help=help_text, flag_values=flag_values)
  if choices:
    flags.DEFINE_enum(enum_values=list(choices), **kwargs)
    if {"true", "false"} <= set(choices):
      # A bare --NAME means true and --noNAME false, as for a boolean flag.
      flag_values[name].boolean = True
  elif kind is bool:
    flags.DEFINE_bool(**kwargs)
  elif kind is int:
    flags.DEFINE_integer(**kwargs)
  elif kind is float:
    flags.DEFINE_float(**kwargs)
  elif kind is list:
    kwargs["default"] = None if default is None else [str(v) for v in default]
    flags.DEFINE_list(**kwargs)
  else:
    flags.DEFINE_string(**kwargs)


def define_flags(flag_values=None):
  """Defines one absl flag per config field (on absl's global FLAGS by default)."""
  from absl import flags  # Only the CLI needs absl's flag machinery.
  if flag_values is None:
    flag_values = flags.FLAGS
  hints = typing.get_type_hints(Config)
  for f in flag_fields():
    _define(flags, flag_values, name=f.name, kind=_base_type(hints[f.name]),
            default=f.default, help_text=f.metadata["help"],
            choices=f.metadata["choices"])
  # The name MultiWorkerMirroredStrategy's own options use for the same choice.
  flags.DEFINE_alias("communication", "cross_device_ops", flag_values=flag_values)


def define_task_flags(task_class, flag_values=None):
  """Defines `--task.NAME` for each hyperparameter of `task_class`, and `--NAME`
  as its alias for the built-in tasks' short names (TASK_FLAG_ALIASES)."""
  from absl import flags
  from trainer import tasks  # The task registry imports this package.
  if flag_values is None:
    flag_values = flags.FLAGS
  defaults = tasks.param_defaults(task_class)
  for f in tasks.hyperparameters(task_class):
    name = f"task.{f.name}"
    if name in flag_values:
      continue
    _define(flags, flag_values, name=name, kind=tasks.param_type(task_class, f.name),
            default=defaults.get(f.name), choices=tasks.param_choices(task_class,
                                                                      f.name),
            help_text=f.metadata.get("help") or
            f"Hyperparameter {f.name} of task {task_class.__name__}.")
    if f.name in TASK_FLAG_ALIASES and f.name not in flag_values:
      flags.DEFINE_alias(f.name, name, flag_values=flag_values)


def _flagfile_includes(argv) -> list:
  """The flagfiles `argv` names (each `--flagfile=F`), expanded recursively.

  Raises:
    ConfigError: a flagfile includes itself, directly or through others.
  """
  def expand(args, stack):
    found = []
    for arg in args:
      name, _, value = arg.lstrip("-").partition("=")
      if not arg.startswith("-") or name != "flagfile" or not value:
        continue
      path = os.path.realpath(value)
      if path in stack:
        raise ConfigError(f"--flagfile={value}: includes itself (through "
                          f"{' -> '.join(stack + [path])}); remove the --flagfile "
                          "line that repeats it")
      try:
        with open(path, errors="replace") as f:
          lines = [line.strip() for line in f]
      except OSError:
        continue  # absl names the unreadable file.
      found += [path, *expand(lines, stack + [path])]
    return found

  return expand(list(argv), [])


def _expand(argv, flag_values) -> list:
  """`argv` (without the program name) with its flagfiles expanded.

  Raises:
    ConfigError: a flagfile cannot be read, or includes itself.
  """
  from absl import flags
  _flagfile_includes(argv)
  try:
    expanded = flag_values.read_flags_from_files(list(argv), force_gnu=False)
  except (flags.Error, UnicodeDecodeError) as e:
    raise ConfigError(one_line(e)) from None
  return expanded[:expanded.index("--")] if "--" in expanded else expanded


def _named_task(expanded) -> str:
  """The task spec an expanded command line names (the last --task), else the
  default's."""
  spec = Config.task
  for index, arg in enumerate(expanded):
    name, has_value, value = arg.lstrip("-").partition("=")
    if arg.startswith("-") and name == "task":
      # absl takes --task=X, --task X, -task=X and -task X.
      following = (expanded[index + 1:index + 2] or [""])[0]
      spec = value if has_value else ("" if following.startswith("-")
                                      else following)
  return spec


def task_of(argv: Sequence[str], flag_values=None, *, expand: bool = True) -> str:
  """The task spec a command line (without the program name) names, in its
  flagfiles too unless expand=False, else the default's (`--help` shows that
  task's flags).

  Raises:
    ConfigError: a flagfile cannot be read, or includes itself (expand=True).
  """
  from absl import flags
  if not expand:
    return _named_task(list(argv))
  return _named_task(_expand(argv, flags.FLAGS if flag_values is None
                             else flag_values))


def prepare_flags(argv: Sequence[str], flag_values=None):
  """Loads the task a command line names and defines its `--task.NAME` flags.

  Call before parsing `argv` (which includes the program name).

  Raises:
    ConfigError: the task cannot be loaded, it has no hyperparameter that a
      `--task.NAME` (or a short alias) names, or a flagfile cannot be read.
  """
  from absl import flags
  from trainer import tasks  # The task registry imports this package.
  flag_values = flags.FLAGS if flag_values is None else flag_values
  expanded = _expand(argv[1:], flag_values)
  spec, names, aliases = _named_task(expanded), [], []
  for arg in expanded:
    name = arg.lstrip("-").partition("=")[0]
    if not arg.startswith("-"):
      continue
    if name.startswith(("task.", "notask.")):
      names.append(name.split(".", 1)[1])
    elif name.removeprefix("no") in TASK_FLAG_ALIASES:
      aliases.append(name.removeprefix("no"))
  task_class = tasks.load_task_class(spec)
  tasks.check_param_names(spec, task_class, names)
  known = [f.name for f in tasks.hyperparameters(task_class)]
  for alias in aliases:
    if alias not in known:
      raise ConfigError(f"--{alias}: task {spec} has no hyperparameter {alias} "
                        "(it is one of --task=classification's)")
  define_task_flags(task_class, flag_values)


def from_flags(flag_values=None) -> Config:
  """Builds a Config from parsed absl flags (those of `prepare_flags` included).

  Raises:
    ConfigError: a flag value is invalid.
  """
  from absl import flags
  from trainer import tasks  # The task registry imports this package.
  if flag_values is None:
    flag_values = flags.FLAGS
  hints, values = typing.get_type_hints(Config), {}
  for f in flag_fields():
    value = flag_values[f.name].value
    if _base_type(hints[f.name]) is list and value is not None:
      value = tuple(_parse_item(f.name, _item_type(hints[f.name]), item)
                    for item in value)
    values[f.name] = value
  task_class = tasks.load_task_class(values["task"])
  defaults = tasks.param_defaults(task_class)
  params = {}
  for f in tasks.hyperparameters(task_class):
    value = flag_values[f"task.{f.name}"].value
    if value is None and f.name not in defaults:
      raise ConfigError(f"--task.{f.name}: task {values['task']} needs a value")
    if isinstance(value, list):
      value = tuple(_parse_item(f"task.{f.name}", int, item) for item in value)
    params[f.name] = value
  config = Config(task_params=tuple(params.items()), **values)
  tasks.build_task(config.task, config.task_kwargs)  # Checks the values.
  return config


def _parse_item(name: str, kind: type, item: str):
  try:
    return kind(item)
  except ValueError:
    raise ConfigError(f"--{name}: {item!r} is not an integer") from None


def from_argv(argv: Sequence[str]) -> Config:
  """Parses trainer flags (`--flagfile=F`, `--name=value`) exactly as the CLI does.

  Uses private FlagValues, so sweeps and scripts can check a trial's command line
  without touching the global FLAGS (nor importing TensorFlow, unless the task's
  own module does).

  Raises:
    ConfigError: an unknown or malformed flag, an invalid value or task.
  """
  from absl import flags
  flag_values = flags.FlagValues()
  define_flags(flag_values)
  argv = ["trainer", *argv]
  prepare_flags(argv, flag_values)
  try:
    rest = flag_values(argv)
  except flags.Error as e:
    raise ConfigError(as_typed(one_line(e), _expand(argv[1:], flag_values))) from None
  if len(rest) > 1:
    raise ConfigError(f"unexpected arguments {' '.join(rest[1:])!r}")
  return from_flags(flag_values)


def load_flagfile(path: str) -> Config:
  """Parses a flagfile (e.g. a run's flags.txt) into a Config.

  Raises:
    ConfigError: the file is missing or holds invalid flags.
  """
  try:
    return from_argv([f"--flagfile={path}"])
  except (ConfigError, OSError, UnicodeDecodeError) as e:
    raise ConfigError(f"{path}: {e}") from None


def read_flagfile(path: str) -> Optional[dict]:
  """Reads a flagfile written by `Config.to_flags` into {name: value string},
  the built-in tasks' short names as `task.NAME`. None when it is unreadable;
  lines that are not flags are skipped."""
  values = {}
  try:
    with open(path, errors="replace") as f:
      lines = f.read().splitlines()
  except OSError:
    return None
  for line in lines:
    line = line.strip()
    if line.startswith("--") and "=" in line:
      name, value = line[2:].split("=", 1)
      values[f"task.{name}" if name in TASK_FLAG_ALIASES else name] = value
  return values


__all__ = ["as_typed", "define_flags", "field_choices", "flag_kind", "flag_names",
           "from_argv", "from_flags", "load_flagfile", "prepare_flags",
           "read_flagfile"]
