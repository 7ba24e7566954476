"""The built-in default task: classification of --dataset with --model.

Sparse categorical cross-entropy over the model's logits, and accuracy. The data
sets (digits, mnist, npz, synthetic) are in `image_data`, TFRecord files
(tfrecord) in `image_records`, the models (cnn, mlp, resnet) in `image_models`.
Its hyperparameters are its fields: `--task.dataset=mnist`, or the short
`--dataset=mnist`, which the framework keeps as an alias.
"""

import dataclasses
import math
import os
from typing import Optional, Tuple

from trainer.flag_spelling import flag_value
from trainer.errors import ConfigError
from trainer.tasks import image_data
from trainer.tasks.base import (RunContext, Task, check_hyperparameters,
                                hyperparameter)

MODELS = ("cnn", "mlp", "resnet")  # image_models' registry (it imports Keras).
MAX_SYNTHETIC_VALUES = 2**28  # 1 GiB of float32.


@dataclasses.dataclass
class Classification(Task):
  """Classifies --dataset's examples into its classes with --model's logits."""

  dataset: str = hyperparameter(
      "digits", "Classification: digits (8x8, scikit-learn's, shipped inside "
      "trainer, offline), mnist, npz (any .npz with x_train, y_train, x_test, "
      "y_test), synthetic, or tfrecord (--train_files, --eval_files).",
      choices=image_data.DATASETS)
  data_path: Optional[str] = hyperparameter(
      None, "A local .npz file: required for npz; for mnist, a local mnist.npz "
      "instead of the download.")
  train_files: Optional[str] = hyperparameter(
      None, "--dataset=tfrecord: glob of the training shards (tf.train.Example "
      "records, see docs/data.md's record layout), e.g. 'data/digits/train-*'.")
  eval_files: Optional[str] = hyperparameter(
      None, "--dataset=tfrecord: glob of the evaluation shards (optional).")
  num_classes: int = hyperparameter(
      0, "--dataset=tfrecord: number of classes (0 = from the shards' dataset.json "
      "index, written by scripts/make_tfrecords.py).", lower=0, upper=100_000)
  synthetic_examples: int = hyperparameter(
      2048, "Training examples of --dataset=synthetic.", lower=1, upper=10_000_000)
  synthetic_shape: Tuple[int, ...] = hyperparameter(
      (28, 28, 1), "Example shape of --dataset=synthetic, e.g. 28,28,1.")
  model: str = hyperparameter(
      "cnn", "Classification: cnn (Conv2D(32,3)-MaxPool-Flatten-Dense(64)-Dense), "
      "mlp or resnet (a small ResNet).", choices=MODELS)
  dropout: float = hyperparameter(
      0.0, "Classification: dropout rate before the last layer (0 = none).",
      lower=0.0, upper=0.95)
  l2: float = hyperparameter(0.0, "L2 weight regularization factor on kernels.",
                             lower=0.0)
  batchnorm: bool = hyperparameter(
      False, "Classification: BatchNormalization after every hidden convolution "
      "and dense layer of --model (before its ReLU).")

  layout_fields = ("dataset", "num_classes", "synthetic_shape", "model", "dropout",
                   "l2", "batchnorm")
  metric_goals = {"accuracy": "max"}
  best_metric = "eval/accuracy"

  def __post_init__(self):
    self.synthetic_shape = tuple(self.synthetic_shape)
    check_hyperparameters(self)
    if self.dataset == "tfrecord" and not self.train_files:
      raise ConfigError("--dataset=tfrecord needs --train_files=GLOB, e.g. "
                        "--train_files='data/digits/train-*'")
    if self.dataset != "tfrecord" and (self.train_files or self.eval_files):
      raise ConfigError(f"--train_files/--eval_files: only read with "
                        f"--dataset=tfrecord, not --dataset={self.dataset}")
    if self.dataset == "npz" and not self.data_path:
      raise ConfigError("--dataset=npz needs --data_path=FILE.npz")
    if self.data_path and not os.path.isfile(self.data_path):
      raise ConfigError(f"--data_path={self.data_path}: no such file")
    shape = self.synthetic_shape
    if len(shape) not in (1, 2, 3) or min(shape) < 1:
      raise ConfigError(f"--synthetic_shape={flag_value(shape)}: must be 1 to 3 "
                        "positive sizes, e.g. 28,28,1")
    values = self.synthetic_examples * math.prod(shape)
    if self.dataset == "synthetic" and values > MAX_SYNTHETIC_VALUES:
      raise ConfigError(f"--synthetic_examples={self.synthetic_examples} x "
                        f"--synthetic_shape={flag_value(shape)}: "
                        f"{values * 4 / 2**30:.1f} GiB of data; at most "
                        f"{MAX_SYNTHETIC_VALUES * 4 / 2**30:.0f} GiB")

  def prepare(self, context: RunContext):
    """Loads (or finds) the data set; says which file it is, for the resume."""
    self._seed = context.seed  # Of the synthetic data and the dropout masks.
    self.source = image_data.load_source(self, seed=context.seed)
    if self.data_path:
      return {"data_path": image_data.fingerprint_file(self.data_path)}
    return None

  def build_model(self):
    from trainer.tasks import image_models  # Imports Keras: after the devices.
    head = image_models.Head(num_classes=self.source.num_classes,
                             dropout=self.dropout, l2=self.l2, seed=self._seed,
                             batchnorm=self.batchnorm)
    return image_models.build_model(self.model, input_shape=self.source.input_shape,
                                    head=head)

  def train_data(self):
    return self.source.train_data()

  def eval_data(self):
    return self.source.eval_data()

  def preprocess(self, features):
    import tensorflow as tf
    x = tf.cast(features, tf.float32)
    return x * self.source.scale if self.source.scale != 1.0 else x

  def loss(self, labels, outputs):
    import keras
    return keras.losses.sparse_categorical_crossentropy(labels, outputs,
                                                        from_logits=True)

  def metrics(self, labels, outputs):
    import tensorflow as tf
    predicted = tf.argmax(outputs, -1, output_type=labels.dtype)
    return {"accuracy": tf.cast(tf.equal(predicted, labels), tf.float32)}

  def serving_signature(self, feature_spec):
    import tensorflow as tf
    # Raw stored values of any dtype, as float32 (uint8 pixels fit exactly).
    return tf.TensorSpec(feature_spec.shape, tf.float32, name="inputs")

  def serving_outputs(self, outputs):
    import tensorflow as tf
    logits = tf.cast(outputs, tf.float32)
    return {"logits": logits, "probabilities": tf.nn.softmax(logits),
            "classes": tf.argmax(logits, axis=-1)}
