"""The built-in regression task: disease progression on scikit-learn's diabetes
data set (442 patients, 10 standardised features; bundled, so offline).

The model predicts the standardised target; the loss is the mean squared error in
those units, and `mae`, `mse` and `rmse` are reported in the target's own units.
The exported signature returns predictions in the target's units too.
"""

import dataclasses
import functools

import numpy as np

from trainer.tasks.base import Task, check_hyperparameters, hyperparameter

_TRAIN_EXAMPLES = 353  # A fixed 80/20 split, the same on every machine.


@dataclasses.dataclass(frozen=True)
class _Diabetes:
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  mean: float  # Of the training targets: z = (y - mean) / std.
  std: float


def load_diabetes() -> _Diabetes:
  """The diabetes data set, split 353/89, targets standardised by the train split."""
  from sklearn.datasets import load_diabetes as sklearn_diabetes
  x, y = sklearn_diabetes(return_X_y=True)
  x, y = x.astype(np.float32), y.astype(np.float32)
  mean = float(y[:_TRAIN_EXAMPLES].mean())
  std = float(y[:_TRAIN_EXAMPLES].std())
  z = ((y - mean) / std)[:, None]
  return _Diabetes(x[:_TRAIN_EXAMPLES], z[:_TRAIN_EXAMPLES], x[_TRAIN_EXAMPLES:],
                   z[_TRAIN_EXAMPLES:], mean, std)


@dataclasses.dataclass
class Regression(Task):
  """An MLP regressor: `hidden` units per layer, `layers` hidden layers."""

  hidden: int = hyperparameter(64, "Units of each hidden layer.", lower=1)
  layers: int = hyperparameter(2, "Hidden layers.", lower=0)
  l2: float = hyperparameter(0.0, "L2 weight regularization factor on kernels.",
                             lower=0.0)

  layout_fields = ("hidden", "layers", "l2")

  def __post_init__(self):
    check_hyperparameters(self)

  @functools.cached_property
  def data(self) -> _Diabetes:
    return load_diabetes()

  def build_model(self):
    import keras
    regularizer = keras.regularizers.L2(self.l2) if self.l2 else None
    model = keras.Sequential(name="regression")
    for _ in range(self.layers):
      model.add(keras.layers.Dense(self.hidden, activation="relu",
                                   kernel_regularizer=regularizer))
    model.add(keras.layers.Dense(1, dtype="float32", kernel_regularizer=regularizer))
    return model

  def train_data(self):
    return self.data.x_train, self.data.y_train

  def eval_data(self):
    return self.data.x_test, self.data.y_test

  def loss(self, labels, outputs):
    import tensorflow as tf
    return tf.reduce_mean(tf.square(tf.cast(outputs, tf.float32) - labels), axis=-1)

  def metrics(self, labels, outputs):
    import tensorflow as tf
    error = (tf.cast(outputs, tf.float32) - labels) * self.data.std
    return {"mae": tf.reduce_mean(tf.abs(error), axis=-1),
            "mse": tf.reduce_mean(tf.square(error), axis=-1)}

  def finalize_metrics(self, means, *, sums, examples):
    del sums, examples
    return dict(means, rmse=float(np.sqrt(means["mse"])))

  def serving_outputs(self, outputs):
    return {"predictions": outputs * self.data.std + self.data.mean}
