"""Keras's example "Imbalanced classification: credit card fraud detection"
(keras.io/examples/structured_data/imbalanced_classification), as its user runs
it: `python examples/keras_imbalanced.py`.

The credit-card data needs a download, so the data is one that ships with
scikit-learn: the breast-cancer set, its malignant cases thinned to 1 in 10, as
rare as a fraud is here ("fraud" = malignant). The batch is 64, not 2048: the
training set has 320 examples. Its port to a `trainer.Task` is
examples/imbalanced_task.py, which reuses `load_data`, `build_model` and
`make_metrics` from here.
"""

import keras
import numpy as np
from sklearn.datasets import load_breast_cancer

TRAIN_EXAMPLES = 320


def load_data(seed=0):
  """((train_features, train_targets), (val_features, val_targets)), normalised
  by the training set's mean and standard deviation, targets of shape [n, 1]."""
  features, benign = load_breast_cancer(return_X_y=True)
  rng = np.random.default_rng(seed)
  malignant = np.flatnonzero(benign == 0)
  keep = np.concatenate([rng.choice(malignant, 40, replace=False),
                         np.flatnonzero(benign == 1)])
  rng.shuffle(keep)
  features = features[keep].astype("float32")
  targets = (benign[keep] == 0).astype("float32")[:, None]
  train_features, val_features = (features[:TRAIN_EXAMPLES],
                                   features[TRAIN_EXAMPLES:])
  train_targets, val_targets = targets[:TRAIN_EXAMPLES], targets[TRAIN_EXAMPLES:]
  mean, std = np.mean(train_features, axis=0), np.std(train_features, axis=0)
  train_features = (train_features - mean) / std
  val_features = (val_features - mean) / std
  return (train_features, train_targets), (val_features, val_targets)


def class_weights(train_targets):
  """The example's weights: one over each class's count."""
  counts = np.bincount(train_targets[:, 0].astype(int))
  return {0: 1.0 / counts[0], 1: 1.0 / counts[1]}


def build_model(input_shape, dropout=0.3):
  return keras.Sequential([
      keras.Input(shape=input_shape),
      keras.layers.Dense(256, activation="relu"),
      keras.layers.Dense(256, activation="relu"),
      keras.layers.Dropout(dropout),
      keras.layers.Dense(256, activation="relu"),
      keras.layers.Dropout(dropout),
      keras.layers.Dense(1, activation="sigmoid"),
  ])


def make_metrics():
  return [
      keras.metrics.FalseNegatives(name="fn"),
      keras.metrics.FalsePositives(name="fp"),
      keras.metrics.TrueNegatives(name="tn"),
      keras.metrics.TruePositives(name="tp"),
      keras.metrics.Precision(name="precision"),
      keras.metrics.Recall(name="recall"),
      keras.metrics.AUC(name="auc"),
  ]


def train(*, epochs=30, batch_size=64, dropout=0.3, shuffle=True, seed=0,
          verbose=2):
  """Trains as the example does; returns (model, history)."""
  keras.utils.set_random_seed(seed)
  (train_features, train_targets), validation = load_data()
  model = build_model(train_features.shape[1:], dropout=dropout)
  model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy",
                metrics=make_metrics())
  history = model.fit(train_features, train_targets, batch_size=batch_size,
                      epochs=epochs, verbose=verbose, shuffle=shuffle,
                      validation_data=validation,
                      class_weight=class_weights(train_targets))
  return model, history


if __name__ == "__main__":
  train()
