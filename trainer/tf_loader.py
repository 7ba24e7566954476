"""Importing TensorFlow without its start-up noise on the user's terminal."""

import contextlib
import os
import sys
import tempfile

from trainer import internals

_started_by = []  # What started TensorFlow's runtime, when a watched block did.


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
    import tensorflow as tf
    if probe_devices:
      tf.config.list_physical_devices()  # Does not fix the device split.
  return tf


def is_started() -> bool:
  """Whether TensorFlow's runtime has started in this process: from then on its
  devices cannot be split nor a MultiWorkerMirroredStrategy created."""
  return internals.runtime_started()


@contextlib.contextmanager
def watch_start(what: str):
  """Notes `what` (e.g. "task T's __post_init__") as what started TensorFlow's
  runtime, if the block does: `started_by` names it in the device errors."""
  before = is_started()
  try:
    yield
  finally:
    if not before and not _started_by and is_started():
      _started_by.append(what)


def started_by():
  """What started TensorFlow's runtime inside a `watch_start` block, or None."""
  return _started_by[0] if _started_by else None
