"""The framework's flags on a Keras program's own command line.

`python my_program.py --cpu_devices=2 --model_dir=runs/b --deterministic` gives
the program's `trainer.fit` those Config fields (over its keywords), as
`python -m trainer.main` takes them. Only arguments that name a framework flag
(`--NAME=VALUE`, `--NAME`, `--noNAME` for a boolean) are read; the program's
other arguments are left to it.
"""

import re

from trainer import config as config_lib

_FLAG = re.compile(r"^--(?P<name>[A-Za-z_][A-Za-z0-9_]*)(=(?P<value>.*))?$", re.S)


def flag_arguments(argv) -> dict:
  """{Config field: its argument} of the framework flags among `argv`."""
  names = set(config_lib.flag_names())
  found = {}
  for arg in argv:
    match = _FLAG.match(arg)
    if match is None:
      continue
    name = match["name"]
    if name not in names and name.startswith("no") and name[2:] in names:
      name = name[2:]
    if name in names:
      found[name] = arg
  return found


def parse(arguments: dict) -> dict:
  """{Config field: value} of flag_arguments' flags, parsed and checked as the
  CLI parses them.

  Raises:
    ConfigError: a flag with a value it cannot take.
  """
  if not arguments:
    return {}
  parsed = config_lib.from_argv(list(arguments.values()))
  return {name: getattr(parsed, name) for name in arguments}
