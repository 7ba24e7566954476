#!/usr/bin/env python
"""Benchmarks TFRecord input against in-memory arrays, and what a resume costs.

  python scripts/bench_input.py            # docs/data.md's TFRecord numbers
  python scripts/bench_input.py --json=input.json

On digits written by scripts/make_tfrecords.py (PNG, 8 shards) and synthetic 28x28
float32 images (raw, 16 shards), it reports:
- the input pipeline alone: examples/s of global batches of 64 (decoded and
  preprocessed, as a loop call reads them), arrays vs TFRecord files;
- training: the median examples/s of `python -m trainer.main` (2 replicas, K=20)
  on each, from results.json;
- resume: the time from building the TFRecord stream at step S to its first
  batch, for S up to 10^7, next to a stream that skips S batches (a tf.data
  task's resume) at small S.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from trainer.argparsing import ArgumentParser

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GLOBAL_BATCH = 64


def _make(out, *args):
  subprocess.run([sys.executable, os.path.join(REPO, "scripts", "make_tfrecords.py"),
                  f"--out={out}", *args], check=True, capture_output=True)


def _examples_per_second(dataset, batches: int) -> float:
  iterator = iter(dataset)
  for _ in range(20):  # Warm-up: buffers fill, functions trace.
    next(iterator)
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  return batches * GLOBAL_BATCH / (time.perf_counter() - start)


def _task_data(**params):
  """The classification task's training data with these hyperparameters."""
  from trainer import data
  from trainer.tasks import RunContext
  from trainer.tasks.classification import Classification
  task = Classification(**params)
  task.prepare(RunContext())
  return task, data.as_task_data(task.train_data(), what="bench")


def _run_order(source):
  """The order one process reads `source` in: over the input shards a run of
  global batches of GLOBAL_BATCH picks (per-pipeline data)."""
  from trainer import data
  return data.Order(seed=0, shuffle=True, buffer=10000,
                    global_batch_size=GLOBAL_BATCH,
                    input_shards=source.input_shards(
                        recorded=None, pipelines=1, global_batch_size=GLOBAL_BATCH))


def _pipelines(task_params, batches):
  """(arrays examples/s, TFRecord examples/s) of the input alone."""
  import tensorflow as tf

  from trainer.distribute.cluster import Cluster
  rates = []
  for params in task_params:
    task, source = _task_data(**params)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    order = _run_order(source)
    dataset = source.train_input(strategy, Cluster(), order, start_step=0,
                                 preprocess=task.preprocess)
    rates.append(_examples_per_second(dataset, batches))
  return rates


def _train(flags, model_dir, steps):
  subprocess.run([sys.executable, "-m", "trainer.main", *flags, "--cpu_devices=2",
                  "--steps_per_loop=20", f"--train_steps={steps}",
                  f"--model_dir={model_dir}", "--summaries=false"], cwd=REPO,
                 check=True, capture_output=True)
  with open(os.path.join(model_dir, "results.json")) as f:
    return json.load(f)["examples_per_second_median"]


def _first_batch_seconds(build, repeats=3) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    next(iter(build()))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _resume_costs(folder, steps_list, skip_steps):
  import tensorflow as tf

  from trainer.data import streams
  _, records = _task_data(dataset="tfrecord", train_files=f"{folder}/train-*")
  order = _run_order(records)
  costs = {}
  for step in steps_list:
    costs[f"tfrecord at step {step}"] = _first_batch_seconds(
        lambda s=step: records.batches(records.pipeline_stream(
            order, pipelines=1, pipeline_id=0, start_step=s), GLOBAL_BATCH))
  examples = records.parsed(tf.data.TFRecordDataset(list(records.paths)))
  for step in skip_steps:
    costs[f"skip-based stream at step {step}"] = _first_batch_seconds(
        lambda s=step: streams.stream_batches(
            examples, order, shuffle_seed=0, batch_size=GLOBAL_BATCH,
            position=s * GLOBAL_BATCH))
  return costs


def main(argv=None) -> int:
  parser = ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--json", help="also write the numbers to this file")
  parser.add_argument("--quick", action="store_true", help="fewer batches and steps")
  args = parser.parse_args(argv)
  batches, steps = (50, 200) if args.quick else (300, 1000)
  report = {}
  with tempfile.TemporaryDirectory() as scratch:
    digits, synthetic = os.path.join(scratch, "digits"), os.path.join(scratch, "syn")
    _make(digits, "--dataset=digits", "--shards=8")
    _make(synthetic, "--dataset=synthetic", "--shards=16")
    cases = {"digits (PNG, 8 shards)": ({}, {"dataset": "tfrecord",
                                              "train_files": f"{digits}/train-*"}),
             "synthetic 28x28 (raw float32, 16 shards)": (
                 {"dataset": "synthetic"},
                 {"dataset": "tfrecord", "train_files": f"{synthetic}/train-*"})}
    for name, (arrays, files) in cases.items():
      pipeline = _pipelines([arrays, files], batches)
      flags = [[f"--{k}={v}" for k, v in c.items()] for c in (arrays, files)]
      training = [_train(f, os.path.join(scratch, f"run{i}-{len(report)}"), steps)
                  for i, f in enumerate(flags)]
      report[name] = {"pipeline arrays": pipeline[0], "pipeline tfrecord": pipeline[1],
                      "training arrays": training[0], "training tfrecord": training[1]}
    report["resume seconds"] = _resume_costs(digits, (0, 1000, 100_000, 10_000_000),
                                             (0, 100, 1000))
  print("| data | input alone, arrays | input alone, TFRecord | training, arrays | "
        "training, TFRecord |\n|---|---|---|---|---|")
  for name, row in report.items():
    if name != "resume seconds":
      print(f"| {name} | " + " | ".join(f"{v:,.0f}" for v in row.values()) + " |")
  print("\n| stream built at | time to its first batch (s) |\n|---|---|")
  for name, seconds in report["resume seconds"].items():
    print(f"| {name} | {seconds:.3f} |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
