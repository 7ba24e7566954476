"""The flag reference (docs/flags.md) and `--help`, written from the flags' own
definitions: the config sections' fields and a task's hyperparameters."""

import dataclasses
import textwrap

from trainer.config.sections import SECTIONS
from trainer.errors import ConfigError
from trainer.flag_spelling import TASK_FLAG_ALIASES, flag_value


def flag_table() -> str:
  """The flag reference (Markdown): every framework flag with its default, one
  table per section (the section's docstring is its heading)."""
  parts = []
  for section in SECTIONS:
    rows = [f"### {section.__doc__.strip().rstrip('.')}", "",
            "| Flag | Default | Meaning |", "|---|---|---|"]
    for f in dataclasses.fields(section):
      if f.metadata["flag"]:
        default = "" if f.default is None else f"`{flag_value(f.default)}`"
        rows.append(f"| `--{f.name}` | {default} | {f.metadata['help']} |")
    parts.append("\n".join(rows))
  return "\n\n".join(parts)


def task_flag_table(task_class, spec: str) -> str:
  """The `--task.NAME` flags of a task (Markdown), with their short aliases."""
  from trainer import tasks  # The task registry imports this package.
  defaults = tasks.param_defaults(task_class)
  rows = ["| Flag | Default | Meaning |", "|---|---|---|"]
  for f in tasks.hyperparameters(task_class):
    names = f"`--task.{f.name}`" + (f" (`--{f.name}`)" if f.name in TASK_FLAG_ALIASES
                                    else "")
    default = defaults.get(f.name)
    shown = "" if default is None else f"`{flag_value(default)}`"
    rows.append(f"| {names} | {shown} | {f.metadata.get('help', '')} |")
  return f"### `--task={spec}`\n\n" + "\n".join(rows)


def help_text(task_spec: str = "classification") -> str:
  """`--help`: the framework's flags grouped by section (as docs/flags.md), then
  the task's `--task.NAME` flags; absl's own are left to --helpfull."""
  from trainer import tasks  # The task registry imports this package.

  def entry(name: str, default, text: str, alias: str = "") -> str:
    value = "" if default is None else flag_value(default)
    return (f"  {name}{'=' + value if value else ''}{alias}\n" +
            textwrap.fill(text, width=88, initial_indent="      ",
                          subsequent_indent="      "))

  parts = ["usage: python -m trainer.main [--flagfile=FILE] [--name=value ...]\n"
           "(a flagfile holds one --name=value per line; later flags override it)"]
  for section in SECTIONS:
    lines = [f"{section.__doc__.strip().rstrip('.')}:"]
    lines += [entry(f"--{f.name}", f.default, f.metadata["help"])
              for f in dataclasses.fields(section) if f.metadata["flag"]]
    parts.append("\n".join(lines))
  try:
    task_class = tasks.load_task_class(task_spec)
  except ConfigError as e:
    parts.append(f"(no task flags: {e})")
  else:
    defaults = tasks.param_defaults(task_class)
    lines = [f"The task's flags (--task={task_spec}):"]
    lines += [entry(f"--task.{f.name}", defaults.get(f.name),
                    f.metadata.get("help", ""),
                    alias=f"  (or --{f.name})" if f.name in TASK_FLAG_ALIASES else "")
              for f in tasks.hyperparameters(task_class)]
    parts.append("\n".join(lines))
  parts.append("Every flag with its meaning: docs/flags.md; absl's own flags too: "
               "--helpfull.")
  return "\n\n".join(parts)
