"""How a run ends: its status, the process exit code, and the errors a user causes.

`trainer.main` prints `str(error)` as one line and exits with `error.exit_code`;
user code that raises (a task method, an action) is a `UserCodeError`: its own
traceback, then one line naming the method, exit 1. Anything else is a bug and
keeps its traceback.
"""

import contextlib
import enum
import errno
import re

from trainer import internals

_MAX_LINE = 300  # Characters of a quoted cause in a one-line error.


class ExitCode(enum.IntEnum):
  """Process exit codes of `python -m trainer.main` (listed in the README)."""
  OK = 0
  INTERNAL = 1  # A bug, or user code that raised: its traceback is printed.
  BAD_INPUT = 2  # Flags, data files, model_dir or checkpoint do not fit.
  DIVERGED = 3  # Non-finite loss or gradients; the last good checkpoint is kept.
  INTERRUPTED = 4  # SIGTERM/SIGINT: checkpoint saved, rerun to resume.
  LOCKED = 5  # Another live run holds the model_dir.
  REPLICA_BATCH = 6  # A replica did not get exactly one full batch per step.
  HUNG = 7  # Past --hang_timeout, or a peer lost or failed: hang-*.txt, last line.
  UNEXPORTED = 8  # Trained, but the export failed: a rerun retries the export.
  NO_SPACE = 9  # The disk filled up: every earlier checkpoint is kept.


class RunStatus(str, enum.Enum):
  """A run's status, as results.json and the sweeps spell it."""
  COMPLETED = "completed"  # Reached --train_steps (or was already there).
  EARLY_STOPPED = "early_stopped"  # --best_metric stopped improving.
  STOPPED = "stopped"  # An action returned trainer.STOP.
  TIME_LIMIT = "time_limit"  # --max_time: a checkpoint, rerun to resume.
  INTERRUPTED = "interrupted"  # SIGTERM/SIGINT: a checkpoint, rerun to resume.
  REQUEUED = "requeued"  # --requeue_signal: a checkpoint, the SLURM job requeued.
  DIVERGED = "diverged"  # Non-finite loss or gradients.
  HUNG = "hung"  # A phase made no progress, or a peer was lost.
  UNEXPORTED = "unexported"  # Trained; the export failed.
  FAILED = "failed"  # User code raised, or the disk filled up.
  EVALUATED = "evaluated"  # --mode=eval evaluated a checkpoint.

  def __str__(self) -> str:
    return self.value

  @property
  def exit_code(self) -> ExitCode:
    """The process exit code of a run that ends with this status."""
    return _EXIT_CODES[self]

  @property
  def finished(self) -> bool:
    """Whether the run is done: a rerun changes nothing."""
    return self in (RunStatus.COMPLETED, RunStatus.EARLY_STOPPED, RunStatus.STOPPED)


_EXIT_CODES = {
    RunStatus.COMPLETED: ExitCode.OK,
    RunStatus.EARLY_STOPPED: ExitCode.OK,
    RunStatus.STOPPED: ExitCode.OK,
    RunStatus.TIME_LIMIT: ExitCode.OK,
    RunStatus.EVALUATED: ExitCode.OK,
    RunStatus.INTERRUPTED: ExitCode.INTERRUPTED,
    RunStatus.REQUEUED: ExitCode.INTERRUPTED,
    RunStatus.DIVERGED: ExitCode.DIVERGED,
    RunStatus.HUNG: ExitCode.HUNG,
    RunStatus.UNEXPORTED: ExitCode.UNEXPORTED,
    RunStatus.FAILED: ExitCode.INTERNAL,
}


def one_line(cause, *, limit: int = _MAX_LINE) -> str:
  """The first line of an error or text, without TensorFlow's op decorations,
  shortened to `limit` characters (None: as long as it is) to fit in a one-line
  error."""
  message = internals.keras_call_message(
      getattr(cause, "message", None) or str(cause))
  lines = [part.strip() for part in message.splitlines() if part.strip()]
  if len(lines) > 1 and lines[0] == "Graph execution error:":
    # Then "Detected at node N defined at", the Python frames of the node and
    # the op's own message.
    told = [line for line in lines[1:] if not line.startswith(
        ("Detected at node", 'File "', "<stack traces unavailable>"))]
    message = told[0] if told else lines[0]
  elif len(lines) > 1 and lines[0].endswith("in user code:"):
    # AutoGraph's "in user code:" frames, then the user's own error last (its
    # type is the error's own, which the caller names).
    message = re.sub(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt): ", "",
                     lines[-1])
  message = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", message)
  message = re.sub(r"\s*\[\[\{\{node [^]]*\]\]", "", message)
  message = re.sub(r"\s*\[Op:[^]]*\]( name: .*)?", "", message)
  line = next((part.strip() for part in message.splitlines() if part.strip()), "")
  return line if limit is None or len(line) <= limit else line[:limit - 3] + "..."


class TrainerError(Exception):
  """Base class of errors that are the user's to fix, not bugs."""
  exit_code = ExitCode.BAD_INPUT


class ConfigError(TrainerError):
  """A flag or Config field has a value that cannot work."""


class DataError(TrainerError):
  """A data set is missing, malformed or too small."""


class ModelDirError(TrainerError):
  """The model_dir cannot be used (unwritable, or its checkpoint does not fit)."""


class LockedError(TrainerError):
  """Another live process trains in the same model_dir."""
  exit_code = ExitCode.LOCKED


class DivergedError(TrainerError):
  """The loss or the gradients became NaN or infinite."""
  exit_code = ExitCode.DIVERGED


class ReplicaBatchError(TrainerError):
  """A replica got a batch of the wrong size, or a wrong number of batches."""
  exit_code = ExitCode.REPLICA_BATCH


class TaskError(TrainerError):
  """A task's model, loss or metrics do not fit what the framework needs."""


class ExportError(TrainerError):
  """Training finished but the export failed; a rerun retries the export."""
  exit_code = ExitCode.UNEXPORTED


class NoSpaceError(TrainerError):
  """The disk filled up while writing a file; earlier checkpoints are kept."""
  exit_code = ExitCode.NO_SPACE


class UserCodeError(TrainerError):
  """User code (a task method or an action) raised: the CLI prints that code's
  traceback (the `__cause__`), then this one line."""
  exit_code = ExitCode.INTERNAL

  def __init__(self, method: str, cause: BaseException):
    super().__init__(f"{method} raised {type(cause).__name__}: {one_line(cause)}")
    self.method = method


def no_space(error: BaseException):
  """A NoSpaceError naming the file, when `error` is a full disk's (an OSError
  with ENOSPC, or TensorFlow's "No space left on device"), else None."""
  if isinstance(error, OSError) and error.errno == errno.ENOSPC:
    where = error.filename or "a file"
  elif "No space left on device" in str(error):
    found = re.search(r"(\S+); No space left on device", str(error))
    where = found[1] if found else "a file"
    where = re.sub(r"_temp/.*$", "", where)  # A checkpoint's temporary part file.
  else:
    return None
  return NoSpaceError(f"{where}: no space left on device; every checkpoint written "
                      "before it is kept: free some space and rerun the same command "
                      "to resume")


@contextlib.contextmanager
def disk_full_is_one_line():
  """Turns a full disk's error raised in the block into its NoSpaceError."""
  try:
    yield
  except Exception as e:  # noqa: BLE001 (re-raised unless the disk is full)
    full = no_space(e)
    if full is None:
      raise
    raise full from None


@contextlib.contextmanager
def user_code(method: str):
  """Turns an exception raised in the block (a call of the user's `method`, e.g.
  "Task.prepare") into a UserCodeError naming it; the framework's own errors
  (TrainerError) pass through."""
  try:
    yield
  except TrainerError:
    raise
  except (Exception, SystemExit) as e:  # noqa: BLE001 (the user's code: any
    # error is theirs, and sys.exit() in a task method its failure).
    raise UserCodeError(method, e) from e
