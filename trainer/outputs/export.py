"""SavedModel export: a serving signature from stored features to the task's outputs.

The signature applies the task's `preprocess` (as training did) before the model and
its `serving_outputs` after it, so a served model takes raw stored values.
"""

import tensorflow as tf


def _named_specs(signature) -> list:
  """The signature's TensorSpecs, flat, each named (by its dict key, or "inputs")."""
  if isinstance(signature, dict):
    flat = []
    for path, spec in zip(_paths(signature), tf.nest.flatten(signature)):
      flat.append(tf.TensorSpec(spec.shape, spec.dtype, name=spec.name or path))
    return flat
  flat = tf.nest.flatten(signature)
  if len(flat) == 1:
    return [tf.TensorSpec(flat[0].shape, flat[0].dtype, flat[0].name or "inputs")]
  return [tf.TensorSpec(s.shape, s.dtype, s.name or f"inputs_{i}")
          for i, s in enumerate(flat)]


def _paths(structure) -> list:
  """Names of a nest's leaves in `tf.nest.flatten` order, e.g. "image", "meta_age"."""
  return [path.replace("/", "_")
          for path, _ in tf.nest.flatten_with_joined_string_paths(structure)]


def export_saved_model(model, task, export_dir: str, *, feature_spec) -> str:
  """Saves `model` as a SavedModel whose `serving_default` maps stored features to
  `task.serving_outputs(model(task.preprocess(features)))`.

  Args:
    model: the trained Keras model.
    task: the run's Task.
    export_dir: destination directory (replaced if it exists).
    feature_spec: specs of a batch of stored features (see data.feature_spec).

  Returns:
    export_dir.
  """
  signature = task.serving_signature(feature_spec)
  specs = _named_specs(signature)

  def serve(*inputs):
    features = tf.nest.pack_sequence_as(signature, list(inputs))
    outputs = model(task.preprocess(features), training=False)
    return task.serving_outputs(outputs)

  module = tf.Module()
  module.model = model
  module.serve = tf.function(serve, input_signature=specs)
  tf.saved_model.save(module, export_dir, signatures={"serving_default": module.serve})
  return export_dir
