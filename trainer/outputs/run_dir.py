"""The model_dir on disk: claiming it (a lock), its flags record, atomic JSON files."""

import contextlib
import json
import os
import socket
import tempfile

from trainer import config as config_lib
from trainer.errors import LockedError, ModelDirError

LOCK_FILE = ".lock"
FLAGS_FILE = "flags.txt"
RESULTS_FILE = "results.json"


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
  write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: str):
  """The JSON object at `path`, or None if it is missing or unreadable."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


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
    raise ModelDirError(f"--model_dir={model_dir}: not writable ({e.strerror})") from None


@contextlib.contextmanager
def locked(model_dir: str, *, flag: str = "--model_dir"):
  """Holds MODEL_DIR/.lock (our pid) for the duration; takes over stale locks.

  Args:
    model_dir: the directory to claim.
    flag: the option that named it, for the error message.

  Raises:
    LockedError: a live process holds the lock.
  """
  path = os.path.join(model_dir, LOCK_FILE)
  for _ in range(2):  # Second try after removing a stale lock.
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
      holder = _read_lock(path)
      if holder and holder[1] == socket.gethostname() and not _pid_alive(holder[0]):
        os.remove(path)  # Its process is gone (killed): the lock is stale.
        continue
      who = f"pid {holder[0]} on {holder[1]}" if holder else "another process"
      raise LockedError(f"{flag}={model_dir}: in use by {who} (lock file {path}); "
                        f"wait for it or pick another {flag}") from None
    with os.fdopen(fd, "w") as f:
      f.write(f"{os.getpid()} {socket.gethostname()}\n")
    break
  try:
    yield
  finally:
    if _read_lock(path) == (os.getpid(), socket.gethostname()):
      os.remove(path)


def _read_lock(path):
  try:
    with open(path) as f:
      pid, host = f.read().split()
    return int(pid), host
  except (OSError, ValueError):
    return None


def check_layout(model_dir: str, config: config_lib.Config, task_layout=()):
  """Refuses flags that change the model or batch layout of an existing run.

  Args:
    model_dir: the run directory.
    config: this invocation's config.
    task_layout: the task's hyperparameters that are part of the layout.

  Raises:
    ModelDirError: listing each differing flag with the value the run was made with.
  """
  path = os.path.join(model_dir, FLAGS_FILE)
  if not os.path.exists(path):
    return
  recorded = config_lib.read_flagfile(path)
  differing = [f"--{name}={value} (the run has {recorded[name]})"
               for name, value in config.layout_flags(task_layout).items()
               if name in recorded and recorded[name] != value]
  if differing:
    raise ModelDirError(f"--model_dir={model_dir} holds a checkpoint made with other "
                        f"flags: {'; '.join(differing)}. Use a new --model_dir")


def write_flags(model_dir: str, config: config_lib.Config):
  """Saves MODEL_DIR/flags.txt, a flagfile that reproduces the run."""
  write_atomic(os.path.join(model_dir, FLAGS_FILE), "\n".join(config.to_flags()) + "\n")
