"""A task's data, whatever its kind, as the distributed input of the loops.

`as_task_data` wraps what a task returns (arrays, a tf.data.Dataset, `TFRecords`
files or a pipeline function) in a `TaskData` (base.py), the one interface the
rest of the framework uses.
"""

import tensorflow as tf

from trainer.data import preprocessed, records
from trainer.data.arrays import ArrayData, check_arrays, example_indices
from trainer.data.gather import GatherInput
from trainer.data.base import Order, TaskData
from trainer.data.record_files import INDEX_FILE, read_index_file, write_index
from trainer.data.records import TFRecords
from trainer.data.pipelines import PipelineData, check_pipeline
from trainer.data.streams import StreamData, check_stream


def as_task_data(value, *, what: str, finite: bool = False) -> TaskData:
  """Checks a task's data and wraps it in its TaskData.

  Args:
    value: `(features, labels)` arrays (or nests of arrays), a tf.data.Dataset
      of `(features, labels)` elements, `TFRecords` files, or a function
      `input_context -> tf.data.Dataset` building one input pipeline's part.
    what: where it came from, for errors (e.g. "Task.train_data()").
    finite: it must be finite (an eval split); a stream is counted now, once.

  Raises:
    DataError: naming `what` and what is wrong.
  """
  if isinstance(value, TFRecords):
    return records.resolve(value, what=what)
  if isinstance(value, tf.data.Dataset):
    return check_stream(value, what=what, finite=finite)
  if callable(value):
    return check_pipeline(value, what=what, finite=finite)
  return check_arrays(value, what=what)


__all__ = ["ArrayData", "GatherInput", "INDEX_FILE", "Order", "PipelineData",
           "StreamData", "TFRecords", "TaskData", "as_task_data", "example_indices",
           "preprocessed", "read_index_file", "write_index"]
