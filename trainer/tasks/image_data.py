"""The data set registry: in-memory arrays for each --dataset, checked on load
(--dataset=tfrecord: files, see image_records.py)."""

import dataclasses
import os
from typing import Callable, Dict

import numpy as np

from trainer.config import Config
from trainer.errors import DataError

MAX_CLASSES = 100_000  # Labels beyond this are a mistake, not a data set.


@dataclasses.dataclass(frozen=True)
class Source:
  """A classification data set held in memory.

  Attributes:
    x_train: examples, shape [N, ...] (images have a trailing channel axis).
    y_train: int labels in [0, num_classes), shape [N].
    x_test: test examples.
    y_test: test labels.
    num_classes: number of classes.
    scale: factor that maps stored values to model inputs (e.g. 1/255 for uint8).
  """
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  scale: float = 1.0

  @property
  def input_shape(self):
    return tuple(self.x_train.shape[1:])

  def train_data(self):
    return self.x_train, self.y_train

  def eval_data(self):
    return self.x_test, self.y_test


DIGITS_FILE = os.path.join(os.path.dirname(__file__), "digits.npz")


def _digits(config: Config) -> Source:
  """scikit-learn's 8x8 handwritten digits (1797 images), shipped with the package
  as uint8 arrays (tests check they equal sklearn.datasets.load_digits), so
  offline and without importing scikit-learn (most of a second) at start-up."""
  with np.load(DIGITS_FILE) as digits:
    x = digits["images"][..., None]  # Pixel values 0..16.
    y = digits["target"].astype(np.int64)
  n_train = 1437  # A fixed 80/20 split, the same on every machine.
  return Source(x[:n_train], y[:n_train], x[n_train:], y[n_train:], 10, 1 / 16)


def _mnist(config: Config) -> Source:
  """MNIST from --data_path (a local mnist.npz) or Keras' download."""
  if config.data_path:
    return _npz(config)
  import keras
  try:
    (x_train, y_train), (x_test, y_test) = keras.datasets.mnist.load_data()
  except Exception as e:  # Offline: the download fails with a network error.
    raise DataError("--dataset=mnist: could not download MNIST "
                    f"({type(e).__name__}); pass --data_path=mnist.npz") from None
  return _checked("mnist", x_train, y_train, x_test, y_test)


def _npz(config: Config) -> Source:
  """Any .npz with x_train, y_train, x_test, y_test."""
  path = config.data_path
  try:
    loaded = np.load(path, allow_pickle=False)
  except (OSError, ValueError, EOFError) as e:
    raise DataError(f"--data_path={path}: not a readable .npz "
                    f"({type(e).__name__}: {str(e)[:120]})") from None
  if not isinstance(loaded, np.lib.npyio.NpzFile):
    raise DataError(f"--data_path={path}: a single .npy array, not an .npz archive "
                    "of x_train, y_train, x_test, y_test")
  try:
    with loaded as data:
      missing = [k for k in ("x_train", "y_train", "x_test", "y_test")
                 if k not in data.files]
      if missing:
        raise DataError(f"--data_path={path}: missing array(s) {', '.join(missing)}; "
                        "needs x_train, y_train, x_test, y_test")
      arrays = [data[k] for k in ("x_train", "y_train", "x_test", "y_test")]
  except (OSError, ValueError, EOFError) as e:
    raise DataError(f"--data_path={path}: not a readable .npz "
                    f"({type(e).__name__}: {str(e)[:120]})") from None
  return _checked(path, *arrays)


def _synthetic(config: Config) -> Source:
  """Random examples of --synthetic_shape with random labels, for benchmarks."""
  rng = np.random.default_rng(config.seed)
  shape = tuple(config.synthetic_shape)
  n_test = max(1, config.synthetic_examples // 8)
  x = rng.standard_normal((config.synthetic_examples + n_test,) + shape,
                          dtype=np.float32)
  y = rng.integers(0, 10, size=len(x)).astype(np.int64)
  n = config.synthetic_examples
  return Source(x[:n], y[:n], x[n:], y[n:], 10)


def _checked(name, x_train, y_train, x_test, y_test) -> Source:
  """Validates arrays and returns a Source (uint8 images scaled by 1/255)."""
  for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
    if len(x) != len(y):
      raise DataError(f"{name}: x_{split} has {len(x)} examples but y_{split} has "
                      f"{len(y)}")
    if len(x) == 0:
      raise DataError(f"{name}: x_{split} is empty")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
      raise DataError(f"{name}: y_{split} must be a 1-D array of integer labels, got "
                      f"shape {y.shape} dtype {y.dtype}")
    if y.min() < 0:
      raise DataError(f"{name}: y_{split} has a negative label {y.min()}")
    if y.max() >= MAX_CLASSES:
      raise DataError(f"{name}: y_{split} has a label {y.max()}, which means "
                      f"{int(y.max()) + 1} classes; at most {MAX_CLASSES} are "
                      "supported")
    if x.ndim < 2:
      raise DataError(f"{name}: x_{split} must have shape [examples, features...], "
                      f"got {x.shape}")
  if x_train.shape[1:] != x_test.shape[1:]:
    raise DataError(f"{name}: x_train examples have shape {x_train.shape[1:]} but "
                    f"x_test {x_test.shape[1:]}")
  num_classes = int(max(y_train.max(), y_test.max())) + 1
  if x_train.ndim == 3:  # [N, H, W] images get a channel axis.
    x_train, x_test = x_train[..., None], x_test[..., None]
  scale = 1 / 255 if x_train.dtype == np.uint8 else 1.0
  if not np.issubdtype(x_train.dtype, np.number):
    raise DataError(f"{name}: x_train must be numeric, got dtype {x_train.dtype}")
  return Source(x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64),
                num_classes, scale)


def _tfrecord(config: Config):
  from trainer.tasks import image_records  # pylint: disable=g-import-not-at-top
  return image_records.load_records(config)


_REGISTRY: Dict[str, Callable[[Config], Source]] = {
    "digits": _digits,
    "mnist": _mnist,
    "npz": _npz,
    "synthetic": _synthetic,
    "tfrecord": _tfrecord,
}


def load_source(config: Config):
  """Loads the data set named by --dataset (tfrecord: finds its files).

  Args:
    config: the run's config (dataset, data_path, seed, synthetic_*).

  Returns:
    The data set in memory (a Source), or in TFRecord files (a RecordSource).

  Raises:
    DataError: the data set is missing, malformed or has inconsistent arrays.
  """
  if config.data_path and not os.path.isfile(config.data_path):
    raise DataError(f"--data_path={config.data_path}: no such file")
  return _REGISTRY[config.dataset](config)
