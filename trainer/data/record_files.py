"""TFRecord files on disk: globbing them, their `dataset.json` index of records per
file, counting records, and finding the first bad record of a file."""

import json
import os
import re
from typing import Optional

import tensorflow as tf

from trainer.data.base import count_elements
from trainer.errors import DataError, one_line

INDEX_FILE = "dataset.json"  # Records per file (and a data set's facts), per folder.


def size(path: str) -> int:
  return tf.io.gfile.stat(path).length


def glob_files(files, flag: str) -> list:
  """The sorted files a glob (or list of globs) names.

  Raises:
    DataError: a pattern matches no file.
  """
  patterns = [files] if isinstance(files, str) else list(files)
  paths = []
  for pattern in patterns:
    try:
      matched = sorted(tf.io.gfile.glob(pattern))
    except tf.errors.OpError as e:
      raise DataError(f"{flag}={pattern}: cannot list files "
                      f"({error_line(e)})") from None
    matched = [p for p in matched if not tf.io.gfile.isdir(p)
               and os.path.basename(p) != INDEX_FILE]
    if not matched:
      raise DataError(f"{flag}={pattern}: no file matches")
    paths += matched
  return paths


def error_line(error: Exception) -> str:
  """A record error's message without TensorFlow's op and dataset decorations."""
  message = getattr(error, "message", None) or str(error)
  message = re.sub(r"Error in user-defined function passed to \S+ transformation "
                   r"with iterator: \S+: ", "", message)
  message = re.sub(r"assertion failed: \[(.*)\]", r"\1", one_line(message))
  return " ".join(message.replace("Name: <unknown>, ", "").split())


def read_index(paths) -> Optional[list]:
  """Records per file from each folder's dataset.json, or None when a file is not
  in an index or its size differs from the index's (a stale index)."""
  indexes, counts = {}, []
  for path in paths:
    folder = os.path.dirname(path)
    if folder not in indexes:
      indexes[folder] = read_index_file(folder)
    try:
      entry = indexes[folder]["files"][os.path.basename(path)]
      if entry["bytes"] != size(path):
        return None
      counts.append(int(entry["records"]))
    except (TypeError, KeyError, ValueError):  # No index, or not one we wrote.
      return None
  return counts


def read_index_file(folder: str) -> Optional[dict]:
  """A folder's dataset.json, or None if it has none (or it is unreadable)."""
  path = os.path.join(folder, INDEX_FILE)
  try:
    with tf.io.gfile.GFile(path) as f:
      index = json.load(f)
  except (tf.errors.OpError, ValueError):
    return None
  return index if isinstance(index, dict) else None


def write_index(folder: str, paths, **facts) -> dict:
  """Writes (or updates) `folder`/dataset.json with the records of `paths`.

  Args:
    folder: the shards' folder.
    paths: files in it to count and list.
    **facts: more keys for the index (e.g. num_classes, scale).

  Returns:
    The index.
  """
  index = read_index_file(folder) or {}
  files = index.setdefault("files", {})
  for path in paths:
    files[os.path.basename(path)] = {"records": count_records(path, flag=path),
                                     "bytes": size(path)}
  index.update(facts)
  temporary = os.path.join(folder, f".{INDEX_FILE}.tmp")
  with tf.io.gfile.GFile(temporary, "w") as f:
    json.dump(index, f, indent=1, sort_keys=True)
  tf.io.gfile.rename(temporary, os.path.join(folder, INDEX_FILE), overwrite=True)
  return index


def count_records(path: str, *, flag: str) -> int:
  """Reads a file to count its records.

  Raises:
    DataError: naming the file and the first corrupt record.
  """
  try:
    return count_elements(tf.data.TFRecordDataset(path))
  except tf.errors.OpError:
    raise DataError(f"{flag}: {bad_record(path)}") from None


def bad_record(path: str, parse=None) -> Optional[str]:
  """"FILE: record N: what is wrong" for the first record of `path` that cannot be
  read (or parsed by `parse`: serialized records -> parsed ones, if given), or
  None if every record is fine."""
  dataset = tf.data.TFRecordDataset(path)
  if parse is not None:
    dataset = parse(dataset)
  try:
    count_elements(dataset)  # Fast: in-graph.
    return None
  except tf.errors.OpError:
    pass
  good = 0
  try:
    for _ in dataset:  # Again, one record at a time, to say which one.
      good += 1
  except tf.errors.OpError as e:
    return f"{path}: record {good}: {error_line(e)}"
  return None
