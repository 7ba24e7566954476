"""Keras's example "Imbalanced classification: credit card fraud detection"
(keras.io/examples/structured_data/imbalanced_classification) with
`model.fit(...)` replaced by `trainer.fit(build, ...)`:

    python examples/fit_imbalanced.py
    python examples/fit_imbalanced.py --cpu_devices=2     # 2 replicas
    python scripts/launch_workers.py --num_workers=2 -- \\
        python examples/fit_imbalanced.py                 # 2 workers

The model's construction and compile moved into `build()`; the rest is the
example's: its class weights, its seven metrics, its ModelCheckpoint of every
epoch. (Keras's `fit` crashes on this program under MirroredStrategy when the
last batch is uneven; here every batch is whole, on any number of replicas.)

The credit-card data needs a download, so the data is one that ships with
scikit-learn: the breast-cancer set, its malignant cases thinned to 40, as rare
as a fraud is here ("fraud" = malignant), 397 rows. The batch is 64, not 2048:
the training set has 318 rows.
"""

import keras
import numpy as np
from sklearn.datasets import load_breast_cancer

import trainer

"""
## First, vectorize the CSV data
"""

features, benign = load_breast_cancer(return_X_y=True)
rng = np.random.default_rng(0)
keep = np.concatenate([rng.choice(np.flatnonzero(benign == 0), 40, replace=False),
                       np.flatnonzero(benign == 1)])
rng.shuffle(keep)
all_features = features[keep].astype("float32")
all_targets = (benign[keep] == 0).astype("uint8")[:, None]

print("all_features.shape:", all_features.shape)
print("all_targets.shape:", all_targets.shape)

"""
## Prepare a validation set
"""

num_val_samples = int(len(all_features) * 0.2)
train_features = all_features[:-num_val_samples]
train_targets = all_targets[:-num_val_samples]
val_features = all_features[-num_val_samples:]
val_targets = all_targets[-num_val_samples:]

print("Number of training samples:", len(train_features))
print("Number of validation samples:", len(val_features))

"""
## Analyze class imbalance in the targets
"""

counts = np.bincount(train_targets[:, 0])
print(
    "Number of positive samples in training data: {} ({:.2f}% of total)".format(
        counts[1], 100 * float(counts[1]) / len(train_targets)
    )
)

weight_for_0 = 1.0 / counts[0]
weight_for_1 = 1.0 / counts[1]

"""
## Normalize the data using training set statistics
"""

mean = np.mean(train_features, axis=0)
train_features -= mean
val_features -= mean
std = np.std(train_features, axis=0)
train_features /= std
val_features /= std

"""
## Build a binary classification model
"""


def build():
  model = keras.Sequential(
      [
          keras.Input(shape=train_features.shape[1:]),
          keras.layers.Dense(256, activation="relu"),
          keras.layers.Dense(256, activation="relu"),
          keras.layers.Dropout(0.3),
          keras.layers.Dense(256, activation="relu"),
          keras.layers.Dropout(0.3),
          keras.layers.Dense(1, activation="sigmoid"),
      ]
  )

  metrics = [
      keras.metrics.FalseNegatives(name="fn"),
      keras.metrics.FalsePositives(name="fp"),
      keras.metrics.TrueNegatives(name="tn"),
      keras.metrics.TruePositives(name="tp"),
      keras.metrics.Precision(name="precision"),
      keras.metrics.Recall(name="recall"),
  ]

  model.compile(
      optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy",
      metrics=metrics
  )
  return model


"""
## Train the model with `class_weight` argument
"""

callbacks = [keras.callbacks.ModelCheckpoint("fraud_model_at_epoch_{epoch}.keras")]
class_weight = {0: weight_for_0, 1: weight_for_1}

history = trainer.fit(
    build,
    train_features,
    train_targets,
    batch_size=64,
    epochs=30,
    verbose=2,
    callbacks=callbacks,
    validation_data=(val_features, val_targets),
    class_weight=class_weight,
    model_dir="runs/fit_imbalanced",
)
model = history.model
model.summary()
