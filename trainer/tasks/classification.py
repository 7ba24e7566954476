"""The built-in default task: classification of --dataset with --model.

Sparse categorical cross-entropy over the model's logits, and accuracy. The data
sets (digits, mnist, npz, synthetic) are in `image_data`, TFRecord files
(tfrecord) in `image_records`, the models (cnn, mlp, resnet) in `image_models`;
all read their flags from the run's Config.
"""

import dataclasses
import functools

from trainer.tasks import image_data
from trainer.tasks.base import Task


@dataclasses.dataclass
class Classification(Task):
  """Classifies --dataset's examples into its classes with --model's logits."""

  metric_goals = {"accuracy": "max"}
  best_metric = "eval/accuracy"

  @functools.cached_property
  def source(self):
    """The data set (loaded or found once): an image_data.Source in memory, or an
    image_records.RecordSource of TFRecord files."""
    return image_data.load_source(self.config)

  def build_model(self):
    from trainer.tasks import image_models  # pylint: disable=g-import-not-at-top
    return image_models.build_model(self.config, input_shape=self.source.input_shape,
                                    num_classes=self.source.num_classes)

  def train_data(self):
    return self.source.train_data()

  def eval_data(self):
    return self.source.eval_data()

  def preprocess(self, features):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    x = tf.cast(features, tf.float32)
    return x * self.source.scale if self.source.scale != 1.0 else x

  def loss(self, labels, outputs):
    import keras  # pylint: disable=g-import-not-at-top
    return keras.losses.sparse_categorical_crossentropy(labels, outputs,
                                                        from_logits=True)

  def metrics(self, labels, outputs):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    predicted = tf.argmax(outputs, -1, output_type=labels.dtype)
    return {"accuracy": tf.cast(tf.equal(predicted, labels), tf.float32)}

  def serving_signature(self, feature_spec):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    # Raw stored values of any dtype, as float32 (uint8 pixels fit exactly).
    return tf.TensorSpec(feature_spec.shape, tf.float32, name="inputs")

  def serving_outputs(self, outputs):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    logits = tf.cast(outputs, tf.float32)
    return {"logits": logits, "probabilities": tf.nn.softmax(logits),
            "classes": tf.argmax(logits, axis=-1)}
