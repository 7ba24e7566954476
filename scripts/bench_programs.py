#!/usr/bin/env python
"""Real programs, as written for Keras and as ported to trainer, in one process
each; prints one `BENCHMARK_RESULT {json}` line. Run by scripts/bench_sections.py
(section `programs`), which runs them in rounds.

Programs (1 replica, per-replica batch --batch; examples/s over --windows windows
of K=20 steps after the first, which traces: the whole run, epoch starts too):
  images   keras-io's image_classification_from_scratch at 64x64: a folder of
           JPEGs (--data, made by `make_images`) read by
           keras.utils.image_dataset_from_directory, RandomFlip + RandomRotation,
           a small Xception with BatchNormalization and residuals, Adam.
           --augment=dataset maps the augmentation over the data (the original
           batched, the port per example, as a port keeps batch_size=None);
           --augment=model puts it inside the model.
  text     keras-io's text_classification_from_scratch, smaller: string arrays,
           a TextVectorization adapted to the training text, an Embedding and a
           Conv1D. The original vectorizes in the dataset (map over batches);
           the port in Task.preprocess.

Variants: keras (the original program, Keras fit with its defaults), trainer (the
port), trainer_batched (images: the port on the original's batched dataset).
"""

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

IMAGE_SIZE = 64
K = 20  # Steps per window (the trainer's --steps_per_loop).
VOCABULARY = 2000
SEQUENCE = 200


def make_images(root: str, count: int = 2000, size: int = IMAGE_SIZE):
  """`count` JPEGs in root/cat and root/dog: noise with horizontal (cat) or
  vertical (dog) stripes, learnable and as costly to decode as photos."""
  import numpy as np
  from PIL import Image
  rng = np.random.default_rng(0)
  for name in ("cat", "dog"):
    os.makedirs(os.path.join(root, name), exist_ok=True)
  stripes = (np.arange(size) % 8 < 4).astype(np.float32) * 120
  for i in range(count):
    image = rng.integers(0, 256, size=(size, size, 3)).astype(np.float32) * 0.5
    image += stripes[None, :, None] if i % 2 else stripes[:, None, None]
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(
        os.path.join(root, ("cat", "dog")[i % 2], f"{i}.jpg"), quality=90)


def _xception(keras, augment=None):
  """keras-io's make_model, scaled to 64x64 images and 2 cores."""
  inputs = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3))
  x = augment(inputs) if augment is not None else inputs
  x = keras.layers.Rescaling(1.0 / 255)(x)
  x = keras.layers.Conv2D(32, 3, strides=2, padding="same")(x)
  x = keras.layers.BatchNormalization()(x)
  x = keras.layers.Activation("relu")(x)
  previous = x
  for size in (64, 128):
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.SeparableConv2D(size, 3, padding="same")(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.SeparableConv2D(size, 3, padding="same")(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same")(x)
    residual = keras.layers.Conv2D(size, 1, strides=2, padding="same")(previous)
    x = keras.layers.add([x, residual])
    previous = x
  x = keras.layers.SeparableConv2D(256, 3, padding="same")(x)
  x = keras.layers.BatchNormalization()(x)
  x = keras.layers.Activation("relu")(x)
  x = keras.layers.GlobalAveragePooling2D()(x)
  x = keras.layers.Dropout(0.25)(x)
  return keras.Model(inputs, keras.layers.Dense(1)(x))


def _augmentation(keras):
  return keras.Sequential([keras.layers.RandomFlip("horizontal"),
                           keras.layers.RandomRotation(0.1)])


def _texts(count, seed):
  """Reviews of 40-120 words from a vocabulary of 3,000; the label is whether
  more words come from the first half."""
  import numpy as np
  rng = np.random.default_rng(seed)
  words = np.array([f"w{i}" for i in range(3000)])
  texts, labels = [], []
  for _ in range(count):
    ids = rng.integers(0, 3000, size=rng.integers(40, 120))
    texts.append(" ".join(words[ids]))
    labels.append(float((ids < 1500).mean() > 0.5))
  return np.array(texts), np.array(labels, "float32")


def _text_model(keras):
  inputs = keras.Input((SEQUENCE,), dtype="int64")
  x = keras.layers.Embedding(VOCABULARY, 64)(inputs)
  x = keras.layers.Dropout(0.5)(x)
  x = keras.layers.Conv1D(64, 7, padding="valid", activation="relu", strides=3)(x)
  x = keras.layers.GlobalMaxPooling1D()(x)
  x = keras.layers.Dense(64, activation="relu")(x)
  return keras.Model(inputs, keras.layers.Dense(1)(x))


def _keras_windows(model, dataset, args):
  """Keras fit (its defaults: one step per call) over `dataset`; examples/s of
  each window of K steps after the first."""
  import keras
  marks = []

  class WindowTimer(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      if (batch + 1) % K == 0:
        float(logs["loss"])  # The window's work is done.
        marks.append(time.perf_counter())

  model.fit(dataset, epochs=1, steps_per_epoch=(1 + args.windows) * K, verbose=0,
            callbacks=[WindowTimer()])
  rates = [K * args.batch / (b - a) for a, b in zip(marks, marks[1:])]
  # Over the whole run after the first window (it traces), as the trainer's
  # results.json measures: a stall at each epoch's start counts.
  return {"examples_per_second": len(rates) * K * args.batch / (marks[-1] - marks[0]),
          "median_window": statistics.median(rates)}


def run_keras(args):
  import keras
  import tensorflow as tf
  keras.utils.set_random_seed(0)
  if args.program == "images":
    augment = _augmentation(keras)
    data = keras.utils.image_dataset_from_directory(
        args.data, image_size=(IMAGE_SIZE, IMAGE_SIZE), batch_size=args.batch,
        seed=1337)
    if args.augment == "dataset":
      data = data.map(lambda x, y: (augment(x, training=True), y),
                      num_parallel_calls=tf.data.AUTOTUNE)
    data = data.prefetch(tf.data.AUTOTUNE).repeat()
    model = _xception(keras, augment if args.augment == "model" else None)
  else:
    texts, labels = _texts(4096, seed=0)
    vectorize = keras.layers.TextVectorization(
        max_tokens=VOCABULARY, output_mode="int", output_sequence_length=SEQUENCE)
    vectorize.adapt(texts)
    data = (tf.data.Dataset.from_tensor_slices((texts, labels)).shuffle(4096, seed=0)
            .batch(args.batch).map(lambda x, y: (vectorize(x), y),
                                   num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE).repeat())
    model = _text_model(keras)
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return _keras_windows(model, data, args)


def _image_task(args, *, batched: bool):
  import keras
  import tensorflow as tf

  import trainer

  @dataclasses.dataclass
  class Images(trainer.Task):
    """The port: the same loader (batch_size=None, unless the original's batched
    dataset is given as it is), augmentation and model."""

    def prepare(self, context):
      del context
      self.augment = _augmentation(keras)

    def build_model(self):
      return _xception(keras, self.augment if args.augment == "model" else None)

    def train_data(self):
      data = keras.utils.image_dataset_from_directory(
          args.data, image_size=(IMAGE_SIZE, IMAGE_SIZE),
          batch_size=args.batch if batched else None, seed=1337)
      if args.augment == "dataset":
        data = data.map(lambda x, y: (self.augment(x, training=True), y),
                        num_parallel_calls=tf.data.AUTOTUNE)
      return data.prefetch(tf.data.AUTOTUNE)

    def loss(self, labels, outputs):
      return keras.losses.binary_crossentropy(
          tf.cast(labels[:, None], tf.float32), outputs, from_logits=True)

  return Images()


def _text_task():
  import keras
  import tensorflow as tf

  import trainer

  @dataclasses.dataclass
  class Text(trainer.Task):
    """The port: strings as arrays, vectorized in Task.preprocess."""

    def prepare(self, context):
      del context
      self.texts, self.labels = _texts(4096, seed=0)
      self.vectorize = keras.layers.TextVectorization(
          max_tokens=VOCABULARY, output_mode="int", output_sequence_length=SEQUENCE)
      self.vectorize.adapt(self.texts)

    def build_model(self):
      return _text_model(keras)

    def train_data(self):
      return self.texts, self.labels

    def preprocess(self, features):
      return self.vectorize(features)

    def loss(self, labels, outputs):
      return keras.losses.binary_crossentropy(
          tf.cast(labels[:, None], tf.float32), outputs, from_logits=True)

  return Text()


def run_trainer(args, *, batched=False):
  import trainer
  task = (_image_task(args, batched=batched) if args.program == "images"
          else _text_task())
  with tempfile.TemporaryDirectory() as model_dir:
    results = trainer.train(trainer.Config(
        cpu_devices=1, per_replica_batch_size=args.batch, optimizer="adam",
        learning_rate=1e-3, steps_per_loop=K, train_steps=(1 + args.windows) * K,
        checkpoint_every=10**9, mode="train", model_dir=model_dir,
        **json.loads(args.flags)), task=task)
  return {"examples_per_second": results["examples_per_second"],
          "median_window": results["examples_per_second_median"],
          "time_to_first_call_s": results["time_to_first_step_s"]}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--program", choices=("images", "text"), required=True)
  parser.add_argument("--variant", choices=("keras", "trainer", "trainer_batched"),
                      required=True)
  parser.add_argument("--augment", choices=("dataset", "model"), default="dataset")
  parser.add_argument("--data", default="", help="images: the JPEG folder")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--windows", type=int, default=10,
                      help="timed windows of K steps (10: over 3 epochs of images)")
  parser.add_argument("--flags", default="{}", help="trainer: Config fields, JSON")
  args = parser.parse_args()
  from trainer import tf_loader
  from trainer.outputs.process_stats import peak_rss_mib
  tf_loader.load_tensorflow()
  runners = {"keras": lambda: run_keras(args),
             "trainer": lambda: run_trainer(args),
             "trainer_batched": lambda: run_trainer(args, batched=True)}
  try:
    result = runners[args.variant]()
  except Exception as e:  # noqa: BLE001 (reported, not raised)
    result = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
  result.update(variant=args.variant, peak_rss_mib=round(peak_rss_mib(), 1))
  print("BENCHMARK_RESULT " + json.dumps(result), flush=True)
  return 0 if "error" not in result else 1


if __name__ == "__main__":
  sys.exit(main())
