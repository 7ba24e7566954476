"""A task's data as distributed tf.data pipelines of global batches.

A task returns arrays, a tf.data.Dataset, `TFRecords` files, or a function that
builds one input pipeline's dataset; `inputs.train_input` and `inputs.eval_input`
turn any of them into the distributed input of the train and eval loops.
"""

from trainer.data.gather import GatherInput
from trainer.data.gather import fits as gather_fits
from trainer.data.inputs import (PipelineData, describe, eval_input, host_batches,
                                 input_error, input_pipelines, is_per_pipeline,
                                 train_input)
from trainer.data.pipeline import (ArrayData, StreamData, as_task_data,
                                   count_examples, distribute, eval_dataset,
                                   example_indices, feature_spec, train_dataset)
from trainer.data.records import INDEX_FILE, TFRecords, read_index_file, write_index

__all__ = ["ArrayData", "GatherInput", "INDEX_FILE", "PipelineData", "StreamData", "TFRecords",
           "as_task_data", "count_examples", "describe", "distribute", "eval_dataset",
           "eval_input", "example_indices", "feature_spec", "gather_fits", "host_batches", "input_error",
           "input_pipelines", "is_per_pipeline", "read_index_file", "train_dataset",
           "train_input", "write_index"]
