#!/usr/bin/env python
"""Writes a data set as sharded TFRecord files for --dataset=tfrecord.

  python scripts/make_tfrecords.py --dataset=digits --out=data/digits --shards=8
  python scripts/make_tfrecords.py --dataset=npz --data_path=my.npz --out=data/my
  python scripts/make_tfrecords.py --index='data/imagenet/*.tfrecord' --num_classes=1000

Writes OUT/train-00000-of-00008.tfrecord ... and OUT/test-*-of-00008.tfrecord (the
same number of shards each, examples in their order, split into contiguous runs)
in the record layout of trainer/tasks/image_records.py (see docs/data.md), and
OUT/dataset.json: records per file, num_classes and scale, which the trainer reads
instead of counting the records at start. --index writes only dataset.json, for
shards made elsewhere.
"""

import os
import sys

from trainer.argparsing import ArgumentParser
from trainer.errors import TrainerError
from trainer.tasks.classification import Classification
from trainer.tasks.image_data import DATASETS

FORMATS = ("auto", "png", "jpeg", "raw")


def _parser() -> ArgumentParser:
  parser = ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--dataset", choices=[d for d in DATASETS if d != "tfrecord"],
                      default="digits", help="the built-in data set to convert")
  parser.add_argument("--data_path", help=".npz (for npz, or a local mnist.npz)")
  parser.add_argument("--out", help="folder to write the shards and index into")
  parser.add_argument("--shards", type=int, default=8,
                      help="files per split (train and test each)")
  parser.add_argument("--format", choices=FORMATS, default="auto",
                      help="png for uint8 images with 1, 3 or 4 channels under auto, "
                      "raw otherwise")
  parser.add_argument("--index", help="glob of existing shards: only write their "
                      "folder's dataset.json")
  parser.add_argument("--num_classes", type=int, default=0,
                      help="with --index: the number of classes to record")
  parser.add_argument("--overwrite", action="store_true",
                      help="replace shards already in --out")
  return parser


def _write_split(out, split, images, labels, shards, image_format):
  from trainer.tasks import image_records
  import numpy as np
  import tensorflow as tf
  paths = []
  for shard, indices in enumerate(np.array_split(np.arange(len(images)), shards)):
    name = f"{split}-{shard:05d}-of-{shards:05d}.tfrecord"
    path, temporary = os.path.join(out, name), os.path.join(out, f".{name}.tmp")
    with tf.io.TFRecordWriter(temporary) as writer:  # Hidden from train-* globs.
      for i in indices:
        writer.write(image_records.encode_example(images[i], labels[i], image_format))
    os.replace(temporary, path)
    paths.append(path)
  return paths


def _storable(images, image_format: str):
  """The images in a dtype the record layout holds (raw: uint8 or float32).

  Raises:
    TrainerError: integers outside 0..255, or a type that is not a number.
  """
  import numpy as np
  if image_format != "raw" or images.dtype.name in ("uint8", "float32"):
    return images
  if np.issubdtype(images.dtype, np.floating):
    return images.astype(np.float32)
  if np.issubdtype(images.dtype, np.integer) and images.min() >= 0 and (
      images.max() <= 255):
    return images.astype(np.uint8)
  raise TrainerError(f"--format=raw: {images.dtype} values (from {images.min()} to "
                     f"{images.max()}) cannot be stored as uint8 or float32 exactly; "
                     "convert the arrays first")


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  try:
    if args.index:
      return _index(args)
    if not args.out:
      raise TrainerError("--out: needed (the folder to write the shards into)")
    if args.shards < 1:
      raise TrainerError(f"--shards={args.shards}: must be >= 1")
    params = Classification(dataset=args.dataset, data_path=args.data_path)
    from trainer import tf_loader
    tf_loader.load_tensorflow()
    from trainer import data  # Imports TensorFlow.
    from trainer.tasks import image_data
    source = image_data.load_source(params, seed=0)
    existing = [n for n in os.listdir(args.out) if n.endswith(".tfrecord") or
                n == data.INDEX_FILE] if os.path.isdir(args.out) else []
    shards = [n for n in existing if n.endswith(".tfrecord")]
    if shards and not args.overwrite:
      raise TrainerError(f"--out={args.out}: already holds {len(shards)} .tfrecord "
                         "file(s); pass --overwrite or another folder")
    channels = source.x_train.shape[-1] if source.x_train.ndim == 4 else 0
    image_format = args.format
    if image_format == "auto":
      image_format = ("png" if source.x_train.dtype.name == "uint8" and
                      channels in (1, 3, 4) else "raw")
    allowed = (1, 3) if image_format == "jpeg" else (1, 3, 4)
    if image_format != "raw" and (source.x_train.dtype.name != "uint8" or
                                  channels not in allowed):
      raise TrainerError(f"--format={image_format}: needs uint8 images with "
                         f"{' or '.join(map(str, allowed))} channels; {args.dataset} "
                         f"has {source.x_train.dtype} shape "
                         f"{source.x_train.shape[1:]} (use --format=raw)")
    x_train = _storable(source.x_train, image_format)
    x_test = _storable(source.x_test, image_format)
    if x_train.ndim == 2:  # Vectors: images of one row, one channel.
      x_train, x_test = x_train[:, None, :, None], x_test[:, None, :, None]
    os.makedirs(args.out, exist_ok=True)
    for name in existing:  # --overwrite: no old shard may stay for a glob to read.
      os.remove(os.path.join(args.out, name))
    paths = (_write_split(args.out, "train", x_train, source.y_train, args.shards,
                          image_format) +
             _write_split(args.out, "test", x_test, source.y_test, args.shards,
                          image_format))
    data.write_index(args.out, paths, num_classes=source.num_classes,
                     scale=source.scale)
  except TrainerError as e:
    print(f"make_tfrecords.py: error: {e}", file=sys.stderr)
    return int(e.exit_code)
  print(f"wrote {len(paths)} files ({len(source.y_train)} train and "
        f"{len(source.y_test)} test records, {image_format}) and "
        f"{data.INDEX_FILE} to {args.out}")
  return 0


def _index(args) -> int:
  from trainer import tf_loader
  tf_loader.load_tensorflow()
  from trainer import data  # Imports TensorFlow.
  from trainer.data import record_files
  paths = record_files.glob_files(args.index, "--index")
  folders = sorted({os.path.dirname(p) for p in paths})
  facts = {"num_classes": args.num_classes} if args.num_classes else {}
  for folder in folders:
    data.write_index(folder, [p for p in paths if os.path.dirname(p) == folder],
                     **facts)
  print(f"indexed {len(paths)} files in {', '.join(folders)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
