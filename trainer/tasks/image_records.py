"""--dataset=tfrecord: images and labels in tf.train.Example records.

The record layout (written by scripts/make_tfrecords.py, documented in docs/data.md):

  image/encoded      bytes   a PNG or JPEG image, or the raw array's bytes (C order)
  image/format       bytes   "png", "jpeg" or "raw"
  image/shape        int64s  [height, width, channels] (required for raw)
  image/dtype        bytes   "uint8" or "float32" (raw; PNG and JPEG are uint8)
  image/class/label  int64   the class, in [0, num_classes)

Every record of a data set has the first record's format, shape and dtype. The
shards' folder may hold a `dataset.json` index (records per file, num_classes,
scale); without one, --num_classes is needed and the records are counted at start.
"""

import dataclasses
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from trainer.data import record_files
from trainer.data.records import TFRecords
from trainer.errors import DataError

ENCODED, FORMAT, SHAPE, DTYPE, LABEL = ("image/encoded", "image/format", "image/shape",
                                        "image/dtype", "image/class/label")
FORMATS = ("png", "jpeg", "raw")
RAW_DTYPES = ("uint8", "float32")


def encode_example(image: np.ndarray, label: int, image_format: str) -> bytes:
  """One record of the layout above (image: [H, W, C])."""
  if image_format == "raw":
    encoded = np.ascontiguousarray(image).tobytes()
  elif image_format == "png":
    encoded = tf.io.encode_png(image).numpy()
  else:
    encoded = tf.io.encode_jpeg(image, quality=95).numpy()
  feature = {
      ENCODED: tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
      FORMAT: tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[image_format.encode()])),
      SHAPE: tf.train.Feature(int64_list=tf.train.Int64List(value=list(image.shape))),
      DTYPE: tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[str(image.dtype).encode()])),
      LABEL: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
  }
  return tf.train.Example(
      features=tf.train.Features(feature=feature)).SerializeToString()


@dataclasses.dataclass(frozen=True)
class Layout:
  """What every record of a data set holds, from its first record."""
  image_format: str
  dtype: str
  shape: tuple

  def batch_parser(self, num_classes: int):
    """`[batch] serialized -> (images, labels)`, checking the labels' range
    in-graph. One parse op per batch: several times faster than per record."""
    features = {ENCODED: tf.io.FixedLenFeature([], tf.string),
                LABEL: tf.io.FixedLenFeature([], tf.int64)}
    shape, image_format, dtype = list(self.shape), self.image_format, self.dtype

    def decode(encoded):
      return tf.ensure_shape(tf.io.decode_image(
          encoded, channels=shape[-1], expand_animations=False), shape)

    def parse_batch(serialized):
      example = tf.io.parse_example(serialized, features)
      labels = example[LABEL]
      in_range = tf.logical_and(labels >= 0, labels < num_classes)
      with tf.control_dependencies([tf.debugging.Assert(
          tf.reduce_all(in_range), [tf.strings.format(
              f"{LABEL} {{}} is out of range [0, {num_classes})",
              tf.boolean_mask(labels, tf.logical_not(in_range)))])]):
        labels = tf.identity(labels)
      if image_format == "raw":
        images = tf.reshape(tf.io.decode_raw(example[ENCODED], tf.as_dtype(dtype)),
                            [-1, *shape])
      else:
        images = tf.map_fn(decode, example[ENCODED],
                           fn_output_signature=tf.TensorSpec(shape, tf.uint8))
      return images, labels

    return parse_batch


def _first_example(paths, flag: str) -> tuple:
  """(path, tf.train.Example) of the first record in `paths`."""
  for path in paths:
    try:
      for serialized in tf.data.TFRecordDataset(path).take(1):
        return path, tf.train.Example.FromString(serialized.numpy())
    except tf.errors.OpError as e:
      raise DataError(f"{flag}: {path}: record 0: "
                      f"{record_files.error_line(e)}") from None
    except Exception as e:  # noqa: BLE001 (protobuf's DecodeError: not an Example)
      raise DataError(f"{flag}: {path}: record 0 is not a tf.train.Example "
                      f"({type(e).__name__})") from None
  raise DataError(f"{flag}: the {len(paths)} file(s) hold no records")


def read_layout(paths, *, flag: str) -> Layout:
  """The layout of the data set whose first record is in `paths`.

  Raises:
    DataError: naming the file and the missing or unsupported feature.
  """
  path, example = _first_example(paths, flag)
  feature = example.features.feature
  where = f"{flag}: {path}: record 0"
  for key in (ENCODED, LABEL):
    if key not in feature:
      raise DataError(f"{where}: has no {key} feature (see docs/data.md's record "
                      "layout)")
  image_format = (feature[FORMAT].bytes_list.value[0].decode() if FORMAT in feature
                  and feature[FORMAT].bytes_list.value else "png")
  if image_format not in FORMATS:
    raise DataError(f"{where}: {FORMAT}={image_format!r}; expected one of "
                    f"{', '.join(FORMATS)}")
  shape = tuple(feature[SHAPE].int64_list.value) if SHAPE in feature else ()
  dtype = "uint8"
  if image_format == "raw":
    dtype = (feature[DTYPE].bytes_list.value[0].decode() if DTYPE in feature
             and feature[DTYPE].bytes_list.value else "")
    if dtype not in RAW_DTYPES:
      raise DataError(f"{where}: raw images need {DTYPE} in {', '.join(RAW_DTYPES)}, "
                      f"got {dtype!r}")
    if len(shape) != 3 or min(shape) < 1:
      raise DataError(f"{where}: raw images need {SHAPE}=[height, width, channels], "
                      f"got {list(shape)}")
  elif len(shape) != 3:  # Not written: the first image's own.
    image = tf.io.decode_image(feature[ENCODED].bytes_list.value[0],
                               expand_animations=False)
    shape = tuple(int(d) for d in image.shape)
  return Layout(image_format, dtype, shape)


@dataclasses.dataclass(frozen=True)
class RecordSource:
  """A classification data set in TFRecord files (the arrays' Source twin).

  Attributes:
    train: the training files.
    test: the evaluation files, or None.
    input_shape: one image's shape.
    num_classes: number of classes.
    scale: factor that maps stored values to model inputs.
  """
  train: TFRecords
  test: Optional[TFRecords]
  input_shape: tuple
  num_classes: int
  scale: float

  def train_data(self):
    return self.train

  def eval_data(self):
    return self.test


def load_records(*, train_files: str, eval_files: Optional[str],
                 num_classes: int) -> RecordSource:
  """--train_files and --eval_files as a RecordSource.

  Raises:
    DataError: no file matches, a first record that does not fit the layout, or
      no number of classes (--num_classes or the index).
  """
  paths = record_files.glob_files(train_files, "--train_files")
  layout = read_layout(paths, flag="--train_files")
  index = record_files.read_index_file(os.path.dirname(paths[0])) or {}
  try:
    num_classes = num_classes or int(index.get("num_classes", 0))
    scale = float(index.get("scale", 1 / 255 if layout.dtype == "uint8" else 1.0))
  except (TypeError, ValueError):
    raise DataError(f"--train_files: {os.path.dirname(paths[0])}/"
                    f"{record_files.INDEX_FILE} has num_classes or scale that are not "
                    "numbers; rewrite it with scripts/make_tfrecords.py --index"
                    ) from None
  if num_classes < 1:
    raise DataError(f"--num_classes: needed with --dataset=tfrecord when the shards' "
                    f"folder has no {record_files.INDEX_FILE} with num_classes (write "
                    "one with scripts/make_tfrecords.py --index)")
  parse_batch = layout.batch_parser(num_classes)
  train = TFRecords(tuple(paths), parse_batch=parse_batch,
                                flag="--train_files")
  test = None
  if eval_files:
    test = TFRecords(eval_files, parse_batch=parse_batch,
                                 flag="--eval_files")
  return RecordSource(train, test, layout.shape, num_classes, scale)
