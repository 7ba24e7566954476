"""The data set registry: in-memory arrays for each --dataset, checked on load
(--dataset=tfrecord: files, see image_records.py)."""

import dataclasses
import hashlib
import os
from typing import Callable, Dict

import numpy as np

from trainer.errors import DataError, one_line

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


_FINGERPRINT_BYTES = 64 * 2**20  # Enough to tell data sets apart, fast to read.


def fingerprint_file(path: str) -> str:
  """A file's size and the digest of its start: which data a run trained on."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    digest.update(f.read(_FINGERPRINT_BYTES))
  return f"{os.path.getsize(path)} bytes, sha256 {digest.hexdigest()[:16]}"


DIGITS_FILE = os.path.join(os.path.dirname(__file__), "digits.npz")


def _digits(params, seed: int) -> Source:
  """scikit-learn's 8x8 handwritten digits (1797 images), shipped with the package
  as uint8 arrays (tests check they equal sklearn.datasets.load_digits), so
  offline and without importing scikit-learn (most of a second) at start-up."""
  del params, seed
  with np.load(DIGITS_FILE) as digits:
    x = digits["images"][..., None]  # Pixel values 0..16.
    y = digits["target"].astype(np.int64)
  n_train = 1437  # A fixed 80/20 split, the same on every machine.
  return Source(x[:n_train], y[:n_train], x[n_train:], y[n_train:], 10, 1 / 16)


def _mnist(params, seed: int) -> Source:
  """MNIST from --data_path (a local mnist.npz) or Keras' download."""
  if params.data_path:
    return _npz(params, seed)
  import keras
  try:
    (x_train, y_train), (x_test, y_test) = keras.datasets.mnist.load_data()
  except Exception as e:  # noqa: BLE001 (offline: any network error)
    raise DataError("--dataset=mnist: could not download MNIST "
                    f"({type(e).__name__}); pass --data_path=mnist.npz") from None
  return _checked("mnist", x_train, y_train, x_test, y_test)


def _npz(params, seed: int) -> Source:
  """Any .npz with x_train, y_train, x_test, y_test."""
  del seed
  path = params.data_path
  try:
    loaded = np.load(path, allow_pickle=False)
  except (OSError, ValueError, EOFError) as e:
    raise DataError(f"--data_path={path}: not a readable .npz "
                    f"({type(e).__name__}: {one_line(e)})") from None
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
                    f"({type(e).__name__}: {one_line(e)})") from None
  return _checked(path, *arrays)


def _synthetic(params, seed: int) -> Source:
  """Random examples of --synthetic_shape with random labels, for benchmarks."""
  rng = np.random.default_rng(seed)
  shape = tuple(params.synthetic_shape)
  n = params.synthetic_examples
  x = rng.standard_normal((n + max(1, n // 8),) + shape, dtype=np.float32)
  y = rng.integers(0, 10, size=len(x)).astype(np.int64)
  return Source(x[:n], y[:n], x[n:], y[n:], 10)


def _checked(name, x_train, y_train, x_test, y_test) -> Source:
  """Validates arrays and returns a Source (uint8 images scaled by 1/255)."""
  for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
    for array, named in ((x, f"x_{split}"), (y, f"y_{split}")):
      if array.ndim == 0:
        raise DataError(f"{name}: {named} is a single value; it must be an array "
                        "with one entry per example")
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


def _tfrecord(params, seed: int):
  del seed
  from trainer.tasks import image_records  # Imports TensorFlow: only when needed.
  return image_records.load_records(train_files=params.train_files,
                                    eval_files=params.eval_files,
                                    num_classes=params.num_classes)


_REGISTRY: Dict[str, Callable] = {
    "digits": _digits,
    "mnist": _mnist,
    "npz": _npz,
    "synthetic": _synthetic,
    "tfrecord": _tfrecord,
}


DATASETS = tuple(_REGISTRY)


def load_source(params, *, seed: int):
  """Loads the data set named by --dataset (tfrecord: finds its files).

  Args:
    params: the classification task's hyperparameters (dataset, data_path,
      train_files, eval_files, num_classes, synthetic_*).
    seed: the run's seed (of the synthetic data).

  Returns:
    The data set in memory (a Source), or in TFRecord files (a RecordSource).

  Raises:
    DataError: the data set is missing, malformed or has inconsistent arrays.
  """
  if params.data_path and not os.path.isfile(params.data_path):
    raise DataError(f"--data_path={params.data_path}: no such file")
  return _REGISTRY[params.dataset](params, seed)
