"""Data sets (`sources`) and their tf.data pipelines (`pipeline`)."""

from trainer.data.pipeline import distribute, eval_dataset, train_dataset
from trainer.data.sources import Source, load_source

__all__ = ["Source", "distribute", "eval_dataset", "load_source", "train_dataset"]
