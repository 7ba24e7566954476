"""Checkpoints that hold everything a bit-exact resume needs, restored with fallback.

A checkpoint holds every model variable (trainable or not), the optimizer (slots,
iterations, learning rate), the global step and the state of every Keras
SeedGenerator (dropout masks). Model variables and seed generators are listed
explicitly by path: `tf.train.Checkpoint(model=keras_model)` tracks neither in
Keras 3 (weights were reachable only through the optimizer, non-trainable ones not
at all). The input needs no
state: its order is a function of (seed, step).
"""

import os
import shutil
import tempfile

import tensorflow as tf
from absl import logging

CHECKPOINT_SUBDIR = "checkpoints"
QUARANTINE_PREFIX = "unreadable-"


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


class Checkpoints:
  """Saves and restores a run's state under MODEL_DIR/checkpoints.

  Non-chief workers of a multi-worker run must save too (the save is collective)
  but into a temporary directory that `close()` removes; they restore from the
  chief's directory, which the cluster shares.
  """

  def __init__(self, *, model_dir: str, model, optimizer, global_step, keep: int,
               is_chief: bool = True):
    self.directory = os.path.join(model_dir, CHECKPOINT_SUBDIR)
    self.checkpoint = tf.train.Checkpoint(model=model_variables(model),
                                          optimizer=optimizer,
                                          global_step=global_step,
                                          rng=rng_states(model))
    self._global_step = global_step
    self._keep = keep
    self._scratch = None if is_chief else tempfile.mkdtemp(prefix="trainer-worker-")
    self._manager = None

  @property
  def manager(self) -> tf.train.CheckpointManager:
    if self._manager is None:
      self._manager = tf.train.CheckpointManager(
          self.checkpoint, self._scratch or self.directory, max_to_keep=self._keep)
    return self._manager

  def exists(self) -> bool:
    return bool(tf.train.get_checkpoint_state(self.directory))

  def restore_latest(self):
    """Restores the newest readable checkpoint.

    An unreadable one (truncated, corrupted) is reported, renamed out of the way
    (never deleted) and the previous one is tried.

    Returns:
      The restored global step, or None if there was no checkpoint.
    """
    state = tf.train.get_checkpoint_state(self.directory)
    if not state:
      return None
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    for index in range(len(paths) - 1, -1, -1):
      path = paths[index]
      try:
        self.checkpoint.restore(path).assert_existing_objects_matched()
      except (tf.errors.OpError, ValueError, AssertionError, IndexError) as e:
        # IndexError: a truncated data file ("Read less bytes than requested").
        logging.warning("checkpoint %s is unreadable (%s); trying the previous one",
                        path, type(e).__name__)
        print(f"warning: checkpoint {path} is unreadable ({type(e).__name__}); "
              "falling back to the previous one", flush=True)
        if self._scratch is None:
          self._quarantine(path, paths[:index])
        continue
      return int(self._global_step.numpy())
    print("warning: no readable checkpoint; starting from step 0", flush=True)
    return None

  def _quarantine(self, bad_path, good_paths):
    """Renames a bad checkpoint's files aside and drops it from the state file."""
    for name in os.listdir(self.directory):
      if name.startswith(os.path.basename(bad_path) + "."):
        os.replace(os.path.join(self.directory, name),
                   os.path.join(self.directory, QUARANTINE_PREFIX + name))
    if good_paths:
      tf.compat.v1.train.update_checkpoint_state(
          self.directory, good_paths[-1], all_model_checkpoint_paths=good_paths)
    else:
      os.replace(os.path.join(self.directory, "checkpoint"),
                 os.path.join(self.directory, QUARANTINE_PREFIX + "checkpoint"))
    self._manager = None  # Re-read the state file on the next save.

  def save(self) -> str:
    """Saves at the current global step and returns the checkpoint path."""
    step = int(self._global_step.numpy())
    if self.manager.latest_checkpoint and self.manager.latest_checkpoint.endswith(
        f"-{step}"):
      return self.manager.latest_checkpoint
    return self.manager.save(checkpoint_number=step)

  def close(self):
    if self._scratch:
      shutil.rmtree(self._scratch, ignore_errors=True)
