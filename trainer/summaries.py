"""What a person sees of a run: TensorBoard event files and progress lines."""

import os
import time

import tensorflow as tf


class Summaries:
  """Writes scalars under MODEL_DIR/train and MODEL_DIR/eval, eagerly.

  A disabled instance (non-chief workers, --summaries=false) writes nothing.
  """

  def __init__(self, model_dir: str, *, enabled: bool):
    self._model_dir = model_dir
    self._enabled = enabled
    self._writers = {}

  def _writer(self, split):
    if split not in self._writers:
      self._writers[split] = tf.summary.create_file_writer(
          os.path.join(self._model_dir, split) if split else self._model_dir)
    return self._writers[split]

  def scalars(self, split: str, step: int, values: dict):
    """Writes each {tag: value} at `step` under MODEL_DIR/split."""
    if not self._enabled:
      return
    with self._writer(split).as_default(step=step):
      for tag, value in values.items():
        tf.summary.scalar(tag, value)

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


def _duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
  """One line per loop call: step/total, loss, accuracy, examples/s, ETA."""

  def __init__(self, *, total_steps: int, enabled: bool, speak: bool = True):
    """Creates the reporter.

    Args:
      total_steps: the run's --train_steps, for the ETA.
      enabled: print a line per loop call.
      speak: print one-off messages (`say`); off on non-chief workers.
    """
    self._total = total_steps
    self._enabled = enabled
    self._speak = speak
    self._start = time.perf_counter()
    self._start_step = None

  def report(self, step: int, *, loss: float, accuracy: float,
             examples_per_second: float):
    if self._start_step is None:
      self._start_step, self._start = step, time.perf_counter()
      eta = "?"
    else:
      rate = (step - self._start_step) / max(time.perf_counter() - self._start, 1e-9)
      eta = _duration((self._total - step) / rate) if rate > 0 else "?"
    if self._enabled:
      print(f"step {step}/{self._total}  loss {loss:.4f}  accuracy {accuracy:.4f}  "
            f"{examples_per_second:,.0f} examples/s  ETA {eta}", flush=True)

  def say(self, message: str):
    if self._speak:
      print(message, flush=True)
