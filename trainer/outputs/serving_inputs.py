"""What an export's serving function takes, and what it hands `Task.preprocess`.

The rule (docs/options.md, "Export"): the signature declares what training's
`preprocess` received, the stored dtypes (where the features go to the model as
they are, a float model input's dtype, which the model narrows them to itself);
a task's `serving_signature` may declare another dtype, and the export honours
it: a value reaches `preprocess` cast to the stored dtype only where every value
of the declared dtype has it exactly (int32 ids stored int64, float32 seconds
stored float64), else as declared (float32 pixels over uint8 storage: 3.7 stays
3.7). No value is changed on its way in, except as `serve` documents for its
other dtypes (float64 rounded to a declared float32; int64 checked into int32).
"""

import numpy as np
import tensorflow as tf

# What Python numbers become (tf.convert_to_tensor: int32, float32) and what
# numpy and pandas store (int64, float64): `serve` takes either.
_NARROW = {tf.int64: tf.int32, tf.float64: tf.float32}
_WIDE = {tf.int32: tf.int64, tf.float32: tf.float64}


def batch_free(spec):
  """`spec` with a batch dimension of None: a signature serves any batch (a
  spec other than a TensorSpec, ragged or sparse, as it is)."""
  if type(spec) is not tf.TensorSpec:
    return spec
  shape = tf.TensorShape(spec.shape)
  if shape.rank:
    shape = tf.TensorShape([None]).concatenate(shape[1:])
  return tf.TensorSpec(shape, spec.dtype, name=spec.name)


def offered(feature_spec, model, task):
  """What the export offers `Task.serving_signature`: the stored features'
  specs with the batch dimension None. Where the features go to the model as
  they are (one input, no Task.preprocess), the dimensions the data leaves
  unknown come from the model's input (e.g. windows of a series that tf.data
  does not know are all 120 long), and a float feature takes a float input's
  dtype (the model casts float64 to its float32 itself, in training too);
  integer features keep theirs (int32 token ids into a float32 keras.Input).
  Only non-batch dimensions come from the model: a model built by a call (no
  keras.Input) has the batch it was built on."""
  from trainer.tasks.base import Task  # Not at the top: tasks import outputs.
  feature_spec = tf.nest.map_structure(batch_free, feature_spec)
  inputs = getattr(model, "inputs", None) or []
  leaves = tf.nest.flatten(feature_spec)
  if (type(task).preprocess is not Task.preprocess or len(inputs) != 1 or
      len(leaves) != 1):
    return feature_spec
  model_shape = tf.TensorShape(inputs[0].shape)
  if model_shape.rank:
    model_shape = tf.TensorShape([None]).concatenate(model_shape[1:])
  try:
    shape = tf.TensorShape(leaves[0].shape).merge_with(model_shape)
  except ValueError:  # The model takes another shape: the data's spec stands.
    return feature_spec
  dtype = tf.as_dtype(leaves[0].dtype)
  if dtype.is_floating and tf.as_dtype(inputs[0].dtype).is_floating:
    dtype = tf.as_dtype(inputs[0].dtype)
  return tf.nest.pack_sequence_as(
      feature_spec, [tf.TensorSpec(shape, dtype, name=leaves[0].name)])


def named_specs(signature) -> list:
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


def serve_variants(signature) -> list:
  """The signature with its int and float features in the other width each
  (int32 for int64, float64 for float32, ...): the extra dtypes `serve`
  takes. Only those that differ from the signature."""
  variants = []
  for table in (_NARROW, _WIDE):
    variant = tf.nest.map_structure(
        lambda s, table=table: tf.TensorSpec(s.shape, table.get(s.dtype, s.dtype),
                                             name=s.name), signature)
    if named_specs(variant) != named_specs(signature):
      variants.append(variant)
  return variants


def exact(source, target) -> bool:
  """Whether every value of dtype `source` is a value of `target` (uint8 in
  int32 or float32, int32 in int64 or float64, float32 in float64)."""
  source, target = tf.as_dtype(source), tf.as_dtype(target)
  if source == target:
    return True
  if not all(d.is_integer or d.is_floating or d.is_bool for d in (source, target)):
    return False
  try:
    return bool(np.can_cast(source.as_numpy_dtype, target.as_numpy_dtype, "safe"))
  except TypeError:  # A dtype numpy does not know (bfloat16): not assumed exact.
    return False


def for_preprocess(features, signature, stored):
  """`features` (in the signature's dtypes, or `serve`'s other widths) as
  `Task.preprocess` takes them: each in the signature's declared dtype, then in
  the stored one where that holds every declared value exactly. Where the
  signature's structure is not the stored features', only the first step."""
  declared = named_specs(signature)
  values = [_to_declared(value, spec)
            for value, spec in zip(tf.nest.flatten(features), declared)]
  try:
    tf.nest.assert_same_structure(signature, stored)
  except (ValueError, TypeError):
    return tf.nest.pack_sequence_as(features, values)
  values = [tf.cast(value, spec.dtype)
            if value.dtype != spec.dtype and exact(value.dtype, spec.dtype)
            else value
            for value, spec in zip(values, tf.nest.flatten(stored))]
  return tf.nest.pack_sequence_as(features, values)


def _to_declared(value, spec):
  """`value` in `spec`'s dtype: widened exactly, a float64 rounded to the
  nearest float32 (as storing it would), an int64 narrowed only where it fits
  (else the call fails, naming the feature)."""
  if value.dtype == spec.dtype:
    return value
  narrowed = tf.cast(value, spec.dtype)
  if exact(value.dtype, spec.dtype) or not value.dtype.is_integer:
    return narrowed
  with tf.control_dependencies([tf.debugging.assert_equal(
      tf.cast(narrowed, value.dtype), value,
      message=f"serve: feature {spec.name} holds values outside {spec.dtype.name}, "
              "the dtype its signature declares")]):
    return tf.identity(narrowed)
