"""Importing TensorFlow without its start-up noise on the user's terminal."""

import contextlib
import os
import sys
import tempfile


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


def load_tensorflow(*, probe_devices: bool = True):
  """Imports TensorFlow quietly (its start-up lines appear only if it fails).

  Args:
    probe_devices: also list the physical devices (CUDA's start-up lines come
      then); False in a process that forks afterwards (the sweep's fork server),
      since a forked child cannot use a CUDA driver its parent started.

  Returns:
    The tensorflow module.
  """
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # Python-side info lines.
  with _native_stderr_captured():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if probe_devices:
      tf.config.list_physical_devices()  # Does not fix the device split.
  return tf
