"""TensorBoard event files of a run: scalars, text, histograms, images and hparams.

Events are written by TensorBoard's own Python event-file writer, which serializes
on the caller's thread and writes from a background thread: a loop call's dozen
scalars become one event record in 0.06 ms of the loop's time. (Through a compiled
`tf.summary` function they took 1.3 ms per call: 8% of a 20-step call of the
default model on 2 cores.)
One writer per directory, for every kind of summary: TensorBoard reads a directory's
event files one after another, so two files written side by side lose events.
"""

import os
import time

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
from tensorboard.plugins.histogram import summary_v2 as histogram_summary
from tensorboard.plugins.image import metadata as image_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.plugins.text import summary_v2 as text_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

_MAX_QUEUE = 1000  # Events buffered before a forced flush.
_FLUSH_SECONDS = 5
_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None,
                                                           description=None)


class Summaries:
  """Writes scalars under MODEL_DIR/train and MODEL_DIR/eval, buffered.

  A disabled instance (non-chief workers, --summaries=false) writes nothing.
  """

  def __init__(self, model_dir: str, *, enabled: bool):
    self._model_dir = model_dir
    self._enabled = enabled
    self._writers = {}

  @property
  def enabled(self) -> bool:
    """Whether this instance writes (the chief, with --summaries)."""
    return self._enabled

  def _write(self, split: str, step: int, summary: summary_pb2.Summary):
    if split not in self._writers:
      # Buffered, flushed every few seconds (TensorBoard still sees a live run),
      # at checkpoints and at close: a flush per loop call would sync the file.
      self._writers[split] = EventFileWriter(
          os.path.join(self._model_dir, split) if split else self._model_dir,
          max_queue_size=_MAX_QUEUE, flush_secs=_FLUSH_SECONDS)
    self._writers[split].add_event(
        event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

  def scalars(self, split: str, step: int, values: dict):
    """Writes each {tag: value} at `step` under MODEL_DIR/split (one event); a
    value that is a list (a metric such as a confusion matrix) as a text table."""
    if not self._enabled:
      return
    summary = summary_pb2.Summary()
    for tag, value in values.items():
      if isinstance(value, list):
        self.text(split, step, tag, _table(value))
        continue
      # What tf.summary.scalar writes: a float32 scalar tensor of the scalars plugin.
      summary.value.add(tag=tag, metadata=_SCALAR_METADATA,
                        tensor=tensor_pb2.TensorProto(
          dtype=types_pb2.DT_FLOAT, float_val=[float(value)]))
    self._write(split, step, summary)

  def text(self, split: str, step: int, tag: str, text: str):
    if self._enabled:
      self._write(split, step, text_summary.text_pb(tag, text))

  def histogram(self, split: str, step: int, tag: str, values):
    """A histogram of `values` (TensorBoard's Histograms and Distributions tabs)."""
    if self._enabled:
      self._write(split, step, histogram_summary.histogram_pb(
          tag, np.asarray(values, np.float64).ravel()))

  def image(self, split: str, step: int, tag: str, images):
    """Images (TensorBoard's Images tab): [k, height, width, channels] or [height,
    width, channels], uint8 or floats in [0, 1]."""
    if not self._enabled:
      return
    import tensorflow as tf  # PNG encoding; a run has imported it already.
    images = np.asarray(images)
    images = images[None] if images.ndim == 3 else images
    if images.dtype != np.uint8:
      images = (np.clip(images, 0.0, 1.0) * 255).round().astype(np.uint8)
    height, width = images.shape[1:3]
    encoded = [tf.io.encode_png(image).numpy() for image in images]
    summary = summary_pb2.Summary()
    summary.value.add(
        tag=tag, metadata=image_metadata.create_summary_metadata(
            display_name=None, description=None, converted_to_tensor=True),
        tensor=tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING, tensor_shape=None,
            string_val=[str(width).encode(), str(height).encode(), *encoded]))
    summary.value[0].tensor.tensor_shape.dim.add(size=2 + len(encoded))
    self._write(split, step, summary)

  def at(self, split: str, step: int) -> "StepSummaries":
    """A handle that writes to `split` at `step` (an action's `summaries`)."""
    return StepSummaries(self, split, step)

  def layout(self, split: str, charts: dict):
    """A custom-scalars layout (TensorBoard's Custom Scalars tab): {category:
    {chart title: [tag regex, ...]}}, each chart one plot of every tag that
    matches, in every run (train and eval)."""
    if not self._enabled:
      return
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.custom_scalar import summary as custom_scalar
    layout = layout_pb2.Layout(category=[
        layout_pb2.Category(title=category, chart=[
            layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(
                tag=list(tags)))
            for title, tags in chart_tags.items()])
        for category, chart_tags in charts.items()])
    # pb() makes TensorFlow's Summary proto (TensorFlow is loaded): TensorBoard's
    # own class is another one, of the same wire format.
    self._write(split, 0, summary_pb2.Summary.FromString(
        custom_scalar.pb(layout).SerializeToString()))

  def hparams(self, values: dict):
    """Records this run's hyperparameters (shown in TensorBoard's HParams tab)."""
    if not self._enabled or not values:
      return
    from tensorboard.plugins.hparams import api as hp  # Only needed by sweeps.
    self._write("", 0, hp.hparams_pb(
        values, trial_id=os.path.basename(os.path.normpath(self._model_dir))))

  def flush(self):
    for writer in self._writers.values():
      writer.flush()

  def close(self):
    for writer in self._writers.values():
      writer.close()


class StepSummaries:
  """Writes a user's summaries to one split at one step (nothing when disabled).

  Example (in an action):
    context.summaries.scalar("precision_at_10", value)
    context.summaries.histogram("embedding", context.model.weights[0].numpy())
  """

  def __init__(self, summaries: Summaries, split: str, step: int):
    self._summaries, self._split, self.step = summaries, split, step

  def scalar(self, tag: str, value: float):
    self._summaries.scalars(self._split, self.step, {tag: value})

  def text(self, tag: str, text: str):
    self._summaries.text(self._split, self.step, tag, text)

  def histogram(self, tag: str, values):
    self._summaries.histogram(self._split, self.step, tag, values)

  def image(self, tag: str, images):
    self._summaries.image(self._split, self.step, tag, images)


def markdown_flags(flag_lines) -> str:
  """The effective flags as a Markdown code block, for a text summary."""
  return "```\n" + "\n".join(flag_lines) + "\n```"


def _table(values: list) -> str:
  """A Markdown table of a vector or a matrix (TensorBoard's Text tab renders
  it), a row per first index."""
  rows = [row if isinstance(row, list) else [row] for row in values]
  width = max(len(row) for row in rows)
  lines = ["| | " + " | ".join(str(j) for j in range(width)) + " |",
           "|---" * (width + 1) + "|"]
  lines += [f"| **{i}** | " + " | ".join(f"{v:g}" for v in row) + " |"
            for i, row in enumerate(rows)]
  return "\n".join(lines)
