"""SavedModel export with a serving signature that takes raw stored pixel values."""

import tensorflow as tf


class _Serving(tf.Module):
  """Wraps the model: scales raw inputs as training did and returns predictions."""

  def __init__(self, model, *, input_shape, scale: float):
    super().__init__()
    self.model = model
    self._scale = scale
    self.serve = tf.function(
        self._serve,
        input_signature=[tf.TensorSpec([None, *input_shape], tf.float32, "inputs")])

  def _serve(self, inputs):
    logits = tf.cast(self.model(inputs * self._scale, training=False), tf.float32)
    return {"logits": logits,
            "probabilities": tf.nn.softmax(logits),
            "classes": tf.argmax(logits, axis=-1)}


def export_saved_model(model, export_dir: str, *, input_shape, scale: float) -> str:
  """Saves `model` as a SavedModel whose `serving_default` maps raw inputs to
  {"logits", "probabilities", "classes"}.

  Args:
    model: the trained Keras model.
    export_dir: destination directory (replaced if it exists).
    input_shape: shape of one example.
    scale: the factor the data pipeline applied to stored values.

  Returns:
    export_dir.
  """
  module = _Serving(model, input_shape=input_shape, scale=scale)
  tf.saved_model.save(module, export_dir, signatures={"serving_default": module.serve})
  return export_dir
