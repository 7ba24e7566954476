"""Saves a checkpoint every --checkpoint_every steps and at --train_steps."""

import tensorflow as tf

from trainer.actions.base import Action, LoopCall, due, next_multiple
from trainer.outputs import profile


class Checkpoint(Action):
  """Saves the run's state; flushes the events with it."""

  def __init__(self, *, checkpoints, summaries, every: int, train_steps: int):
    self._checkpoints = checkpoints
    self._summaries = summaries
    self._every = every
    self._train_steps = train_steps
    self._requested = False

  def request(self):
    """Saves after this loop call too (an action that changed the run's state
    between scheduled checkpoints, so a replay restores it)."""
    self._requested = True

  def next_stop(self, step):
    return next_multiple(step, self._every)

  def save(self):
    # Named in a profile's trace: its host time is not the loop's.
    with tf.profiler.experimental.Trace(profile.HOST_WORK[1]):
      self._checkpoints.save()
      self._summaries.flush()  # Events on disk reach at least the checkpoint's step.

  def __call__(self, call: LoopCall):
    if self._requested or due(call.step, self._every) or call.step >= self._train_steps:
      self._requested = False
      self.save()
