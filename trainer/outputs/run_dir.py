"""The model_dir on disk: claiming it (a lock), its flags record, atomic JSON files."""

import contextlib
import fcntl
import json
import math
import os
import socket
import tempfile

from trainer.errors import LockedError, ModelDirError

LOCK_FILE = ".lock"
FLAGS_FILE = "flags.txt"
RESULTS_FILE = "results.json"
# A diverged run's report (training/divergence.py).
DIVERGENCE_FILE = "divergence.json"


def write_atomic(path: str, text: str):
  """Writes `text` to `path` so a reader (or a crash) never sees half a file."""
  directory = os.path.dirname(path) or "."
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; others may read a run.
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def write_json(path: str, data: dict):
  """Writes `data` as JSON, atomically; a NaN or infinite number (a metric that
  was not a number) as null, since JSON has no such numbers."""
  write_atomic(path, json.dumps(_finite(data), indent=2, sort_keys=True,
                                allow_nan=False) + "\n")


def _finite(value):
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite(v) for v in value]
  return value


def read_json(path: str):
  """The JSON object at `path`, or None if it is missing or unreadable."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def ensure_writable(model_dir: str):
  """Creates model_dir if needed and checks that files can be written there.

  Raises:
    ModelDirError: the directory cannot be created or written.
  """
  try:
    os.makedirs(model_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=model_dir, prefix=".probe-"):
      pass
  except OSError as e:
    raise ModelDirError(f"--model_dir={model_dir}: not writable "
                        f"({e.strerror})") from None


def check_writable_target(path: str, *, flag: str):
  """Checks that a directory can be created (or replaced) at `path`.

  Raises:
    ModelDirError: `path` is a file, or its nearest existing parent is not a
      writable directory.
  """
  if os.path.exists(path) and not os.path.isdir(path):
    raise ModelDirError(f"{flag}={path}: is a file, not a directory")
  parent = os.path.abspath(path)
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  target = path if os.path.isdir(path) else parent
  if not os.path.isdir(parent) or not os.access(target, os.W_OK | os.X_OK):
    raise ModelDirError(f"{flag}={path}: not writable ({target} does not accept new "
                        "files)")


@contextlib.contextmanager
def locked(model_dir: str, *, flag: str = "--model_dir"):
  """Holds an exclusive lock on MODEL_DIR/.lock for the duration.

  The lock is an `flock` on the file, which the kernel releases when its holder
  dies however it dies, so a lock left by a killed run (even an empty or garbled
  file, as a SIGKILL between creating and writing it leaves) is free. The file
  holds the holder's pid and host, for the error message only.

  Args:
    model_dir: the directory to claim.
    flag: the option that named it, for the error message.

  Raises:
    LockedError: a live process holds the lock.
  """
  path = os.path.join(model_dir, LOCK_FILE)
  while True:
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:  # A directory, or a file we may not write.
      raise ModelDirError(f"{flag}={model_dir}: cannot use {path} as its lock file "
                          f"({e.strerror}); remove it") from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      os.close(fd)
      holder = _read_lock(path)
      who = f"pid {holder[0]} on {holder[1]}" if holder else "another process"
      raise LockedError(f"{flag}={model_dir}: in use by {who} (lock file {path}); "
                        f"wait for it or pick another {flag}") from None
    try:
      same_file = os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
      same_file = False
    if same_file:
      break
    os.close(fd)  # The holder removed the file as we opened it: lock the new one.
  try:
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    yield
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)  # Still holding the lock, so nobody else uses this file.
    os.close(fd)


def _read_lock(path):
  try:
    with open(path) as f:
      pid, host = f.read().split()
    return int(pid), host
  except (OSError, ValueError):
    return None


def write_flags(model_dir: str, flag_lines: list, *, comments=()):
  """Saves MODEL_DIR/flags.txt, a flagfile that reproduces the run, with
  `comments` as its last lines (`# ...`, which a flagfile skips)."""
  lines = [*flag_lines, *(f"# {comment}" for comment in comments)]
  write_atomic(os.path.join(model_dir, FLAGS_FILE), "\n".join(lines) + "\n")


def missing_parents(path: str) -> list:
  """`path` and its ancestors that do not exist yet, deepest first: what
  `os.makedirs(path)` would create."""
  missing = []
  path = os.path.abspath(path)
  while not os.path.exists(path):
    missing.append(path)
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return missing


def remove_if_empty(directories: list):
  """Removes each of `directories` (deepest first) that is an empty directory;
  stops at the first that is not: a run that refused before writing anything
  leaves no directory behind."""
  for directory in directories:
    try:
      os.rmdir(directory)
    except OSError:
      return
