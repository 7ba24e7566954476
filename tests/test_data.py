"""Data: a task's arrays or tf.data streams, their checks, the classification data
sets, and an input order that is a function of (seed, step) so a resume needs no
iterator state."""

import re

import numpy as np
import pytest
import tensorflow as tf

from trainer import data
from trainer.data import elastic
from trainer.distribute.cluster import Cluster
from trainer.errors import DataError
from trainer.tasks import image_data
from trainer.tasks.classification import Classification


def _source(n_train=40):
  """Training arrays whose feature is the example's id."""
  x = np.arange(n_train, dtype=np.float32).reshape(n_train, 1)
  return data.ArrayData(x, np.arange(n_train) % 3)


def _eval_split(n_test=10):
  return data.ArrayData(np.arange(n_test, dtype=np.float32).reshape(n_test, 1),
                        np.arange(n_test) % 3)


def _order(global_batch_size=8, seed=0, shuffle=True):
  return data.Order(seed=seed, shuffle=shuffle, global_batch_size=global_batch_size)


def _ids(dataset, num_batches):
  """The example ids (x is the id) of the first batches of a dataset."""
  return [batch[0].numpy()[:, 0].astype(int).tolist()
          for batch in dataset.take(num_batches)]


def test_digits_ships_offline_and_is_split():
  source = image_data.load_source(Classification(), seed=0)
  assert source.x_train.shape[1:] == (8, 8, 1) and source.num_classes == 10
  assert len(source.x_train) + len(source.x_test) == 1797


def test_order_is_a_pure_function_of_seed_and_step():
  source = _source()
  full = _ids(source.train_dataset(_order(seed=3), start_step=0), 12)
  resumed = _ids(source.train_dataset(_order(seed=3), start_step=7), 5)
  assert resumed == full[7:12]
  other_seed = _ids(source.train_dataset(_order(seed=4), start_step=0), 5)
  assert other_seed != full[:5]


def test_each_epoch_is_a_new_permutation_without_partial_batches():
  source = _source(n_train=36)  # 4 batches of 8 per epoch; 4 examples dropped.
  batches = _ids(source.train_dataset(_order(), start_step=0), 8)
  epoch0, epoch1 = sum(batches[:4], []), sum(batches[4:], [])
  assert len(set(epoch0)) == 32 and len(set(epoch1)) == 32  # No repeats in an epoch.
  assert epoch0 != epoch1
  assert all(len(b) == 8 for b in batches)


def test_unshuffled_order_is_the_stored_order():
  batches = _ids(_source().train_dataset(_order(shuffle=False), start_step=1), 2)
  assert batches == [list(range(8, 16)), list(range(16, 24))]


@pytest.mark.parametrize("shards,pipelines,batch,exact", [
    (8, 1, 32, True),    # One process reads all 8 input shards,
    (8, 2, 32, True),    # 2 workers 4 each,
    (8, 8, 32, True),    # 8 workers one each.
    (2, 2, 32, True),
    (8, 3, 24, False),   # 3 workers cannot share 8 shards.
    (1, 2, 32, False),   # More workers than shards.
    (4, 1, 30, False),   # A global batch the shards cannot split evenly.
    (0, 1, 32, False)])  # Not per-pipeline data.
def test_a_worker_count_reads_the_input_shards_exactly_where_it_shares_them(
    shards, pipelines, batch, exact):
  assert elastic.exact(shards, pipelines=pipelines,
                       global_batch_size=batch) == exact


@pytest.mark.parametrize("pipelines,batch,fair,shards", [
    (1, 32, 99, 8),     # 1, 2, 4 and 8 workers read a one-process run exactly.
    (2, 32, 99, 8),
    (1, 12, 99, 6),     # The most that divide the global batch,
    (3, 24, 99, 6),     # a multiple of the workers,
    (16, 64, 99, 16),   # one per worker where the workers are more,
    (1, 32, 4, 4),      # that the data splits into fairly (4 even files),
    (2, 32, 1, 2)])     # else one per worker.
def test_a_run_picks_the_most_input_shards_its_workers_batch_and_data_allow(
    pipelines, batch, fair, shards):
  assert elastic.first_input_shards(
      pipelines=pipelines, global_batch_size=batch,
      shardable=lambda count: count <= fair) == shards


def test_too_small_training_set_is_a_clear_error():
  with pytest.raises(DataError, match="has 40 examples, fewer than one global batch "
                     r"of 64 \(32 per replica x 2 replicas\)"):
    _source().check_training(Cluster(num_replicas=2), 64)


_X, _Y, _W = (np.arange(10, dtype=np.float32)[:, None], np.arange(10) % 3,
              np.linspace(0.5, 5.0, 10).astype(np.float32))


@pytest.mark.parametrize("split, weights", [
    (_eval_split(10), None),
    (data.ArrayData(_X, _Y, _W), _W),
    (data.as_task_data(tf.data.Dataset.from_tensor_slices((_X, _Y)),
                       what="test", finite=True), None),
    (data.as_task_data(tf.data.Dataset.from_tensor_slices((_X, _Y, _W)),
                       what="test", finite=True), _W),
    (data.as_task_data(lambda context: tf.data.Dataset.from_tensor_slices((_X, _Y)),
                       what="test", finite=True), None),
    (data.as_task_data(lambda context: tf.data.Dataset.from_tensor_slices(
        (_X, _Y, _W)), what="test", finite=True), _W),
])
def test_eval_pads_to_whole_batches_and_keeps_the_sample_weights(split, weights):
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  dataset, num_batches = split.eval_input(strategy, Cluster(), global_batch_size=4,
                                          preprocess=lambda f: f)
  assert num_batches == 3
  batches = list(dataset)
  padding = np.concatenate([p.numpy() for *_, p in batches])
  assert padding.tolist() == [1.0] * 10 + [0.0] * 2
  got = np.concatenate([w.numpy() for _, _, w, _ in batches])[:10]
  np.testing.assert_array_equal(got, np.ones(10) if weights is None else weights)
  ids = np.concatenate([x.numpy()[:, 0] for x, *_ in batches])
  assert ids[:10].tolist() == list(range(10))


def test_training_batches_carry_the_sample_weights_in_the_seeded_order():
  weighted = data.ArrayData(_X, _Y, _W)
  batches = list(weighted.train_dataset(_order(global_batch_size=4, seed=2),
                                        start_step=0).take(5))
  for features, labels, weights in batches:
    index = features.numpy()[:, 0].astype(int)
    np.testing.assert_array_equal(weights.numpy(), _W[index])
    np.testing.assert_array_equal(labels.numpy(), _Y[index])
  unweighted = data.ArrayData(_X, _Y).train_dataset(
      _order(global_batch_size=4, seed=2), start_step=0).take(5)
  assert [b[0].numpy().tolist() for b in unweighted] == [
      b[0].numpy().tolist() for b in batches]  # Weights change no order.


@pytest.mark.parametrize("value, message", [
    ((_X, _Y, np.ones((10, 2))), r"weights must be one number per example"),
    ((_X, _Y, np.ones(9)), r"different numbers of examples \(9, 10\)"),
    ((_X, _Y, _W, _W), r"must return \(features, labels\) arrays, \(features, "
     r"labels, weights\)"),
    # They ended mid-run in "Cast string to float is not supported".
    ((_X, _Y, np.array(["1"] * 10)), r"weights must be numbers, got dtype <U1"),
    ((_X, _Y, np.array([b"1"] * 10, object)), r"weights must be numbers, got dtype "
     r"object"),
])
@pytest.mark.parametrize("split", ["Task.train_data()", "Task.eval_data()"])
def test_bad_weights_are_refused(value, message, split):
  with pytest.raises(DataError, match=re.escape(split) + ": .*" + message):
    data.as_task_data(value, what=split, finite=split == "Task.eval_data()")


@pytest.mark.parametrize("split", ["Task.train_data()", "Task.eval_data()"])
def test_a_datasets_string_weights_are_refused(split):
  weights = tf.data.Dataset.from_tensor_slices((_X, _Y, np.array(["1"] * 10)))
  with pytest.raises(DataError, match=re.escape(
      f"{split}: an element's weight must be one number, got TensorSpec(shape=(), "
      "dtype=tf.string")):
    data.as_task_data(weights, what=split, finite=split == "Task.eval_data()")


def test_elements_that_change_shape_stop_the_run_in_one_line(tmp_path):
  """The probe sees the first elements only; the elements are held to the
  first one's shapes, and the error names the split and the shapes (it was a
  traceback)."""
  import trainer
  from user_tasks import ChangingShape
  for array_input in ("gather", "dataset"):
    with pytest.raises(DataError, match=re.escape(
        "Task.train_data(): its elements change shape: the first has [") +
                       r"[56]\], a later one \[[56]\]"):
      trainer.train(trainer.Config(
          train_steps=40, per_replica_batch_size=16, array_input=array_input,
          summaries=False, model_dir=str(tmp_path / array_input)),
                    task=ChangingShape())


def _write_npz(path, **arrays):
  np.savez(path, **arrays)
  return str(path)


@pytest.mark.parametrize("arrays, message", [
    (dict(x_train=np.zeros((4, 2)), y_train=np.zeros(4, int), x_test=np.zeros((2, 2))),
     "missing array(s) y_test"),
    (dict(x_train=np.zeros((4, 2)), y_train=np.zeros(3, int), x_test=np.zeros((2, 2)),
          y_test=np.zeros(2, int)), "x_train has 4 examples but y_train has 3"),
    (dict(x_train=np.zeros((4, 2)), y_train=np.array([0, 1, -1, 0]),
          x_test=np.zeros((2, 2)), y_test=np.zeros(2, int)), "negative label -1"),
    (dict(x_train=np.zeros((4, 2)), y_train=np.zeros(4, int), x_test=np.zeros((2, 3)),
          y_test=np.zeros(2, int)), "x_train examples have shape (2,)"),
])
def test_bad_npz_is_a_one_line_error(tmp_path, arrays, message):
  path = _write_npz(tmp_path / "bad.npz", **arrays)
  with pytest.raises(DataError) as e:
    image_data.load_source(Classification(dataset="npz", data_path=path), seed=0)
  assert message in str(e.value) and path in str(e.value)
  assert "\n" not in str(e.value)


def test_not_an_npz_file(tmp_path):
  path = tmp_path / "junk.npz"
  path.write_text("not a zip")
  with pytest.raises(DataError, match="not a readable .npz"):
    image_data.load_source(Classification(dataset="npz", data_path=str(path)),
                           seed=0)


def test_distributed_batches_split_the_global_batch():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  x, *_ = next(iter(_source().train_input(strategy, Cluster(num_replicas=2),
                                         _order(shuffle=False), start_step=0,
                                         preprocess=lambda f: f)))
  parts = [t.numpy()[:, 0].tolist() for t in strategy.experimental_local_results(x)]
  assert parts == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_shipped_digits_are_scikit_learns():
  from sklearn.datasets import load_digits
  source, digits = image_data.load_source(Classification(), seed=0), load_digits()
  np.testing.assert_array_equal(
      np.concatenate([source.x_train, source.x_test])[..., 0], digits.images)
  np.testing.assert_array_equal(np.concatenate([source.y_train, source.y_test]),
                                digits.target)
  assert source.x_train.dtype == np.uint8 and len(source.x_train) == 1437


def test_a_batched_dataset_is_taken_as_its_examples():
  """A Keras user's batched dataset (augmentation mapped over its batches) is
  unbatched, to be batched again into per-replica batches; padded batches,
  whose shapes differ, are refused."""
  windows = tf.data.Dataset.from_tensor_slices(
      (np.arange(20 * 8, dtype=np.float32).reshape(20, 4, 2),
       np.arange(20, dtype=np.float32)))
  mapped = windows.batch(6).prefetch(2).map(lambda x, y: (x * 2.0, y))
  for batched, twice in ((windows.batch(5), 1.0), (mapped, 2.0)):
    split = data.as_task_data(batched, what="Task.train_data()")
    assert split.note == ("Task.train_data(): the dataset yields batches; the "
                          "framework unbatches them and batches the examples "
                          "again, one per-replica batch per replica per step")
    assert split.element_spec[0].shape == (4, 2)
    x, y = split.first(20)
    np.testing.assert_array_equal(y, np.arange(20))
    np.testing.assert_array_equal(x, twice * windows.batch(20).get_single_element()[0])
  assert data.as_task_data(windows.batch(5).unbatch(),
                           what="Task.train_data()").note is None
  with pytest.raises(DataError, match="yields padded batches, whose shapes differ"):
    data.as_task_data(windows.padded_batch(5), what="Task.train_data()")
