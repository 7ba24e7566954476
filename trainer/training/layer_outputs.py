"""Every layer's outputs of a model call, recorded as the call runs, and random
layers held at inference: what the equivalence check compares layer by layer.

The recording wraps each layer's `call` on the instance for a block (Keras's
tracking never sees the wrapper) and keeps the outputs per thread:
MirroredStrategy traces its replicas in threads.
"""

import contextlib
import functools
import threading

import tensorflow as tf

from trainer import internals
from trainer.training.steps import float32_outputs


class LayerRecorder:
  """Every layer's outputs in the order the calls end, per replica thread.

  Example:

    recorder = LayerRecorder()
    with recorder.recording(model):
      recorder.start()
      model(x, training=True)
      outputs = recorder.take()  # [tensor per layer call], recorder.layers
  """

  def __init__(self):
    self._local = threading.local()
    self.layers = []  # The layer of each recorded output (the last trace's).

  def start(self):
    self._local.outputs, self._local.layers = [], []

  def take(self) -> list:
    outputs, self.layers = self._local.outputs, self._local.layers
    self._local.outputs = None
    return outputs

  @contextlib.contextmanager
  def recording(self, model):
    with contextlib.ExitStack() as stack:
      for layer in internals.layers_of(model):
        stack.enter_context(_wrapped_call(layer, self._recording_call))
      yield

  def _add(self, layer, outputs):
    if getattr(self._local, "outputs", None) is None:
      return
    for tensor in tf.nest.flatten(outputs):
      if isinstance(tensor, tf.Tensor) and tensor.shape.rank:
        self._local.outputs.append(float32_outputs(tensor))
        self._local.layers.append(layer)

  def _recording_call(self, layer, call, *args, **kwargs):
    outputs = call(*args, **kwargs)
    self._add(layer, outputs)
    return outputs


def row_layers(outputs: list, batch_size: int) -> list:
  """The indices of the recorded outputs with one row per example."""
  return [i for i, t in enumerate(outputs) if t.shape[:1] == (batch_size,)]


@contextlib.contextmanager
def random_layers_at_inference(model):
  """Layers holding a SeedGenerator (Dropout, noise, Random* augmentations, a
  user's random layer) called with training=False for the block."""
  def at_inference(layer, call, *args, **kwargs):
    del layer
    if "training" in kwargs:
      kwargs["training"] = False
    return call(*args, **kwargs)

  with contextlib.ExitStack() as stack:
    for layer in internals.layers_of(model):
      if internals.seed_generators(layer) and layer is not model:
        stack.enter_context(_wrapped_call(layer, at_inference))
    yield


@contextlib.contextmanager
def _wrapped_call(layer, wrapper):
  """`layer.call` replaced by `wrapper(layer, call, ...)` for the block."""
  own = layer.__dict__.get("call")  # An earlier wrapper's, else the class's.
  call = layer.call
  wrapped = functools.wraps(call)(functools.partial(wrapper, layer, call))
  internals.set_untracked(layer, "call", wrapped)
  try:
    yield
  finally:
    if own is None:
      internals.delete_untracked(layer, "call")
    else:
      internals.set_untracked(layer, "call", own)
