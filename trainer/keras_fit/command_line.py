"""The framework's flags on a Keras program's own command line.

`python my_program.py --cpu_devices=2 --model_dir=runs/b --deterministic` gives
the program's `trainer.fit` those Config fields (over its keywords), as
`python -m trainer.main` takes them. Only the flags of where and how the run
executes (`RUNNING_FLAGS`: devices, strategy, model_dir, determinism, time and
hang limits, summaries) are read, as `--NAME=VALUE`, `--NAME` or `--noNAME`;
every other argument, `--learning_rate` or `--seed` too, is the program's own.
"""

import re

from trainer import config as config_lib

_FLAG = re.compile(r"^--(?P<name>[A-Za-z_][A-Za-z0-9_]*)(=(?P<value>.*))?$", re.S)
# The framework's flags a Keras program's command line may give trainer.fit.
RUNNING_FLAGS = ("cpu_devices", "gpus", "strategy", "cluster_resolver",
                 "cross_device_ops", "memory_growth", "intra_op_threads",
                 "inter_op_threads", "model_dir", "deterministic", "max_time",
                 "hang_timeout", "requeue_signal", "summaries", "mixed_precision",
                 "jit_compile", "sync_batchnorm", "verify_equivalence")


def flag_arguments(argv) -> dict:
  """{Config field: its argument} of the RUNNING_FLAGS among `argv`."""
  names = set(RUNNING_FLAGS) & set(config_lib.flag_names())
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
