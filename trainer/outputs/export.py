"""SavedModel export: a serving signature from stored features to the task's outputs.

The signature applies the task's `preprocess` (as training did) before the model and
its `serving_outputs` after it, so a served model takes raw stored values.
"""

import tensorflow as tf

from trainer.errors import TaskError


def _named_specs(signature) -> list:
  """The signature's TensorSpecs in `tf.nest.flatten` order, each named: its own
  name, else its path of dict keys ("image", "meta_age"), else "inputs"."""
  return [tf.TensorSpec(spec.shape, spec.dtype, name=spec.name or path)
          for spec, path in zip(tf.nest.flatten(signature), _paths(signature))]


def _paths(structure, prefix: str = "") -> list:
  """Names of a nest's leaves, in `tf.nest.flatten` order (dict keys sorted)."""
  if isinstance(structure, dict):
    return [path for key in sorted(structure)
            for path in _paths(structure[key], f"{prefix}{key}_")]
  if isinstance(structure, (list, tuple)):
    return [path for index, item in enumerate(structure)
            for path in _paths(item, f"{prefix}{index}_")]
  return [prefix.rstrip("_") or "inputs"]


def check_serving_signature(task, feature_spec):
  """Checks early (before training) that the task's serving signature is specs.

  Raises:
    TaskError: `Task.serving_signature` returned something else.
  """
  signature = task.serving_signature(feature_spec)
  leaves = tf.nest.flatten(signature)
  if not leaves or not all(isinstance(s, tf.TensorSpec) for s in leaves):
    raise TaskError("Task.serving_signature() must return a tf.TensorSpec or a dict "
                    f"of them, got {signature!r}"[:300])


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
