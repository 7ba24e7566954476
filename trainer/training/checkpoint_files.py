"""Checkpoints on disk: the `ckpt-N.index` files are the truth.

Whatever the `checkpoint` index file says (a missing or garbled one is rebuilt
from them), the checkpoints are the index files on disk. A checkpoint that cannot
be read is renamed `unreadable-*`, never deleted; `ckpt-N_temp/` left by a killed
save is removed. Model variables and seed generators are listed by position, not
by Keras' auto-generated names ("dense_3"), which depend on how many models the
process built before.
"""

import os
import re
import shutil
from typing import Optional

import tensorflow as tf

from trainer.errors import ConfigError
from trainer.outputs import run_dir
from trainer.training import replica_layers
from trainer.training.record import RunRecord

CHECKPOINT_SUBDIR = "checkpoints"
BEST_SUBDIR = "best"
QUARANTINE_PREFIX = "unreadable-"
PREFIX = "ckpt"
_INDEX = re.compile(rf"^{PREFIX}-(\d+)\.index$")
_TEMP = re.compile(rf"^{PREFIX}-\d+_temp$")  # A save that a kill interrupted.
_MODEL_KEY = re.compile(r"^model/(\d+)/\.ATTRIBUTES/VARIABLE_VALUE$")
_RECORD_KEY = "record/.ATTRIBUTES/VARIABLE_VALUE"


def rng_states(model) -> list:
  """The state variable of every SeedGenerator in `model`, in layer order."""
  return [generator.state for generator in replica_layers.seed_generators(model)]


def model_variables(model) -> list:
  """Every model weight, trainable or not, in the model's order."""
  return list(model.weights)


def path_of(directory: str, step: int) -> str:
  """The prefix of the checkpoint of `step` in `directory`."""
  return os.path.join(directory, f"{PREFIX}-{step}")


def checkpoint_steps(directory: str) -> list:
  """The steps of the checkpoints on disk (those with an index file), ascending."""
  try:
    names = os.listdir(directory)
  except (FileNotFoundError, NotADirectoryError):
    return []
  return sorted(int(m[1]) for m in map(_INDEX.match, names) if m)


def latest(directory: str) -> Optional[str]:
  """The newest checkpoint's prefix in `directory`, or None."""
  steps = checkpoint_steps(directory)
  return path_of(directory, steps[-1]) if steps else None


def remove_leftovers(directory: str):
  """Removes the `ckpt-N_temp/` folders of saves a kill interrupted."""
  if os.path.isdir(directory):
    for name in os.listdir(directory):
      if _TEMP.match(name):
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def quarantine(path: str):
  """Renames the files of the checkpoint at `path` to `unreadable-*`."""
  directory, prefix = os.path.dirname(path), os.path.basename(path) + "."
  for name in os.listdir(directory):
    if name.startswith(prefix):
      os.replace(os.path.join(directory, name),
                 os.path.join(directory, QUARANTINE_PREFIX + name))


def write_index(directory: str):
  """Makes the `checkpoint` index file list what is on disk."""
  steps = checkpoint_steps(directory)
  index = os.path.join(directory, "checkpoint")
  if not steps:
    if os.path.exists(index):
      os.replace(index, os.path.join(directory, QUARANTINE_PREFIX + "checkpoint"))
    return
  # The CheckpointState text format, written directly (TF's writer for it is
  # deprecated). Timestamps after last_preserved_timestamp make every listed
  # checkpoint one that rotation may delete, oldest first, as for its own saves.
  names = [f"{PREFIX}-{step}" for step in steps]
  if _listed(directory) == names:
    return  # Already true: leave the file (and a no-op rerun) untouched.
  times = [os.path.getmtime(path_of(directory, step) + ".index") for step in steps]
  lines = [f'model_checkpoint_path: "{names[-1]}"']
  lines += [f'all_model_checkpoint_paths: "{name}"' for name in names]
  lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in times]
  lines.append(f"last_preserved_timestamp: {min(times) - 1.0!r}")
  run_dir.write_atomic(index, "\n".join(lines) + "\n")


def _listed(directory: str):
  """The checkpoint names the index file lists (None if it is unreadable)."""
  try:
    state = tf.train.get_checkpoint_state(directory)
  except (tf.errors.OpError, ValueError):
    return None
  if state is None:
    return None
  return [os.path.basename(p) for p in state.all_model_checkpoint_paths]


def model_shapes(path: str) -> dict:
  """{position: shape} of the model weights a checkpoint holds (its index only).

  Raises:
    tf.errors.OpError: the index cannot be read.
  """
  return {int(m[1]): tuple(shape) for key, shape in tf.train.list_variables(path)
          if (m := _MODEL_KEY.match(key))}


def read_record(path: str) -> RunRecord:
  """The run record a checkpoint holds (empty if it has none).

  Raises:
    tf.errors.OpError, ValueError: the checkpoint cannot be read.
  """
  reader = tf.train.load_checkpoint(path)
  if not reader.has_tensor(_RECORD_KEY):
    return RunRecord()
  return RunRecord.from_json(reader.get_tensor(_RECORD_KEY).decode())


def find_checkpoint(path: str) -> str:
  """The checkpoint prefix `path` names: a ckpt-N prefix, a checkpoints directory
  or a run directory (its newest checkpoint).

  Raises:
    ConfigError: there is no checkpoint there.
  """
  if os.path.isfile(path + ".index"):
    return path
  for directory in (path, os.path.join(path, CHECKPOINT_SUBDIR)):
    found = latest(directory)
    if found:
      return found
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
    shapes = model_shapes(path)
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
