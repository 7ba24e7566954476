"""A task's data as distributed tf.data pipelines of global batches."""

from trainer.data.pipeline import (ArrayData, StreamData, as_task_data,
                                   count_examples, distribute, eval_dataset,
                                   example_indices, feature_spec, train_dataset)

__all__ = ["ArrayData", "StreamData", "as_task_data", "count_examples", "distribute",
           "eval_dataset", "example_indices", "feature_spec", "train_dataset"]
