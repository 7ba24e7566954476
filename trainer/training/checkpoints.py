"""Checkpoints that hold everything a bit-exact resume needs.

A checkpoint holds every model variable (trainable or not), the optimizer (slots,
iterations, learning rate), the global step, the state of every Keras
SeedGenerator (dropout masks), the moving averages, a task's own state and the
run record (record.py). `tf.train.Checkpoint(model=keras_model)` tracks neither
Keras 3 model variables nor seed generators, so they are listed by position
(checkpoint_files.py).

A checkpoint that cannot be read at all is renamed `unreadable-*` and the previous
one is used; one that reads but does not fit the model being built is a mismatch
(ModelDirError, exit 2) and nothing is renamed. A run opened read-only (an
evaluation, a replay) never renames or rewrites anything, and retries when a
checkpoint is rotated away between listing and reading. Non-chief workers of a
multi-worker run save too (the save is collective) but into a scratch directory
of their own, which they remove at start (what a killed run left) and at close.
"""

import os
import shutil
import time

import tensorflow as tf

from trainer.errors import ModelDirError, one_line
from trainer.training import checkpoint_files as files
from trainer.training.record import RecordVariable, RunRecord
from trainer.training.trainer import Trainer

_VANISHED_RETRIES = 5


class Checkpoints:
  """Saves and restores a trainer's state and the run record, MODEL_DIR/checkpoints."""

  def __init__(self, *, model_dir: str, trainer: Trainer, keep: int,
               read_only: bool = False, say=print):
    """Creates the checkpoint of a run's state (nothing is read or written yet).

    Args:
      model_dir: the run directory.
      trainer: what trains.
      keep: checkpoints to keep (older ones are deleted after a save).
      read_only: open another process's run: never rename, rewrite or save.
      say: where warnings go (the run's console).
    """
    self.directory = os.path.join(model_dir, files.CHECKPOINT_SUBDIR)
    self.record = RunRecord()
    self._trainer = trainer
    self._record_variable = RecordVariable()
    core, extra = trainer.checkpoint_objects()
    extra = {"record": self._record_variable.variable, **extra}
    self.checkpoint = tf.train.Checkpoint(**core, **extra)
    # Restored separately: every core object must be in a checkpoint, while the
    # extras (the run record, averages, a task's state) may be absent from one
    # written before they existed.
    self._core_objects, self._extra_objects = core, extra
    self._keep = keep
    self._scratch = trainer.cluster.scratch_dir(self.directory)
    self._read_only = read_only
    self._say = say
    self._manager = None
    self._written = set()  # Steps saved by this invocation.

  @property
  def manager(self) -> tf.train.CheckpointManager:
    if self._manager is None:
      self._manager = tf.train.CheckpointManager(
          self.checkpoint, self._scratch or self.directory, max_to_keep=self._keep,
          checkpoint_name=files.PREFIX)
    return self._manager

  def exists(self) -> bool:
    return bool(files.checkpoint_steps(self.directory))

  def clean_leftovers(self):
    """Removes what a killed save left: `ckpt-N_temp/` (chief) or the scratch."""
    if self._read_only:
      return
    if self._scratch:
      shutil.rmtree(self._scratch, ignore_errors=True)
    else:
      files.remove_leftovers(self.directory)

  def restore(self, *, before: int = None):
    """Restores the newest readable checkpoint on disk, with the run record and
    the ledger's totals (on another replica count, the old totals move to the
    record's ledger_history).

    Args:
      before: only checkpoints of steps before this one (a replay).

    Returns:
      The restored global step, or None if there was no readable checkpoint.

    Raises:
      ModelDirError: the newest readable checkpoint does not fit the model.
    """
    for _ in range(_VANISHED_RETRIES):
      try:
        step = self._restore_newest(before)
        break
      except _Vanished:
        time.sleep(0.1)  # Rotated away by a live run: list again.
    else:
      raise ModelDirError(f"{self.directory}: checkpoints keep vanishing while being "
                          "read; is another process deleting them?")
    self.record = RunRecord() if step is None else self._record_variable.read()
    batches, examples = self.record.ledger_batches, self.record.ledger_examples
    if batches is not None and len(batches) != self._trainer.num_replicas:
      self.record.ledger_history.append({
          "until_step": step, "num_replicas": len(batches),
          "replica_batches": batches, "replica_examples": examples})
      batches = examples = None
    self._trainer.train_ledger.set_totals(batches, examples)
    return step

  def restore_exactly(self, step: int) -> bool:
    """Restores the checkpoint of `step` (a run opened read-only: an evaluator's);
    returns False where it was deleted (rotated by its live run) before or while
    it was read.

    Raises:
      ModelDirError: it does not fit the model, or cannot be read.
    """
    path = files.path_of(self.directory, step)
    try:
      problems = weight_problems(path, self._trainer.model)
      if problems:
        raise ModelDirError(f"checkpoint {path} does not fit the model being built: "
                            f"{'; '.join(problems)}")
      self._read(path)
    except (tf.errors.NotFoundError, FileNotFoundError):
      if not os.path.exists(path + ".index"):
        return False
      raise
    except tf.errors.OpError as e:
      if not os.path.exists(path + ".index"):
        return False  # Deleted while its data file was being read.
      raise ModelDirError(f"checkpoint {path} cannot be read ({one_line(e)})"
                          ) from None
    self.record = self._record_variable.read()
    return True

  def _read(self, path: str):
    """Restores the checkpoint at `path` through roots made for this read alone:
    a root keeps the restorations it defers (what the checkpoint holds that the
    root does not: the record, the averages), which would read this
    checkpoint's files again later, after a live run rotated them away. (Every
    object of the run's state exists before a restore, so its children defer
    nothing.)"""
    tf.train.Checkpoint(**self._core_objects).restore(
        path).assert_existing_objects_matched().expect_partial()
    tf.train.Checkpoint(**self._extra_objects).restore(path).expect_partial()

  def _restore_newest(self, before):
    steps = [s for s in files.checkpoint_steps(self.directory)
             if before is None or s < before]
    for step in reversed(steps):
      path = files.path_of(self.directory, step)
      try:
        problems = weight_problems(path, self._trainer.model)
        if problems:
          raise ModelDirError(
              f"checkpoint {path} does not fit the model being built: "
              f"{'; '.join(problems)}. The run was made with other flags or data; "
              "use those, or a new --model_dir")
        self._read(path)
      except tf.errors.NotFoundError:
        if not os.path.exists(path + ".index"):
          raise _Vanished() from None
        self._unreadable(path, "NotFoundError")  # Its data file is missing.
        continue
      except (AssertionError, ValueError) as e:
        # Unmatched objects or a shape that differs: a checkpoint of another
        # configuration, not a damaged one. Nothing is renamed.
        raise ModelDirError(f"checkpoint {path} does not fit the model being built "
                            f"({one_line(e)}). The run was made with other flags; "
                            "use those, or a new --model_dir") from None
      except (tf.errors.OpError, IndexError) as e:
        # IndexError: a truncated data file ("Read less bytes than requested").
        self._unreadable(path, type(e).__name__)
        continue
      self._write_index()
      return int(self._trainer.global_step.numpy())
    if steps:
      self._say("warning: no readable checkpoint; starting from step 0")
    self._write_index()
    return None

  def _unreadable(self, path: str, why: str):
    self._say(f"warning: checkpoint {path} is unreadable ({why}); falling back to "
              "the previous one")
    if not (self._read_only or self._scratch):
      files.quarantine(path)

  def _write_index(self):
    """Makes the `checkpoint` index file list what is on disk (chief only)."""
    self._manager = None  # Re-read the index on the next save.
    if not (self._read_only or self._scratch):
      files.write_index(self.directory)

  def _store_record(self):
    self.record.ledger_batches, self.record.ledger_examples = (
        self._trainer.train_ledger.totals())
    self.record.base_learning_rate = self._trainer.base_learning_rate
    self._record_variable.write(self.record)

  def save(self) -> str:
    """Saves at the current global step and returns the checkpoint path.

    Raises:
      ModelDirError: a checkpoint of this step exists that this invocation did
        not write (it is never overwritten).
    """
    if self._read_only:
      raise ModelDirError(f"{self.directory}: opened read-only; not saving")
    step = self._trainer.step
    path = files.path_of(self.directory, step)
    if step in self._written:
      return path
    if not self._scratch and step in files.checkpoint_steps(self.directory):
      if self.manager.latest_checkpoint == path:
        return path  # The one this run resumed from.
      raise ModelDirError(f"{path} exists and was not written by this run; "
                          "refusing to overwrite it")
    self._store_record()
    saved = self.manager.save(checkpoint_number=step)
    self._written.add(step)
    return saved

  def save_best(self) -> str:
    """Writes this step's state to checkpoints/best/ (never rotated away) and
    removes the best checkpoint it replaces."""
    directory = os.path.join(self._scratch or self.directory, files.BEST_SUBDIR)
    step = self._trainer.step
    self._store_record()
    path = self.checkpoint.write(files.path_of(directory, step))
    for old in files.checkpoint_steps(directory):
      if old != step:
        for name in os.listdir(directory):
          if name.startswith(f"{files.PREFIX}-{old}."):
            os.remove(os.path.join(directory, name))
    return path

  def best_path(self):
    """The best checkpoint's prefix, or None."""
    return files.latest(os.path.join(self.directory, files.BEST_SUBDIR))

  def close(self):
    if self._scratch:
      shutil.rmtree(self._scratch, ignore_errors=True)


class _Vanished(Exception):
  """A checkpoint listed a moment ago is gone (rotated by its live run)."""


def weight_problems(path: str, model) -> list:
  """How the model weights of the checkpoint at `path` (read from its index) differ
  from `model`'s: a count, and the first weight of another shape. Empty when they
  fit.

  Raises:
    tf.errors.OpError: the index cannot be read.
  """
  shapes = files.model_shapes(path)
  weights = files.model_variables(model)
  problems = []
  if len(shapes) != len(weights):
    problems.append(f"it has {len(shapes)} model weights, the model being built "
                    f"has {len(weights)}")
  for index, weight in enumerate(weights):
    if index in shapes and shapes[index] != tuple(weight.shape):
      problems.append(f"weight {index} ({weight.path}) is {shapes[index]} there, "
                      f"{tuple(weight.shape)} here")
      break
  return problems
