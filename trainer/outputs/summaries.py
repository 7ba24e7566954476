"""TensorBoard event files of a run: scalars, text and hparams."""

import os

import tensorflow as tf

_MAX_QUEUE = 1000  # Events buffered before a forced flush.
_FLUSH_MILLIS = 5000


class Summaries:
  """Writes scalars under MODEL_DIR/train and MODEL_DIR/eval, buffered.

  A disabled instance (non-chief workers, --summaries=false) writes nothing.
  """

  def __init__(self, model_dir: str, *, enabled: bool):
    self._model_dir = model_dir
    self._enabled = enabled
    self._writers = {}
    self._scalar_writers = {}  # (split, tags) -> tf.function writing them.

  def _writer(self, split):
    if split not in self._writers:
      # TF's default queue (10 events) makes nearly every loop call flush and sync
      # the file, milliseconds per call; buffer instead and flush every few
      # seconds (TensorBoard still sees a live run), at checkpoints and at close.
      self._writers[split] = tf.summary.create_file_writer(
          os.path.join(self._model_dir, split) if split else self._model_dir,
          max_queue=_MAX_QUEUE, flush_millis=_FLUSH_MILLIS)
    return self._writers[split]

  def scalars(self, split: str, step: int, values: dict):
    """Writes each {tag: value} at `step` under MODEL_DIR/split.

    One compiled call per tag set: written eagerly, a dozen scalars cost dozens of
    eager ops per loop call, a visible share of a short call.
    """
    if not self._enabled:
      return
    tags = tuple(values)
    write = self._scalar_writers.get((split, tags))
    if write is None:
      writer = self._writer(split)

      @tf.function
      def write(step, vector):
        with writer.as_default(step=step):
          for index, tag in enumerate(tags):
            tf.summary.scalar(tag, vector[index])

      self._scalar_writers[(split, tags)] = write
    write(tf.constant(step, tf.int64),
          tf.constant([float(v) for v in values.values()], tf.float32))

  def text(self, split: str, step: int, tag: str, text: str):
    if not self._enabled:
      return
    with self._writer(split).as_default(step=step):
      tf.summary.text(tag, text)

  def hparams(self, values: dict):
    """Records this run's hyperparameters (shown in TensorBoard's HParams tab)."""
    if not self._enabled or not values:
      return
    from tensorboard.plugins.hparams import api as hp  # Only needed by sweeps.
    with self._writer("").as_default(step=0):
      hp.hparams(values, trial_id=os.path.basename(os.path.normpath(self._model_dir)))

  def flush(self):
    for writer in self._writers.values():
      writer.flush()

  def close(self):
    for writer in self._writers.values():
      writer.close()


def markdown_flags(flag_lines) -> str:
  """The effective flags as a Markdown code block, for a text summary."""
  return "```\n" + "\n".join(flag_lines) + "\n```"
