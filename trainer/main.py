"""`python -m trainer.main --flagfile=flags/X.flags --flag=value ...`

Parses flags into a Config and calls `trainer.train`; a user's mistake becomes one
line on stderr and an exit code (see trainer/errors.py and the README), never a
traceback.
"""

import contextlib
import os
import sys
import tempfile

# Before TensorFlow loads: keep its C++ info lines out of the user's terminal.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

from trainer import config as config_lib
from trainer.errors import ExitCode, TrainerError

config_lib.define_flags()


def _parse_flags(argv):
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _fail(f"error: {e}", ExitCode.BAD_INPUT)


def _fail(message, code):
  print(message.splitlines()[0] if message else "error", file=sys.stderr, flush=True)
  sys.exit(int(code))


@contextlib.contextmanager
def _native_stderr_captured():
  """Holds back what native code writes to fd 2 while TensorFlow loads.

  TensorFlow's C++ start-up lines (oneDNN, CUDA probing) are written before its
  logging is initialised, so TF_CPP_MIN_LOG_LEVEL cannot hide them. They are shown
  only if loading fails.
  """
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+") as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    except BaseException:
      os.dup2(saved, 2)
      captured.seek(0)
      sys.stderr.write(captured.read())
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def _load_tensorflow():
  with _native_stderr_captured():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.list_physical_devices()  # Probes CUDA; does not fix the device split.


def main(argv):
  logging.set_verbosity(logging.WARNING)
  if len(argv) > 1:
    _fail(f"error: unexpected arguments {' '.join(argv[1:])!r}; flags look like "
          "--name=value", ExitCode.BAD_INPUT)
  try:
    config = config_lib.from_flags()
    _load_tensorflow()  # After flag checks, so flag errors come fast.
    import trainer  # pylint: disable=g-import-not-at-top
    results = trainer.train(config)
  except TrainerError as e:
    _fail(f"error: {e}", e.exit_code)
  if results.get("status") == "interrupted":
    sys.exit(int(ExitCode.INTERRUPTED))


def run():
  """Console-script entry point (`trainer ...`)."""
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
