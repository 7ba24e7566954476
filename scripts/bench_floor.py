#!/usr/bin/env python
"""The round-off floor: how far N replicas end from one device, against how far
one device ends from itself when only the summation order changes.

  python scripts/bench_floor.py                     # the table in docs/performance.md
  python scripts/bench_floor.py --models=cnn_bn --steps=1,10 --replicas=2

For each model, seven runs train the same batches (global batch 32, in a fixed
order: --shuffle=false over examples shuffled once), seed and Adam under
--deterministic, each in its own process: one device; N replicas (N x 32/N),
and N replicas with every batch's examples reversed;
one device with every batch's examples in three other orders (reversed,
rotated by a quarter, pairs swapped: the same examples and steps, other
summation orders); and one device with TensorFlow's other kernels
(TF_ENABLE_ONEDNN_OPTS=0). Each run trains to the first step count, then resumes
to the next (a resume is bit-exact), and the largest weight difference from the
first run is read from the checkpoints at each: |dw| / max(1, |w|) over every
model weight. The floor is the largest of the four one-device variants. Where
it is as large as N replicas' difference, the gap is round-off that training
amplifies (Adam turns round-off gradients, of a true value 0, into full steps),
not the distribution.

Models: the built-in mlp, cnn and resnet on digits; the cnn and resnet with
BatchNormalization (--task.batchnorm); and a timeseries classifier as keras-io
writes it (Conv1D-BatchNormalization-ReLU x3, global pooling) on generated
series.
"""

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

import trainer
from trainer.tasks.classification import Classification

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "scripts")

# name -> flags of `python -m trainer.main`.
MODELS = {
    "mlp": ["--task=bench_floor:Digits", "--task.model=mlp"],
    "cnn": ["--task=bench_floor:Digits", "--task.model=cnn"],
    "resnet": ["--task=bench_floor:Digits", "--task.model=resnet"],
    "cnn_bn": ["--task=bench_floor:Digits", "--task.model=cnn", "--task.batchnorm"],
    "resnet_bn": ["--task=bench_floor:Digits", "--task.model=resnet",
                  "--task.batchnorm"],
    "timeseries_bn": ["--task=bench_floor:TimeseriesTask"],
}
COMMON = ["--optimizer=adam", "--learning_rate=0.001", "--deterministic",
          "--mode=train", "--summaries=false", "--checkpoint_every=1000000",
          "--seed=1", "--shuffle=false"]
GLOBAL_BATCH = 32


# How each global batch is ordered within: the floor runs take other orders.
ORDERS = {"same": lambda b: b, "reversed": lambda b: b[:, ::-1],
          "rotated": lambda b: np.roll(b, GLOBAL_BATCH // 4, axis=1),
          "swapped": lambda b: b.reshape(len(b), -1, 2)[:, :, ::-1].reshape(b.shape)}


def in_batches(x, y, *, order: str):
  """The examples shuffled once, in whole global batches, each batch's examples
  in `order` (ORDERS): read in order (--shuffle=false), every run sees the same
  batches at the same steps."""
  indices = np.random.default_rng(0).permutation(len(x))
  batches = indices[:len(indices) // GLOBAL_BATCH * GLOBAL_BATCH].reshape(
      -1, GLOBAL_BATCH)
  indices = ORDERS[order](batches).ravel()
  return x[indices], y[indices]


@dataclasses.dataclass
class Digits(Classification):
  """The built-in classification task (digits) in fixed batches."""

  order: str = "same"

  def train_data(self):
    return in_batches(*super().train_data(), order=self.order)


@dataclasses.dataclass
class TimeseriesTask(trainer.Task):
  """keras-io's timeseries classification from scratch (FordA), on generated
  series of 128 steps: a sine of one of two frequencies in noise."""

  layout_fields = ()
  order: str = "same"

  def build_model(self):
    inputs = keras.Input((128, 1))
    x = inputs
    for _ in range(3):
      x = keras.layers.Conv1D(filters=16, kernel_size=3, padding="same")(x)
      x = keras.layers.BatchNormalization()(x)
      x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(2)(x))

  def train_data(self):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=2048)
    t = np.arange(128)[None, :]
    phase = rng.uniform(0, 2 * np.pi, size=(2048, 1))
    x = np.sin(t * (0.1 + 0.1 * labels[:, None]) + phase)
    x += rng.normal(scale=0.5, size=x.shape)
    return in_batches(x[..., None].astype("float32"), labels.astype("int32"),
                      order=self.order)

  def loss(self, labels, outputs):
    return keras.losses.sparse_categorical_crossentropy(labels, outputs,
                                                        from_logits=True)

  def metrics(self, labels, outputs):
    predicted = tf.argmax(outputs, axis=-1, output_type=tf.int32)
    return {"accuracy": tf.cast(tf.equal(predicted, labels), tf.float32)}


def _train(model_dir: str, flags: list, *, steps: int, replicas: int,
           order: str, other_kernels: bool):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=os.pathsep.join([SCRIPTS, REPO]))
  if other_kernels:
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"
  command = [sys.executable, "-m", "trainer.main", *COMMON, *flags,
             f"--task.order={order}", f"--cpu_devices={replicas}",
             f"--per_replica_batch_size={GLOBAL_BATCH // replicas}",
             f"--train_steps={steps}", f"--model_dir={model_dir}"]
  done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                        check=False)
  if done.returncode:
    raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")


def _weights(model_dir: str) -> dict:
  path = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)
          if name.startswith("model/")}


def difference(a: dict, b: dict) -> float:
  """max |a - b| / max(1, |a|) over every weight."""
  return max(float(np.max(np.abs(a[k] - b[k]) / np.maximum(1.0, np.abs(a[k]))))
             for k in a)


# run -> (replicas, the batches' order, other kernels)
RUNS = {"one": (1, "same", False), "replicas": (None, "same", False),
        "replicas_reversed": (None, "reversed", False),
        "reversed": (1, "reversed", False), "rotated": (1, "rotated", False),
        "swapped": (1, "swapped", False), "kernels": (1, "same", True)}
FLOOR = ("reversed", "rotated", "swapped", "kernels")


def measure(name: str, *, steps: list, replicas: int, root: str) -> dict:
  """{step: (N replicas vs 1 device, N replicas on reversed batches vs 1 device,
  the floor: the largest difference of one device from itself in another
  order or with other kernels)}."""
  rows = {}
  for step in steps:
    weights = {}
    for run, (count, order, other) in RUNS.items():
      directory = os.path.join(root, f"{name}-{run}")
      _train(directory, MODELS[name], steps=step, replicas=count or replicas,
             order=order, other_kernels=other)
      weights[run] = _weights(directory)
    rows[step] = (difference(weights["one"], weights["replicas"]),
                  difference(weights["one"], weights["replicas_reversed"]),
                  max(difference(weights["one"], weights[run]) for run in FLOOR))
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--steps", default="1,10,90")
  parser.add_argument("--replicas", type=int, default=2)
  args = parser.parse_args()
  steps = [int(s) for s in args.steps.split(",")]
  names = args.models.split(",")
  unknown = [n for n in names if n not in MODELS]
  if unknown:
    raise SystemExit(f"--models: unknown {unknown[0]!r}; known: {', '.join(MODELS)}")
  titles = (f"{args.replicas} replicas", f"{args.replicas} replicas, reversed",
            "floor")
  header = " | ".join(f"{title} @{s}" for title in titles for s in steps)
  print(f"| model | {header} |")
  print("|---|" + "---|" * (len(titles) * len(steps)), flush=True)
  with tempfile.TemporaryDirectory() as root:
    for name in names:
      rows = measure(name, steps=steps, replicas=args.replicas, root=root)
      cells = [f"{rows[s][column]:.1e}" for column in range(len(titles))
               for s in steps]
      print(f"| {name} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
  main()
