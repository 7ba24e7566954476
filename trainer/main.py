"""`python -m trainer.main --flagfile=flags/X.flags --flag=value ...`

Parses flags into a Config and calls `trainer.train`; a user's mistake becomes one
line on stderr and an exit code (see trainer/errors.py and the README), never a
traceback.
"""

import functools
import os
import sys
import traceback

from absl import app, flags, logging

from trainer import config as config_lib
from trainer import interrupts, tf_loader
from trainer.errors import ExitCode, RunStatus, TrainerError, UserCodeError, one_line

config_lib.define_flags()


def _parse_flags(argv):
  try:
    config_lib.prepare_flags(argv)  # Defines the --task.NAME flags of --task.
    return flags.FLAGS(argv)
  except flags.Error as e:
    _fail(f"error: {config_lib.flags.as_typed(str(e), argv)}", ExitCode.BAD_INPUT)
  except TrainerError as e:
    _fail(f"error: {e}", e.exit_code)


def _fail(message, code):
  print(one_line(message, limit=None) or "error", file=sys.stderr, flush=True)
  sys.exit(int(code))


def main(argv, actions=()):
  try:
    _main(argv, actions)
  finally:
    interrupts.ignore_from_now()  # The run is over: no signal changes its code.


def _main(argv, actions):
  logging.set_verbosity(logging.WARNING)
  if len(argv) > 1:
    _fail(f"error: unexpected arguments {' '.join(argv[1:])!r}; flags look like "
          "--name=value", ExitCode.BAD_INPUT)
  try:
    config = config_lib.from_flags()
    tf_loader.load_tensorflow()  # After flag checks, so flag errors come fast.
    interrupts.refresh()  # TensorFlow's import may have replaced the handlers.
    import trainer  # After TensorFlow's quiet import.
    results = trainer.train(config, actions=actions)
  except UserCodeError as e:
    # The user's own code raised: its traceback, then the line naming it.
    cause = e.__cause__
    traceback.print_exception(type(cause), cause, _user_frames(cause.__traceback__),
                              file=sys.stderr)
    _fail(f"error: {e} (the checkpoints written so far are kept)", e.exit_code)
  except TrainerError as e:
    _fail(f"error: {e}", e.exit_code)
  try:
    sys.exit(int(RunStatus(results.get("status")).exit_code))
  except ValueError:  # A status this version does not know (an older run's).
    sys.exit(int(ExitCode.OK))


def _user_frames(tb):
  """A traceback from its first frame outside the trainer package: where the
  user's code was called."""
  package = os.path.dirname(os.path.abspath(__file__)) + os.sep
  while tb is not None and tb.tb_next is not None and os.path.abspath(
      tb.tb_frame.f_code.co_filename).startswith(package):
    tb = tb.tb_next
  return tb


def run(actions=()):
  """Console-script entry point (`trainer ...`).

  Args:
    actions: actions of the process that runs the command line (a sweep's trial
      adds its pruning gate), after the task's own.
  """
  interrupts.install()  # First: a signal at any later moment is a clean stop.
  if any(arg in _HELP for arg in sys.argv[1:]):
    print(config_lib.reference.help_text(_task_of(sys.argv[1:])))
    sys.exit(int(ExitCode.OK))
  app.run(functools.partial(main, actions=actions), flags_parser=_parse_flags)


_HELP = ("--help", "-h", "-?", "--helpshort")  # --helpfull stays absl's.


def _task_of(argv) -> str:
  """The task a command line names (in its flagfiles too), else the default's:
  a flagfile that cannot be read is the run's error, not --help's (the command
  line's own --task still counts)."""
  try:
    return config_lib.flags.task_of(argv)
  except TrainerError:
    return config_lib.flags.task_of(argv, expand=False)


if __name__ == "__main__":
  run()
