#!/usr/bin/env python
"""Streaming Keras metrics (Task.build_metrics) against the per-example
workaround a task needed before them, on the same imbalanced task: a 200-threshold
AUC, precision, recall and F1, on 2 replicas.

  python scripts/bench_metrics.py --repeats=2

Each variant runs `trainer.train` in its own process; reported: the median
examples/s over the loop calls after the first, the time to the first step
(results.json's), and the lines each variant's metrics take in this file.
"""

import argparse
import dataclasses
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile

THRESHOLDS = 200


def _task_classes():
  """The two tasks (defined after TensorFlow is imported, in the worker)."""
  import keras
  import numpy as np
  import tensorflow as tf

  import trainer

  def arrays(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 30)).astype("float32")
    y = ((x @ np.linspace(-1, 1, 30) + rng.normal(size=n)) > 2.5).astype("float32")
    return x, y[:, None]

  @dataclasses.dataclass
  class Base(trainer.Task):
    loss = keras.losses.BinaryCrossentropy()

    def build_model(self):
      return keras.Sequential([keras.Input((30,)),
                               keras.layers.Dense(64, activation="relu"),
                               keras.layers.Dense(64, activation="relu"),
                               keras.layers.Dense(1, activation="sigmoid")])

    def train_data(self):
      return arrays(65536, seed=0)

    def eval_data(self):
      return arrays(8192, seed=1)

  @dataclasses.dataclass
  class StreamingMetrics(Base):
    def build_metrics(self):
      return {"auc": keras.metrics.AUC(num_thresholds=THRESHOLDS),
              "precision": keras.metrics.Precision(),
              "recall": keras.metrics.Recall(),
              "f1": keras.metrics.F1Score(threshold=0.5)}

  @dataclasses.dataclass
  class PerExampleWorkaround(Base):
    """Counts as per-example indicators (their means are rates), then AUC,
    precision, recall and F1 from the rates in finalize_metrics."""

    def metrics(self, labels, outputs):
      thresholds = tf.linspace(0.0, 1.0, THRESHOLDS)
      positive = labels[:, :1] > 0.5
      above = outputs[:, :1] >= thresholds[None, :]
      values = {}
      for i in range(THRESHOLDS):
        values[f"tp{i}"] = tf.cast(positive[:, 0] & above[:, i], tf.float32)
        values[f"fp{i}"] = tf.cast(~positive[:, 0] & above[:, i], tf.float32)
      predicted = outputs[:, 0] > 0.5
      values["tp"] = tf.cast(positive[:, 0] & predicted, tf.float32)
      values["fp"] = tf.cast(~positive[:, 0] & predicted, tf.float32)
      values["fn"] = tf.cast(positive[:, 0] & ~predicted, tf.float32)
      values["positive"] = tf.cast(positive[:, 0], tf.float32)
      return values

    def finalize_metrics(self, means, *, sums, examples):
      del sums, examples
      pos = max(means["positive"], 1e-12)
      neg = max(1.0 - means["positive"], 1e-12)
      tpr = [means[f"tp{i}"] / pos for i in range(THRESHOLDS)]
      fpr = [means[f"fp{i}"] / neg for i in range(THRESHOLDS)]
      auc = sum((fpr[i] - fpr[i + 1]) * (tpr[i] + tpr[i + 1]) / 2
                for i in range(THRESHOLDS - 1))
      tp, fp, fn = means["tp"], means["fp"], means["fn"]
      precision = tp / max(tp + fp, 1e-12)
      recall = tp / max(tp + fn, 1e-12)
      f1 = 2 * precision * recall / max(precision + recall, 1e-12)
      return {"loss": means["loss"], "auc": auc, "precision": precision,
              "recall": recall, "f1": f1}

  return {"build_metrics": StreamingMetrics,
          "per_example": PerExampleWorkaround}


def _worker(variant: str, steps: int):
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import trainer
  task = _task_classes()[variant]()
  with tempfile.TemporaryDirectory() as model_dir:
    results = trainer.train(trainer.Config(
        cpu_devices=2, per_replica_batch_size=256, train_steps=steps,
        steps_per_loop=50, model_dir=model_dir, summaries=False,
        checkpoint_every=10**6), task=task)
  print(json.dumps({"examples_per_second": results["examples_per_second_median"],
                    "time_to_first_step_s": results["time_to_first_step_s"],
                    "train": results["train"]}))


def _metric_lines() -> dict:
  """Lines of each variant's metrics code (its methods, as written above)."""
  source = inspect.getsource(_task_classes)
  streaming = source[source.index("  class StreamingMetrics"):
                     source.index("  @dataclasses.dataclass\n  class PerExample")]
  workaround = source[source.index("  class PerExampleWorkaround"):
                      source.index("  return {\"build_metrics\"")]
  return {"build_metrics": len(streaming.strip().splitlines()),
          "per_example": len(workaround.strip().splitlines())}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--steps", type=int, default=600)
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    _worker(args.worker, args.steps)
    return
  runs = {"build_metrics": [], "per_example": []}
  for _ in range(args.repeats):
    for variant, measured in runs.items():  # Interleaved: the machine drifts.
      output = subprocess.run(
          [sys.executable, __file__, f"--worker={variant}", f"--steps={args.steps}"],
          capture_output=True, text=True, check=True).stdout
      measured.append(json.loads(output.strip().splitlines()[-1]))
  lines = _metric_lines()
  summary = {}
  for variant, measured in runs.items():
    summary[variant] = {
        "examples_per_second": statistics.median(
            m["examples_per_second"] for m in measured),
        "time_to_first_step_s": statistics.median(
            m["time_to_first_step_s"] for m in measured),
        "metric_lines": lines[variant]}
    print(f"{variant:>14}: {summary[variant]['examples_per_second']:>10,.0f} "
          f"examples/s, first step at {summary[variant]['time_to_first_step_s']:.2f}"
          f" s, {lines[variant]} lines of metrics")
  ratio = (summary["build_metrics"]["examples_per_second"] /
           summary["per_example"]["examples_per_second"])
  print(f"build_metrics / per_example throughput: {ratio:.2f}x")


if __name__ == "__main__":
  main()
