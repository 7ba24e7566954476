"""TensorFlow's tutorial "Custom training with tf.distribute.Strategy"
(tensorflow.org/tutorials/distribute/custom_training), as its user runs it:
`python examples/tf_distributed_tutorial.py`.

Fashion-MNIST needs a download, so the images are scikit-learn's 8x8 digits
(1,280 to train, 517 to test), and the convolutions pad ("same") so that two
poolings fit in 8x8. Its port to a `trainer.Task` is examples/tutorial_task.py,
which reuses `load_data` and `create_model` from here.
"""

import keras
import tensorflow as tf
from sklearn.datasets import load_digits

TRAIN_EXAMPLES = 1280
BATCH_SIZE_PER_REPLICA = 64


def load_data():
  """((train_images, train_labels), (test_images, test_labels)): [n, 8, 8, 1]
  floats in [0, 1] and integer classes."""
  digits = load_digits()
  images = (digits.images[..., None] / 16.0).astype("float32")
  labels = digits.target.astype("int64")
  return ((images[:TRAIN_EXAMPLES], labels[:TRAIN_EXAMPLES]),
          (images[TRAIN_EXAMPLES:], labels[TRAIN_EXAMPLES:]))


def create_model():
  regularizer = keras.regularizers.L2(1e-5)
  return keras.Sequential([
      keras.Input((8, 8, 1)),
      keras.layers.Conv2D(32, 3, padding="same", activation="relu",
                          kernel_regularizer=regularizer),
      keras.layers.MaxPooling2D(),
      keras.layers.Conv2D(64, 3, padding="same", activation="relu",
                          kernel_regularizer=regularizer),
      keras.layers.MaxPooling2D(),
      keras.layers.Flatten(),
      keras.layers.Dense(64, activation="relu", kernel_regularizer=regularizer),
      keras.layers.Dense(10, kernel_regularizer=regularizer),
  ])


def train(*, epochs=10, shuffle=True, seed=0, strategy=None, verbose=True):
  """The tutorial's loop; returns (model, {"test_loss", "test_accuracy"})."""
  keras.utils.set_random_seed(seed)
  strategy = strategy or tf.distribute.MirroredStrategy()
  global_batch_size = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
  (train_images, train_labels), (test_images, test_labels) = load_data()
  train_dataset = tf.data.Dataset.from_tensor_slices((train_images, train_labels))
  if shuffle:
    train_dataset = train_dataset.shuffle(len(train_images))
  train_dataset = train_dataset.batch(global_batch_size)
  test_dataset = tf.data.Dataset.from_tensor_slices(
      (test_images, test_labels)).batch(global_batch_size)
  train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
  test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)

  with strategy.scope():
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                             reduction=None)

    def compute_loss(labels, predictions, model_losses):
      per_example_loss = loss_object(labels, predictions)
      loss = tf.nn.compute_average_loss(per_example_loss,
                                        global_batch_size=global_batch_size)
      if model_losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
      return loss

    test_loss = keras.metrics.Mean(name="test_loss")
    train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    test_accuracy = keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
    model = create_model()
    optimizer = keras.optimizers.Adam(learning_rate=0.001)

  def train_step(inputs):
    images, labels = inputs
    with tf.GradientTape() as tape:
      predictions = model(images, training=True)
      loss = compute_loss(labels, predictions, model.losses)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    train_accuracy.update_state(labels, predictions)
    return loss

  def test_step(inputs):
    images, labels = inputs
    predictions = model(images, training=False)
    test_loss.update_state(loss_object(labels, predictions))
    test_accuracy.update_state(labels, predictions)

  @tf.function
  def distributed_train_step(dataset_inputs):
    per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

  @tf.function
  def distributed_test_step(dataset_inputs):
    return strategy.run(test_step, args=(dataset_inputs,))

  for epoch in range(epochs):
    total_loss, num_batches = 0.0, 0
    for batch in train_dist_dataset:
      total_loss += distributed_train_step(batch)
      num_batches += 1
    train_loss = total_loss / num_batches
    for batch in test_dist_dataset:
      distributed_test_step(batch)
    if verbose:
      print(f"Epoch {epoch + 1}, Loss: {float(train_loss):.4f}, Accuracy: "
            f"{float(train_accuracy.result()) * 100:.2f}, Test Loss: "
            f"{float(test_loss.result()):.4f}, Test Accuracy: "
            f"{float(test_accuracy.result()) * 100:.2f}")
    results = {"test_loss": float(test_loss.result()),
               "test_accuracy": float(test_accuracy.result())}
    for metric in (test_loss, train_accuracy, test_accuracy):
      metric.reset_state()
  return model, results


if __name__ == "__main__":
  train()
