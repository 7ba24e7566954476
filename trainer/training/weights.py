"""Which weights a run evaluates and exports, swapped in for a block: the moving
averages (--ema_decay with --eval_with_ema), a best checkpoint's, or the model's
own, given back after."""

import contextlib

import tensorflow as tf

from trainer.training.checkpoint_files import model_variables


class Weights:
  """The model's weights and their moving averages, as evaluations see them.

  Example:

    with trainer.weights.evaluated():  # The averages with --eval_with_ema.
      metrics = evaluate(...)
    with trainer.weights.best("runs/r/checkpoints/best/ckpt-40"):
      export(...)
  """

  def __init__(self, *, model, averages: tuple, eval_with_ema: bool):
    """Args:
      model: the task's Keras model.
      averages: the moving average of each trainable variable (or none).
      eval_with_ema: evaluate and export the averages (--eval_with_ema).
    """
    self._model, self._averages = model, tuple(averages)
    self._use_averages = bool(self._averages) and eval_with_ema

  def reset_averages(self):
    """Starts the moving averages from the current weights."""
    for average, variable in zip(self._averages, self._model.trainable_variables):
      average.assign(variable)

  @contextlib.contextmanager
  def evaluated(self):
    """The weights to evaluate and export for the block: the moving averages
    with --eval_with_ema, then the raw weights back."""
    if not self._use_averages:
      yield
      return
    variables = self._model.trainable_variables
    with _values_kept(variables):
      self.use_evaluated()
      yield

  def use_evaluated(self):
    """Makes the evaluated weights (see `evaluated`) the model's own."""
    if self._use_averages:
      for variable, average in zip(self._model.trainable_variables, self._averages):
        variable.assign(average)

  def read(self, path: str):
    """Sets the model's (and averages') weights to the checkpoint's at `path`."""
    tf.train.Checkpoint(**self._groups()).read(path).expect_partial()

  @contextlib.contextmanager
  def best(self, path: str):
    """The model's (and averages') weights of the best checkpoint at `path`, for
    the block; the current ones back afterwards."""
    with _values_kept([v for group in self._groups().values() for v in group]):
      self.read(path)
      yield

  def _groups(self) -> dict:
    groups = {"model": model_variables(self._model)}
    if self._averages:
      groups["ema"] = list(self._averages)
    return groups


@contextlib.contextmanager
def _values_kept(variables):
  """Gives `variables` back the values they have now when the block ends."""
  kept = [tf.convert_to_tensor(v) for v in variables]  # Eager reads: copies.
  try:
    yield
  finally:
    for variable, value in zip(variables, kept):
      variable.assign(value)
