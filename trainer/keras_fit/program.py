"""`python -m trainer.keras_fit my_program.py [ARGS]`: a Keras program whose
devices are set up before it runs.

A MultiWorkerMirroredStrategy can only be made before TensorFlow's runtime
starts, and a CPU only split into replicas then; a Keras program starts it long
before `trainer.fit` (it builds its datasets, adapts a TextVectorization). This
module makes the run's strategy first (devices.start), then runs the program,
whose trainer.fit takes that strategy. trainer.fit restarts a program this way
by itself (the same process, os.execv) when it finds TensorFlow started and the
run needs that: the program's lines before trainer.fit then run twice.

The strategy's settings come from $TRAINER_FIT_DEVICES (trainer.fit's restart
puts them there), else from the program's command line (--cpu_devices=2,
--strategy=...) and TF_CONFIG (multi_worker when set).
"""

import json
import os
import runpy
import sys

from trainer import tf_loader
from trainer.config import DistributeConfig
from trainer.errors import ConfigError, TrainerError, one_line
from trainer.keras_fit import command_line

ENV = "TRAINER_FIT_DEVICES"
MODULE = "trainer.keras_fit"  # Its __main__ runs `main`.
_started_here = []  # The settings `main` started this process's devices with.


def strategy_settings(fields: dict) -> dict:
  """The Config fields of `fields` that fix the strategy (JSON-ready)."""
  from trainer.distribute.devices import STRATEGY_FIELDS
  return {name: list(value) if isinstance(value, tuple) else value
          for name, value in fields.items() if name in STRATEGY_FIELDS}


def command_of_this_program():
  """The arguments that run this process's program again after
  `python -m trainer.keras_fit` (`-m MODULE ...` or `SCRIPT ...`), or
  None (an interactive session, `python -c`)."""
  if "IPython" in sys.modules or "ipykernel" in sys.modules:
    return None  # A notebook or an IPython shell: no program to run again.
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is not None and spec.name and not spec.name.startswith(MODULE):
    return ["-m", spec.name, *sys.argv[1:]]
  if sys.argv and sys.argv[0] and os.path.isfile(sys.argv[0]):
    return [os.path.abspath(sys.argv[0]), *sys.argv[1:]]
  return None


def restart(fields: dict, say=print):
  """Runs this process's program again (os.execv) from its start, the run's
  strategy made first.

  Raises:
    ConfigError: it cannot be restarted, or this is its restart already.
  """
  command = command_of_this_program()
  if _started_here or command is None:
    raise ConfigError(
        "TensorFlow ran before trainer.fit, and this run needs its devices set "
        "up first (a MultiWorkerMirroredStrategy, or a CPU split into "
        "--cpu_devices replicas): run the program as python -m "
        f"{MODULE} PROGRAM.py, with the devices' flags on its command line")
  say("trainer.fit: TensorFlow ran before it, and this run needs its devices set "
      "up first: restarting the program as python -m "
      f"{MODULE} {' '.join(command)}")
  sys.stdout.flush()
  sys.stderr.flush()
  os.environ[ENV] = json.dumps(strategy_settings(fields))
  os.execv(sys.executable,
           [sys.executable, *_interpreter_options(), "-m", MODULE, *command])


def _interpreter_options() -> list:
  """The interpreter's own options this process was started with (-u, -O,
  -W ARG, -X ARG), to start the program again with them."""
  argv, options = list(getattr(sys, "orig_argv", [])[1:]), []
  while argv and argv[0].startswith("-") and argv[0] not in ("-m", "-c", "-"):
    options.append(argv.pop(0))
    if options[-1] in ("-W", "-X") and argv:
      options.append(argv.pop(0))
  return options


def _settings(argv) -> dict:
  if os.environ.get(ENV):
    return json.loads(os.environ[ENV])
  fields = command_line.parse(command_line.flag_arguments(argv))
  if os.environ.get("TF_CONFIG"):
    fields.setdefault("strategy", "multi_worker")
  return strategy_settings(fields)


def main(argv) -> int:
  if not argv or argv[0] == "-m" and len(argv) < 2:
    print(f"usage: python -m {MODULE} PROGRAM.py [ARGS] (or -m MODULE [ARGS])",
          file=sys.stderr)
    return 2
  try:
    settings = _settings(argv)
    tf_loader.load_tensorflow()
    from trainer.distribute import devices
    devices.start(DistributeConfig(**settings))
  except TrainerError as e:
    print(f"error: {one_line(e, limit=None)}", file=sys.stderr, flush=True)
    return int(e.exit_code)
  # Read once: the program's own children do not inherit it, and a restart of
  # this run is refused (_started_here).
  os.environ.pop(ENV, None)
  _started_here.append(settings)
  if argv[0] == "-m":
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
  else:
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")
  return 0

