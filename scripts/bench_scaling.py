#!/usr/bin/env python
"""Weak scaling on loopback, one core per worker: what a second machine adds.

  python scripts/bench_scaling.py            # the table in docs/performance.md
  python scripts/bench_scaling.py --models=cnn --repeats=1 --steps_per_loop=10

Each worker is a process pinned to its own core (`taskset -c I`), as workers on
a real cluster do not share cores; every process trains batches of 32 per
replica (weak scaling: 2 workers train 64 per step). For each model, in rounds:

- trainer, 1 process on core 0, and 2 workers (MultiWorkerMirroredStrategy over
  gRPC on 127.0.0.1) on cores 0 and 1;
- the hand-written loop (TensorFlow's custom-loop recipe: K steps per
  tf.function call, gradients applied in the replica function) alike;
- the all-reduce alone: 2 pinned workers all-reducing, K times per call, tensors
  of the model's gradients' shapes as trainer packs them, nothing else: the
  all-reduce's own cost per step.

Reported: examples/s (the median of timed windows, scripts/bench_variants.py),
the efficiency (2 workers' examples/s over twice one process's), trainer over
the hand loop on 2 workers, and the all-reduce's milliseconds per step beside a
step's. Models: the built-in cnn and resnet on synthetic 28x28x1 images, and an
MLP of 9.8M parameters (synthetic 160x160x3 images into Dense(128)).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = os.path.join(REPO, "scripts", "bench_variants.py")
# name -> bench_variants flags.
MODELS = {"cnn": ["--model=cnn"], "resnet": ["--model=resnet"],
          "wide": ["--model=mlp", "--synthetic_shape=160,160,3",
                   "--synthetic_examples=1024"]}


def _tf_config(ports, index) -> str:
  return json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                     "task": {"type": "worker", "index": index}})


def _result(output: str) -> dict:
  for line in reversed(output.splitlines()):
    if line.startswith("BENCHMARK_RESULT "):
      return json.loads(line[len("BENCHMARK_RESULT "):])
  return {"error": (output.strip().splitlines() or ["no output"])[-1][:300]}


def _pinned(core: int, command: list, env: dict) -> subprocess.Popen:
  return subprocess.Popen(["taskset", "-c", str(core), *command], cwd=REPO,
                          env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _run(command: list, *, workers: int, timeout: float) -> dict:
  """`command` on `workers` pinned processes (TF_CONFIG for 2): the chief's
  BENCHMARK_RESULT."""
  from trainer.distribute import launcher
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  if workers == 1:
    processes = [_pinned(0, command, env)]
  else:
    ports = launcher.free_ports(workers)
    processes = [_pinned(i, command, dict(env, TF_CONFIG=_tf_config(ports, i)))
                 for i in range(workers)]
  try:
    outputs = [p.communicate(timeout=timeout)[0] for p in processes]
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout} s"}
  finally:
    for process in processes:
      process.kill()
  return _result(outputs[0])


def _variant(variant: str, model: str, args, *, workers: int) -> dict:
  command = [sys.executable, VARIANTS, f"--variant={variant}", "--dataset=synthetic",
             "--replicas=1", "--per_replica_batch_size=32",
             f"--steps_per_loop={args.steps_per_loop}", f"--windows={args.windows}",
             *MODELS[model]]
  if workers > 1:
    command.append("--strategy=multi_worker")
  return _run(command, workers=workers, timeout=args.timeout)


def _all_reduce(model: str, args) -> dict:
  command = [sys.executable, os.path.abspath(__file__), "--all_reduce_worker",
             f"--model={model}", f"--steps_per_loop={args.steps_per_loop}",
             f"--windows={args.windows}"]
  return _run(command, workers=2, timeout=args.timeout)


def all_reduce_worker(args):
  """One worker of the all-reduce alone: the model's trainable variables'
  shapes, all-reduced K times per call as trainer's step all-reduces them (one
  batch_reduce_to), on MultiWorkerMirroredStrategy."""
  sys.path.insert(0, os.path.join(REPO, "scripts"))
  import bench_variants
  import tensorflow as tf
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  flags = dict(a.split("=", 1) for a in MODELS[args.model] if "=" in a)
  variant_args = argparse.Namespace(
      replicas=1, per_replica_batch_size=32, steps_per_loop=args.steps_per_loop,
      mixed_precision="none", jit_compile=False, dataset="synthetic",
      model=flags["--model"],
      synthetic_examples=int(flags.get("--synthetic_examples", 4096)),
      synthetic_shape=flags.get("--synthetic_shape", "28,28,1"))
  config = bench_variants.variant_config(variant_args, cpu_devices=1)
  from trainer.tasks.classification import Classification
  from trainer.tasks import RunContext
  task = Classification(**config.task_kwargs)
  task.prepare(RunContext(seed=0))
  with strategy.scope():
    model = task.build_model()
    variables = [tf.Variable(tf.zeros_like(v.value)) for v in
                 model.trainable_variables]
  sizes = sum(v.shape.num_elements() for v in variables)

  @tf.function
  def loop(k):
    total = tf.constant(0.0)
    for _ in tf.range(k):
      grads = strategy.run(lambda: [v + 1.0 for v in variables])
      reduced = strategy.extended.batch_reduce_to(
          tf.distribute.ReduceOp.SUM, [(g, v) for g, v in zip(grads, variables)])
      total += tf.add_n([tf.reduce_sum(strategy.experimental_local_results(r)[0])
                         for r in reduced[:1]])
    return total

  k = tf.constant(args.steps_per_loop)
  float(loop(k))  # Traces.
  seconds = []
  for _ in range(args.windows):
    start = time.perf_counter()
    float(loop(k))
    seconds.append((time.perf_counter() - start) / args.steps_per_loop)
  print("BENCHMARK_RESULT " + json.dumps(
      {"ms_per_all_reduce": 1000 * statistics.median(seconds),
       "parameters": sizes}), flush=True)


def measure(model: str, args) -> dict:
  """One round's numbers of `model`."""
  runs = {"trainer 1": ("trainer_quiet", 1), "trainer 2": ("trainer_quiet", 2),
          "hand 1": ("k_loop", 1), "hand 2": ("k_loop", 2)}
  speed = {}
  for name, (variant, workers) in runs.items():
    result = _variant(variant, model, args, workers=workers)
    speed[name] = result.get("examples_per_second")
    if speed[name] is None:
      print(f"  {model} {name}: {result.get('error')}", file=sys.stderr)
  reduced = _all_reduce(model, args)
  return dict(speed, all_reduce_ms=reduced.get("ms_per_all_reduce"),
              parameters=reduced.get("parameters"))


def _ratio(top, bottom):
  return None if not top or not bottom else top / bottom


def summarize(rounds: list) -> dict:
  """The median over rounds of each number, and the ratios of the medians."""
  keys = rounds[0].keys()
  median = {k: statistics.median(r[k] for r in rounds if r[k] is not None)
            if any(r[k] is not None for r in rounds) else None for k in keys}
  step_ms = (1000 * 32 / median["trainer 1"]) if median["trainer 1"] else None
  return dict(median,
              trainer_efficiency=_ratio(median["trainer 2"],
                                        2 * (median["trainer 1"] or 0)),
              hand_efficiency=_ratio(median["hand 2"], 2 * (median["hand 1"] or 0)),
              trainer_over_hand=_ratio(median["trainer 2"], median["hand 2"]),
              step_ms=step_ms)


def _fmt(value, spec):
  return "n/a" if value is None else format(value, spec)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--steps_per_loop", type=int, default=20)
  parser.add_argument("--windows", type=int, default=5)
  parser.add_argument("--timeout", type=float, default=600)
  parser.add_argument("--all_reduce_worker", action="store_true",
                      help=argparse.SUPPRESS)
  parser.add_argument("--model", default="cnn", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.all_reduce_worker:
    all_reduce_worker(args)
    return
  names = args.models.split(",")
  print("| model | params | trainer 1 core | trainer 2 workers | efficiency | "
        "hand 1 core | hand 2 workers | hand efficiency | trainer / hand (2w) | "
        "step ms (1 core) | all-reduce ms |")
  print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
  for name in names:
    rounds = [measure(name, args) for _ in range(args.repeats)]
    row = summarize(rounds)
    print(f"| {name} | {_fmt(row['parameters'], ',.0f')} | "
          f"{_fmt(row['trainer 1'], ',.0f')} | {_fmt(row['trainer 2'], ',.0f')} | "
          f"{_fmt(row['trainer_efficiency'], '.2f')} | "
          f"{_fmt(row['hand 1'], ',.0f')} | {_fmt(row['hand 2'], ',.0f')} | "
          f"{_fmt(row['hand_efficiency'], '.2f')} | "
          f"{_fmt(row['trainer_over_hand'], '.2f')} | {_fmt(row['step_ms'], '.1f')} "
          f"| {_fmt(row['all_reduce_ms'], '.1f')} |", flush=True)
    print(json.dumps({"model": name, "rounds": rounds}), file=sys.stderr,
          flush=True)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  main()
