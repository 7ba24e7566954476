"""Data: a task's arrays or tf.data streams, their checks, the classification data
sets, and an input order that is a function of (seed, step) so a resume needs no
iterator state."""

import numpy as np
import pytest
import tensorflow as tf

from trainer import data
from trainer.config import Config
from trainer.errors import DataError
from trainer.tasks import image_data


def _source(n_train=40):
  """Training arrays whose feature is the example's id."""
  x = np.arange(n_train, dtype=np.float32).reshape(n_train, 1)
  return data.ArrayData(x, np.arange(n_train) % 3)


def _eval_split(n_test=10):
  return data.ArrayData(np.arange(n_test, dtype=np.float32).reshape(n_test, 1),
                        np.arange(n_test) % 3)


def _ids(dataset, num_batches):
  """The example ids (x is the id) of the first batches of a dataset."""
  return [batch[0].numpy()[:, 0].astype(int).tolist()
          for batch in dataset.take(num_batches)]


def test_digits_ships_offline_and_is_split():
  source = image_data.load_source(Config())
  assert source.x_train.shape[1:] == (8, 8, 1) and source.num_classes == 10
  assert len(source.x_train) + len(source.x_test) == 1797


def test_order_is_a_pure_function_of_seed_and_step():
  source = _source()
  full = _ids(data.train_dataset(source, global_batch_size=8, seed=3, shuffle=True,
                                 start_step=0), 12)
  resumed = _ids(data.train_dataset(source, global_batch_size=8, seed=3, shuffle=True,
                                    start_step=7), 5)
  assert resumed == full[7:12]
  other_seed = _ids(data.train_dataset(source, global_batch_size=8, seed=4,
                                       shuffle=True, start_step=0), 5)
  assert other_seed != full[:5]


def test_each_epoch_is_a_new_permutation_without_partial_batches():
  source = _source(n_train=36)  # 4 batches of 8 per epoch; 4 examples dropped.
  batches = _ids(data.train_dataset(source, global_batch_size=8, seed=0, shuffle=True,
                                    start_step=0), 8)
  epoch0, epoch1 = sum(batches[:4], []), sum(batches[4:], [])
  assert len(set(epoch0)) == 32 and len(set(epoch1)) == 32  # No repeats in an epoch.
  assert epoch0 != epoch1
  assert all(len(b) == 8 for b in batches)


def test_unshuffled_order_is_the_stored_order():
  batches = _ids(data.train_dataset(_source(), global_batch_size=8, seed=0,
                                    shuffle=False, start_step=1), 2)
  assert batches == [list(range(8, 16)), list(range(16, 24))]


def test_too_small_training_set_is_a_clear_error():
  with pytest.raises(DataError, match="has 40 examples, fewer than one global batch"):
    data.train_dataset(_source(), global_batch_size=64, seed=0, shuffle=True,
                       start_step=0)


def test_eval_pads_with_weight_zero_to_whole_batches():
  dataset, num_batches = data.eval_dataset(_eval_split(10), global_batch_size=4)
  assert num_batches == 3
  weights = np.concatenate([w.numpy() for _, _, w in dataset])
  assert weights.tolist() == [1.0] * 10 + [0.0] * 2


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
    image_data.load_source(Config(dataset="npz", data_path=path))
  assert message in str(e.value) and path in str(e.value)
  assert "\n" not in str(e.value)


def test_not_an_npz_file(tmp_path):
  path = tmp_path / "junk.npz"
  path.write_text("not a zip")
  with pytest.raises(DataError, match="not a readable .npz"):
    image_data.load_source(Config(dataset="npz", data_path=str(path)))


def test_distributed_batches_split_the_global_batch():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  dataset = data.train_dataset(_source(), global_batch_size=8, seed=0, shuffle=False,
                               start_step=0)
  x, _ = next(iter(data.distribute(strategy, dataset)))
  parts = [t.numpy()[:, 0].tolist() for t in strategy.experimental_local_results(x)]
  assert parts == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_shipped_digits_are_scikit_learns():
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  from trainer.config import Config  # pylint: disable=g-import-not-at-top
  from trainer.tasks import image_data  # pylint: disable=g-import-not-at-top
  source, digits = image_data.load_source(Config()), load_digits()
  np.testing.assert_array_equal(
      np.concatenate([source.x_train, source.x_test])[..., 0], digits.images)
  np.testing.assert_array_equal(np.concatenate([source.y_train, source.y_test]),
                                digits.target)
  assert source.x_train.dtype == np.uint8 and len(source.x_train) == 1437
