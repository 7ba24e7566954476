#!/usr/bin/env python
"""Where a train step's time goes: TensorFlow profiler traces, broken down.

  python scripts/profile_steps.py         # docs/performance.md's table (~1 min)
  python scripts/profile_steps.py --replicas=2 --array_input=gather --json=p.json

Each configuration is one `python -m trainer.main` run of the benchmark's config
(scripts/bench_variants.py: Adam, 32 examples per replica, K=20) with
--profile_steps over three loop
calls after warm-up; the run reads its own trace (trainer.outputs.profile) and this
script tabulates, per step: the wall time inside train_loop calls, the op time of
each part of the step (self times, summed over threads, so replicas that run side
by side can add up to more than the wall time), the executor's dispatch time, the
executor threads' other time, and the host's time between loop calls.
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

from bench_variants import variant_config  # This directory: the benchmark's set-up.
from trainer.outputs.profile import CATEGORIES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILED = (101, 160)  # Steps: three loop calls of K=20, well after tracing.


def profile_run(*, model, dataset, replicas, array_input, timeout):
  """One profiled run; returns its results.json "profile" (or {"error": ...})."""
  with tempfile.TemporaryDirectory() as model_dir:
    # The benchmark's config of this model, data and replica count, as flags.
    config = variant_config(
        argparse.Namespace(model=model, dataset=dataset, replicas=replicas,
                           per_replica_batch_size=32, steps_per_loop=20,
                           mixed_precision="none", jit_compile=False),
        model_dir=model_dir, train_steps=PROFILED[1] + 20, checkpoint_every=10**6,
        mode="train", profile_steps=PROFILED, array_input=array_input)
    process = subprocess.run([sys.executable, "-m", "trainer.main", *config.to_flags()],
                             cwd=REPO, capture_output=True, text=True,
                             timeout=timeout, check=False)
    try:
      with open(os.path.join(model_dir, "results.json")) as f:
        breakdown = json.load(f)["profile"]
    except (OSError, KeyError, ValueError):
      tail = (process.stderr.strip().splitlines() or ["no output"])[-1]
      return {"error": f"exit {process.returncode}: {tail[:300]}"}
  breakdown.pop("trace")  # In a directory that is gone.
  return breakdown


def render(rows) -> str:
  header = ["model", "data", "replicas", "input path", "ms per step", *CATEGORIES,
            "executor", "other", "host between calls (ms per call)"]
  lines = ["| " + " | ".join(header) + " |",
           "|" + "---|" * 4 + "---:|" * (len(header) - 4)]
  for row in rows:
    b = row["profile"]
    cells = [row["model"], row["dataset"], str(row["replicas"]), row["array_input"]]
    if "error" in b:
      lines.append("| " + " | ".join(cells + [b["error"]]) + " |")
      continue
    host = b["host_ms_between_calls"]
    cells += [f"{b['wall_ms_per_step']:.3f}",
              *(f"{b['op_ms_per_step'][p]:.3f}" for p in CATEGORIES),
              f"{b['executor_ms_per_step']:.3f}", f"{b['other_ms_per_step']:.3f}",
              "-" if host is None else f"{host:.2f}"]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="cnn")
  parser.add_argument("--datasets", default="synthetic,digits")
  parser.add_argument("--replicas", default="1,2")
  parser.add_argument("--array_input", default="gather,dataset",
                      help="trainer's --array_input values to profile")
  parser.add_argument("--timeout", type=int, default=600)
  parser.add_argument("--json", default="", help="also write the rows here")
  args = parser.parse_args(argv)
  rows = []
  for model, dataset, replicas, array_input in itertools.product(
      args.models.split(","), args.datasets.split(","),
      [int(r) for r in args.replicas.split(",")], args.array_input.split(",")):
    breakdown = profile_run(model=model, dataset=dataset, replicas=replicas,
                            array_input=array_input, timeout=args.timeout)
    rows.append({"model": model, "dataset": dataset, "replicas": replicas,
                 "array_input": array_input, "profile": breakdown})
    print(f"  {model} {dataset} x{replicas} {array_input}: "
          f"{breakdown.get('wall_ms_per_step', breakdown.get('error'))}",
          file=sys.stderr, flush=True)
  print(render(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)
  return 1 if any("error" in row["profile"] for row in rows) else 0


if __name__ == "__main__":
  sys.exit(main())
