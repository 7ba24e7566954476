"""Checkpoints that hold everything a bit-exact resume needs, found on disk.

A checkpoint holds every model variable (trainable or not), the optimizer (slots,
iterations, learning rate), the global step, the state of every Keras
SeedGenerator (dropout masks) and the run's own record (see state.py). Model
variables and seed generators are listed explicitly by position:
`tf.train.Checkpoint(model=keras_model)` tracks neither in Keras 3.

The checkpoint files are the truth: `ckpt-N.index` files on disk are what exists,
whatever the `checkpoint` index file says (a missing or garbled index is rebuilt
from them). A checkpoint that cannot be read at all is renamed `unreadable-*` and
the previous one is used; one that reads but does not fit the model being built
is a mismatch (ModelDirError, exit 2) and nothing is renamed. An evaluator opens
a run read-only: it never renames or rewrites anything, and retries when a
checkpoint is rotated away between listing and reading.
"""

import os
import re
import shutil
import time

import tensorflow as tf

from trainer.errors import ConfigError, ModelDirError
from trainer.outputs import run_dir

CHECKPOINT_SUBDIR = "checkpoints"
BEST_SUBDIR = "best"
QUARANTINE_PREFIX = "unreadable-"
_PREFIX = "ckpt"
_INDEX = re.compile(rf"^{_PREFIX}-(\d+)\.index$")
_TEMP = re.compile(rf"^{_PREFIX}-\d+_temp$")  # A save that a kill interrupted.
_VANISHED_RETRIES = 5
_MODEL_KEY = re.compile(r"^model/(\d+)/\.ATTRIBUTES/VARIABLE_VALUE$")


# Both lists are keyed by position, not by Keras' auto-generated names ("dense_3"),
# which depend on how many models the process built before.
def rng_states(model) -> list:
  """The state variable of every SeedGenerator in `model`, in layer order."""
  return [generator.state
          for layer in model._flatten_layers(include_self=True)  # pylint: disable=protected-access
          for generator in getattr(layer, "_seed_generators", [])]


def model_variables(model) -> list:
  """Every model weight, trainable or not, in the model's order."""
  return list(model.weights)


def checkpoint_steps(directory: str) -> list:
  """The steps of the checkpoints on disk (those with an index file), ascending."""
  try:
    names = os.listdir(directory)
  except FileNotFoundError:
    return []
  return sorted(int(m[1]) for m in map(_INDEX.match, names) if m)


class Checkpoints:
  """Saves and restores a run's state under MODEL_DIR/checkpoints.

  Non-chief workers of a multi-worker run must save too (the save is collective)
  but into a scratch directory of their own, which they remove at start (what a
  killed run left) and at `close()`; they restore from the chief's directory.
  """

  def __init__(self, *, model_dir: str, model, optimizer, global_step, keep: int,
               extra: dict = None, scratch: str = None, read_only: bool = False):
    """Creates the checkpoint of a run's state (nothing is read or written yet).

    Args:
      model_dir: the run directory.
      model: the Keras model.
      optimizer: its optimizer (built).
      global_step: the int64 step variable.
      keep: checkpoints to keep (older ones are deleted after a save).
      extra: more {name: trackable} to checkpoint (the run's record).
      scratch: where a non-chief worker saves; None on the chief.
      read_only: open another process's run: never rename, rewrite or save.
    """
    self.directory = os.path.join(model_dir, CHECKPOINT_SUBDIR)
    self._model = model
    core = dict(model=model_variables(model), optimizer=optimizer,
                global_step=global_step, rng=rng_states(model))
    self.checkpoint = tf.train.Checkpoint(**core, **(extra or {}))
    # Restored separately: every core object must be in a checkpoint, while the
    # extras (the run record, averages, a task's state) may be absent from one
    # written before they existed.
    self._core = tf.train.Checkpoint(**core)
    self._extra = tf.train.Checkpoint(**(extra or {}))
    self._global_step = global_step
    self._keep = keep
    self._scratch = scratch
    self._read_only = read_only
    self._manager = None
    self._written = set()  # Steps saved by this invocation.

  @property
  def manager(self) -> tf.train.CheckpointManager:
    if self._manager is None:
      self._manager = tf.train.CheckpointManager(
          self.checkpoint, self._scratch or self.directory, max_to_keep=self._keep,
          checkpoint_name=_PREFIX)
    return self._manager

  def exists(self) -> bool:
    return bool(checkpoint_steps(self.directory))

  def clean_leftovers(self):
    """Removes what a killed save left: `ckpt-N_temp/` (chief) or the scratch."""
    if self._read_only:
      return
    if self._scratch:
      shutil.rmtree(self._scratch, ignore_errors=True)
      return
    if os.path.isdir(self.directory):
      for name in os.listdir(self.directory):
        if _TEMP.match(name):
          shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

  def _path(self, step: int) -> str:
    return os.path.join(self.directory, f"{_PREFIX}-{step}")

  def path_of(self, step: int) -> str:
    """The path (prefix) of the checkpoint of `step`."""
    return self._path(step)

  def check_fits(self, path: str):
    """Raises ModelDirError unless the checkpoint's model weights fit the model.

    Reads only the checkpoint's index. Raises tf.errors.OpError if it cannot.
    """
    shapes = {}
    for key, shape in tf.train.list_variables(path):
      match = _MODEL_KEY.match(key)
      if match:
        shapes[int(match[1])] = tuple(shape)
    weights = model_variables(self._model)
    problems = []
    if len(shapes) != len(weights):
      problems.append(f"it has {len(shapes)} model weights, the model being built "
                      f"has {len(weights)}")
    for index, weight in enumerate(weights):
      if index in shapes and shapes[index] != tuple(weight.shape):
        problems.append(f"weight {index} ({weight.path}) is {shapes[index]} there, "
                        f"{tuple(weight.shape)} here")
        break
    if problems:
      raise ModelDirError(
          f"checkpoint {path} does not fit the model being built: "
          f"{'; '.join(problems)}. The run was made with other flags or data; use "
          "those, or a new --model_dir")

  def restore_latest(self, *, before: int = None):
    """Restores the newest readable checkpoint on disk.

    Args:
      before: only checkpoints of steps before this one (a replay).

    Returns:
      The restored global step, or None if there was no readable checkpoint.

    Raises:
      ModelDirError: the newest readable checkpoint does not fit the model.
    """
    for _ in range(_VANISHED_RETRIES):
      try:
        return self._restore_newest(before)
      except _Vanished:
        time.sleep(0.1)  # Rotated away by a live run: list again.
    raise ModelDirError(f"{self.directory}: checkpoints keep vanishing while being "
                        "read; is another process deleting them?")

  def _restore_newest(self, before):
    steps = [s for s in checkpoint_steps(self.directory)
             if before is None or s < before]
    for index in range(len(steps) - 1, -1, -1):
      path = self._path(steps[index])
      try:
        self.check_fits(path)
        self._core.restore(path).assert_existing_objects_matched().expect_partial()
        self._extra.restore(path).expect_partial()
      except tf.errors.NotFoundError:
        if not os.path.exists(path + ".index"):
          raise _Vanished() from None
        self._unreadable(path, "NotFoundError")  # Its data file is missing.
        continue
      except (AssertionError, ValueError) as e:
        # Unmatched objects or a shape that differs: a checkpoint of another
        # configuration, not a damaged one. Nothing is renamed.
        raise ModelDirError(f"checkpoint {path} does not fit the model being built "
                            f"({str(e).splitlines()[0][:200]}). The run was made "
                            "with other flags; use those, or a new --model_dir"
                            ) from None
      except (tf.errors.OpError, IndexError) as e:
        # IndexError: a truncated data file ("Read less bytes than requested").
        self._unreadable(path, type(e).__name__)
        continue
      self._write_index()
      return int(self._global_step.numpy())
    if steps:
      print("warning: no readable checkpoint; starting from step 0", flush=True)
    self._write_index()
    return None

  def _unreadable(self, path: str, why: str):
    print(f"warning: checkpoint {path} is unreadable ({why}); falling back to the "
          "previous one", flush=True)
    if self._read_only or self._scratch:
      return
    prefix = os.path.basename(path) + "."
    for name in os.listdir(self.directory):
      if name.startswith(prefix):
        os.replace(os.path.join(self.directory, name),
                   os.path.join(self.directory, QUARANTINE_PREFIX + name))

  def _write_index(self):
    """Makes the `checkpoint` index file list what is on disk (chief only)."""
    self._manager = None  # Re-read the index on the next save.
    if self._read_only or self._scratch:
      return
    steps = checkpoint_steps(self.directory)
    index = os.path.join(self.directory, "checkpoint")
    if not steps:
      if os.path.exists(index):
        os.replace(index, os.path.join(self.directory, QUARANTINE_PREFIX +
                                       "checkpoint"))
      return
    # The CheckpointState text format, written directly (TF's writer for it is
    # deprecated). Timestamps after last_preserved_timestamp make every listed
    # checkpoint one that rotation may delete, oldest first, as for its own saves.
    names = [f"{_PREFIX}-{step}" for step in steps]
    if self._listed() == names:
      return  # Already true: leave the file (and a no-op rerun) untouched.
    times = [os.path.getmtime(self._path(step) + ".index") for step in steps]
    lines = [f'model_checkpoint_path: "{names[-1]}"']
    lines += [f'all_model_checkpoint_paths: "{name}"' for name in names]
    lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in times]
    lines.append(f"last_preserved_timestamp: {min(times) - 1.0!r}")
    run_dir.write_atomic(index, "\n".join(lines) + "\n")

  def _listed(self) -> list:
    """The checkpoint names the index file lists (None if it is unreadable)."""
    try:
      state = tf.train.get_checkpoint_state(self.directory)
    except (tf.errors.OpError, ValueError):
      return None
    if state is None:
      return None
    return [os.path.basename(p) for p in state.all_model_checkpoint_paths]

  def save(self) -> str:
    """Saves at the current global step and returns the checkpoint path.

    Raises:
      ModelDirError: a checkpoint of this step exists that this invocation did
        not write (it is never overwritten).
    """
    if self._read_only:
      raise ModelDirError(f"{self.directory}: opened read-only; not saving")
    step = int(self._global_step.numpy())
    if step in self._written:
      return self._path(step)
    if not self._scratch and step in checkpoint_steps(self.directory):
      if self.manager.latest_checkpoint == self._path(step):
        return self._path(step)  # The one this run resumed from.
      raise ModelDirError(f"{self._path(step)} exists and was not written by this "
                          "run; refusing to overwrite it")
    path = self.manager.save(checkpoint_number=step)
    self._written.add(step)
    return path

  def save_best(self) -> str:
    """Writes this step's state to checkpoints/best/ (never rotated away) and
    removes the best checkpoint it replaces."""
    directory = os.path.join(self._scratch or self.directory, BEST_SUBDIR)
    step = int(self._global_step.numpy())
    path = self.checkpoint.write(os.path.join(directory, f"{_PREFIX}-{step}"))
    for old in checkpoint_steps(directory):
      if old != step:
        for name in os.listdir(directory):
          if name.startswith(f"{_PREFIX}-{old}."):
            os.remove(os.path.join(directory, name))
    return path

  def best_path(self):
    """The best checkpoint's prefix, or None."""
    directory = os.path.join(self.directory, BEST_SUBDIR)
    steps = checkpoint_steps(directory)
    return os.path.join(directory, f"{_PREFIX}-{steps[-1]}") if steps else None

  def close(self):
    if self._scratch:
      shutil.rmtree(self._scratch, ignore_errors=True)


class _Vanished(Exception):
  """A checkpoint listed a moment ago is gone (rotated by its live run)."""


def find_checkpoint(path: str) -> str:
  """The checkpoint prefix `path` names: a ckpt-N prefix, a checkpoints directory
  or a run directory (its newest checkpoint).

  Raises:
    ConfigError: there is no checkpoint there.
  """
  if os.path.isfile(path + ".index"):
    return path
  for directory in (path, os.path.join(path, CHECKPOINT_SUBDIR)):
    steps = checkpoint_steps(directory)
    if steps:
      return os.path.join(directory, f"{_PREFIX}-{steps[-1]}")
  raise ConfigError(f"--init_checkpoint={path}: no checkpoint there; give a run "
                    "directory, its checkpoints/ directory or a ckpt-N prefix")


def warm_start(model, path: str) -> tuple:
  """Loads the model weights of checkpoint `path` that fit, by position and shape.

  Returns:
    (names of the restored weights, [(name, why not)] of the others).

  Raises:
    ConfigError: the checkpoint cannot be read, or none of its weights fit.
  """
  try:
    reader = tf.train.load_checkpoint(path)
    shapes = {int(m[1]): tuple(shape) for key, shape in tf.train.list_variables(path)
              if (m := _MODEL_KEY.match(key))}
  except (tf.errors.OpError, ValueError) as e:
    raise ConfigError(f"--init_checkpoint={path}: unreadable ({type(e).__name__})"
                      ) from None
  restored, skipped = [], []
  for index, weight in enumerate(model_variables(model)):
    if index not in shapes:
      skipped.append((weight.path, "absent there"))
    elif shapes[index] != tuple(weight.shape):
      skipped.append((weight.path, f"{shapes[index]} there, {tuple(weight.shape)} "
                                   "here"))
    else:
      weight.assign(reader.get_tensor(f"model/{index}/.ATTRIBUTES/VARIABLE_VALUE"))
      restored.append(weight.path)
  if not restored:
    raise ConfigError(f"--init_checkpoint={path}: none of its {len(shapes)} model "
                      f"weights fit the model being built (first: "
                      f"{skipped[0][0]}: {skipped[0][1]})")
  return restored, skipped
