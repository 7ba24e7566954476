"""The export's rules on their own, without a run: which dtype a served value
reaches preprocess in (trainer/outputs/serving_inputs.py), and which of a task's
objects the export saves or names (trainer/outputs/served_objects.py)."""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.outputs import served_objects, serving_inputs


def _spec(dtype, name="inputs"):
  return tf.TensorSpec([None, 2], dtype, name=name)


@pytest.mark.parametrize("source, target, exact", [
    (tf.uint8, tf.float32, True), (tf.uint8, tf.int32, True),
    (tf.int32, tf.int64, True), (tf.int32, tf.float64, True),
    (tf.float32, tf.float64, True), (tf.float32, tf.uint8, False),
    (tf.int64, tf.int32, False), (tf.float64, tf.float32, False),
    (tf.int32, tf.float32, False), (tf.string, tf.string, True),
    (tf.string, tf.int64, False)])
def test_a_cast_is_exact_only_where_every_value_survives(source, target, exact):
  assert serving_inputs.exact(source, target) is exact


def test_a_declared_float_over_stored_uint8_reaches_preprocess_as_sent():
  value = tf.constant([[3.7, 16.0]])
  got = serving_inputs.for_preprocess(value, _spec(tf.float32), _spec(tf.uint8))
  assert got.dtype == tf.float32
  np.testing.assert_array_equal(got, value)


def test_narrower_values_are_widened_to_the_stored_dtype():
  stored = {"seconds": _spec(tf.float64, "seconds"), "age": _spec(tf.int64, "age")}
  got = serving_inputs.for_preprocess(
      {"seconds": tf.constant([[1.5, 2.5]], tf.float32),
       "age": tf.constant([[60, 61]], tf.int32)}, stored, stored)
  assert {name: value.dtype for name, value in got.items()} == {
      "seconds": tf.float64, "age": tf.int64}


def test_serve_rounds_a_float64_and_checks_an_int64_into_a_declared_32_bits():
  rounded = serving_inputs.for_preprocess(
      tf.constant([[0.1, 0.2]], tf.float64), _spec(tf.float32), _spec(tf.float32))
  assert rounded.dtype == tf.float32
  np.testing.assert_array_equal(rounded, np.float32([[0.1, 0.2]]))
  ids = serving_inputs.for_preprocess(tf.constant([[7, 9]], tf.int64),
                                      _spec(tf.int32), _spec(tf.int32))
  assert ids.dtype == tf.int32
  np.testing.assert_array_equal(ids, [[7, 9]])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="feature inputs holds values outside int32"):
    serving_inputs.for_preprocess(tf.constant([[2 ** 31, 1]], tf.int64),
                                  _spec(tf.int32), _spec(tf.int32))


def test_serve_takes_the_other_width_of_each_number():
  signature = {"age": _spec(tf.int64, "age"), "name": _spec(tf.string, "name"),
               "pixels": _spec(tf.uint8, "pixels")}
  variants = serving_inputs.serve_variants(signature)
  assert [{name: spec.dtype for name, spec in variant.items()}
          for variant in variants] == [
              {"age": tf.int32, "name": tf.string, "pixels": tf.uint8}]


class _Holder:
  """A plain object keeping its lookups in a dict, as FeatureSpace does."""

  def __init__(self, table):
    self.lookups = {"color": {"table": table}}


def test_a_resource_deep_in_a_task_attribute_is_found_and_what_serving_skips_is_not(
    tmp_path):
  table = tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(["red"], [1.0]), default_value=0.0)
  task = types.SimpleNamespace(
      features=_Holder(table), scale=tf.Variable(2.0),
      augment=keras.Sequential([keras.layers.GaussianNoise(0.1)]))
  read = tf.function(lambda words: task.features.lookups["color"]["table"].lookup(
      words) * task.scale).get_concrete_function(tf.TensorSpec([None], tf.string))
  kept = served_objects.served(task, [read])
  assert sorted((item.attribute, type(item.owner).__name__) for item in kept) == [
      ("features", "StaticHashTable"), ("scale", "ResourceVariable")]
  assert served_objects.unsaveable(kept, str(tmp_path / "export")) is None


def test_an_iterator_that_serving_reads_is_named(tmp_path):
  offsets = iter(tf.data.Dataset.from_tensors(0.5).repeat())
  task = types.SimpleNamespace(offsets=offsets)
  read = tf.function(lambda x: x + next(task.offsets)).get_concrete_function(
      tf.TensorSpec([None], tf.float32))
  kept = served_objects.served(task, [read])
  assert [item.attribute for item in kept] == ["offsets"]
  why = served_objects.unsaveable(kept, str(tmp_path / "export"))
  assert why.startswith("Task.offsets (OwnedIterator), which preprocess or a "
                        "serving method uses, cannot be saved in a SavedModel "
                        "(TensorFlow saves no IteratorResource): serving must not "
                        "read it"), why
  assert not (tmp_path / "export.probe").exists()
