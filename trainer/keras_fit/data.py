"""fit()'s data arguments as a Task's data: numpy arrays (or dicts or lists of
them) with `sample_weight`, `validation_split` and `validation_data`, or batched
`tf.data` datasets as Keras takes them.

An epoch is `steps_per_epoch` global batches of `batch_size` examples; by
default the training examples over the batch, rounded down: the framework's
training batches are always full (drop_remainder), so an epoch leaves out
Keras's last partial batch (another one in each epoch's permutation).
"""

import dataclasses
import math
from typing import Optional

import numpy as np
import tensorflow as tf

from trainer.data.base import count_elements
from trainer.data.dataset_graph import batching
from trainer.errors import ConfigError

DEFAULT_BATCH_SIZE = 32  # Keras's, for arrays.
INPUT, OUTPUT = "input", "output"  # The keys of a list's arrays: INPUT_0, ...


@dataclasses.dataclass(frozen=True)
class FitData:
  """What fit()'s data arguments say.

  Attributes:
    train: Task.train_data's value: (features, labels[, weights]) arrays, or a
      batched tf.data.Dataset (the framework unbatches it).
    validation: Task.eval_data's value, or None.
    batch_size: the global batch.
    steps_per_epoch: global batches per epoch.
    positional_features: the features were a list, one per model input, kept
      as a dict in their order ("input_0", ...).
    positional_labels: the labels were a list, one per output, kept as a dict
      in their order ("output_0", ...).
  """
  train: object
  validation: object
  batch_size: int
  steps_per_epoch: int
  positional_features: bool = False
  positional_labels: bool = False

  @property
  def is_dataset(self) -> bool:
    return isinstance(self.train, tf.data.Dataset)


def _refuse(argument: str, message: str):
  raise ConfigError(f"fit({argument}=...): {message}")


def _arrays(value, argument: str, *, prefix: str):
  """An argument's arrays: one array, or a dict of them (a list becomes a dict
  in its order: "PREFIX_0", "PREFIX_1", ...)."""
  if isinstance(value, dict):
    return {key: _array(v, f"{argument}[{key!r}]") for key, v in value.items()}
  if isinstance(value, (list, tuple)):
    return {f"{prefix}_{i}": _array(v, argument) for i, v in enumerate(value)}
  return _array(value, argument)


def _array(value, argument: str) -> np.ndarray:
  if hasattr(value, "to_numpy"):  # A pandas DataFrame or Series.
    value = value.to_numpy()
  if isinstance(value, (tf.Tensor, tf.Variable)):
    value = value.numpy()
  if not isinstance(value, np.ndarray):
    kind = type(value).__name__
    _refuse(argument, f"a {kind}: trainer.fit takes numpy arrays (or dicts or "
            "lists of them) or a tf.data.Dataset, whose order it fixes by "
            "(seed, step) for an exact resume (a Python generator or "
            "keras.utils.PyDataset cannot be read again from a step)")
  return value


def _count(value) -> int:
  return len(tf.nest.flatten(value)[0])


def _take(value, start: int, stop: int):
  return tf.nest.map_structure(lambda a: a[start:stop], value)


def _weights(sample_weight, argument: str):
  if sample_weight is None:
    return None
  if isinstance(sample_weight, (dict, list, tuple)):
    _refuse(argument, "one weight per example (an array of shape [examples]); "
            "trainer.fit takes no per-output sample weights")
  weights = _array(sample_weight, argument)
  if weights.ndim != 1:
    _refuse(argument, f"one weight per example, shape [examples], got shape "
            f"{weights.shape} (temporal weights are not supported)")
  return weights


def _batch_of(dataset: tf.data.Dataset, argument: str) -> int:
  """The batch size of a batched dataset (that of its first batch). Keras's fit
  takes batches: a dataset whose graph shows single examples is refused, one
  from an opaque source (a generator) is taken as batches, as Keras takes it.

  Raises:
    ConfigError: it yields single examples, or nothing, or its graph cannot
      tell.
  """
  found = batching(dataset)
  if found.depth is None:
    _refuse(argument, f"cannot tell whether its elements are batches: {found.why}")
  if found.depth == 0 and not found.opaque:
    _refuse(argument, "a dataset of single examples; Keras's fit takes batches: "
            "batch it (dataset.batch(32))")
  for element in dataset.take(1):
    return int(tf.shape(tf.nest.flatten(element)[0])[0])
  _refuse(argument, "an empty dataset")


def fit_data(x, y, *, batch_size: Optional[int], sample_weight, validation_split,
             validation_data, steps_per_epoch: Optional[int],
             validation_steps: Optional[int],
             validation_batch_size: Optional[int] = None) -> FitData:
  """Checks fit()'s data arguments and returns what the Task serves.

  Raises:
    ConfigError: naming the argument and what would be valid.
  """
  if validation_split and validation_data is not None:
    _refuse("validation_split", "give validation_split or validation_data, not "
            "both (Keras silently uses validation_data)")
  if not 0.0 <= validation_split < 1.0:
    _refuse("validation_split", f"{validation_split}: must be in [0, 1)")
  if isinstance(x, tf.data.Dataset):
    for argument, value in (("y", y), ("sample_weight", sample_weight),
                            ("batch_size", batch_size)):
      if value is not None:
        _refuse(argument, "not with a dataset: its elements hold the labels and "
                "weights, its batches the batch size (as Keras's fit)")
    if validation_split:
      _refuse("validation_split", "not with a dataset (Keras splits arrays "
              "only): give validation_data")
    batch = _batch_of(x, "x")
    if steps_per_epoch is None and int(x.cardinality()) == tf.data.INFINITE_CARDINALITY:
      _refuse("steps_per_epoch", "required with an infinite dataset (as Keras's "
              "fit), e.g. steps_per_epoch=100")
    examples = None if steps_per_epoch else count_elements(x.unbatch())
    train = x.unbatch()  # The framework batches its examples again.
    positional = (False, False)
  else:
    if x is None or y is None:
      _refuse("y" if x is not None else "x", "required with arrays: trainer.fit "
              "trains the compiled loss on labels")
    features = _arrays(x, "x", prefix=INPUT)
    labels = _arrays(y, "y", prefix=OUTPUT)
    weights = _weights(sample_weight, "sample_weight")
    positional = (isinstance(x, (list, tuple)), isinstance(y, (list, tuple)))
    batch = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    if validation_split:
      arrays = (features, labels) + (() if weights is None else (weights,))
      total = _count(features)
      split_at = int(math.floor(total * (1.0 - validation_split)))
      if split_at in (0, total):
        _refuse("validation_split", f"{validation_split} of {total} examples "
                "leaves no training or no validation example")
      train, validation_data = (_take(arrays, 0, split_at),
                                _take(arrays, split_at, total))
    else:
      train = (features, labels) + (() if weights is None else (weights,))
    examples = _count(train[0])
  if not (isinstance(batch, int) and batch >= 1):
    _refuse("batch_size", f"{batch!r}: must be an int >= 1")
  if steps_per_epoch is None:
    steps_per_epoch = examples // batch
    if steps_per_epoch < 1:
      _refuse("batch_size", f"{batch}: more than the {examples} training "
              "examples (the framework's batches are always full)")
  elif not (isinstance(steps_per_epoch, int) and steps_per_epoch >= 1):
    _refuse("steps_per_epoch", f"{steps_per_epoch!r}: must be an int >= 1")
  return FitData(train=train, validation=_validation(
                     validation_data, validation_steps,
                     validation_batch_size or batch),
                 batch_size=batch, steps_per_epoch=steps_per_epoch,
                 positional_features=positional[0], positional_labels=positional[1])


def _validation(value, steps: Optional[int], batch: int):
  """validation_data as Task.eval_data's value: its first `steps` batches (of
  `batch` examples, validation_batch_size or batch_size, for arrays), as
  examples."""
  if value is None:
    if steps is not None:
      _refuse("validation_steps", "without validation data")
    return None
  if steps is not None and not (isinstance(steps, int) and steps >= 1):
    _refuse("validation_steps", f"{steps!r}: must be an int >= 1")
  if isinstance(value, tf.data.Dataset):
    _batch_of(value, "validation_data")
    return (value if steps is None else value.take(steps)).unbatch()
  if not (isinstance(value, (tuple, list)) and len(value) in (2, 3)):
    _refuse("validation_data", "(x_val, y_val), (x_val, y_val, sample_weight) "
            "or a tf.data.Dataset")
  arrays = (_arrays(value[0], "validation_data", prefix=INPUT),
            _arrays(value[1], "validation_data", prefix=OUTPUT))
  if len(value) == 3 and value[2] is not None:
    arrays += (_weights(value[2], "validation_data"),)
  return arrays if steps is None else _take(arrays, 0, steps * batch)
