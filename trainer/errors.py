"""Errors a user can cause, each with the process exit code the CLI returns.

`trainer.main` prints `str(error)` as one line and exits with `error.exit_code`;
anything that is not a `TrainerError` is a bug and keeps its traceback.
"""

import enum


class ExitCode(enum.IntEnum):
  """Process exit codes of `python -m trainer.main` (listed in the README)."""
  OK = 0
  INTERNAL = 1  # A bug: an unexpected exception, printed with its traceback.
  BAD_INPUT = 2  # Flags, data files, model_dir or checkpoint do not fit.
  DIVERGED = 3  # Non-finite loss or gradients; the last good checkpoint is kept.
  INTERRUPTED = 4  # SIGTERM/SIGINT: checkpoint saved, rerun to resume.
  LOCKED = 5  # Another live run holds the model_dir.
  REPLICA_BATCH = 6  # A replica did not get exactly one full batch per step.
  HUNG = 7  # A phase ran past --hang_timeout or a peer was lost: see hang-*.txt.


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
