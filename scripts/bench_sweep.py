#!/usr/bin/env python
"""How long a sweep of short trials takes, and how much of it is process start-up.

  python scripts/bench_sweep.py --json=sweep_bench.json

Runs the same 16-trial grid sweep (4 learning rates x 4 seeds; the MLP on digits,
--train_steps=100 with an evaluation at the end) at --parallel=1 and --parallel=2,
with trials started cold (--no-fork_server: a new Python each) and warm (forked
from the sweep's fork server, which has imported TensorFlow once), each in a fresh
root, and reports for each: the sweep's wall time, the trials' mean wall time, and
the fraction of it spent before the first training step (imports, data, model,
tracing: results.json's time_to_first_step_s) against training, evaluation and
export.

  python scripts/bench_sweep.py --pruners=none,asha --json=prune_bench.json

measures what pruning saves instead: the same seeded random search (12 learning
rates, log-uniform in 1e-5..1e-1; the MLP on digits, --train_steps=600 with an
evaluation every 100 steps) run once per pruner, each in a fresh root, reporting
the training steps the trials ran in all (results.json's global_step, summed)
against the sweep without a pruner, the steps pruned trials ran after the
evaluation they were pruned at (Optuna's last reported step), and the best
trial's eval/accuracy.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRID = ["--grid=learning_rate=0.1,0.03,0.01,0.003", "--grid=seed=1,2,3,4"]
TRIAL = ["--", "--dataset=digits", "--model=mlp", "--train_steps=100",
         "--mode=train_and_eval"]


def run_sweep(root: str, parallel: int, start: str) -> dict:
  """Runs the sweep in `root` with trials started `start` ("cold" or "warm");
  returns its timings."""
  command = [sys.executable, os.path.join(REPO, "scripts", "sweep.py"),
             f"--root={root}", f"--parallel={parallel}", *GRID,
             "--metric=eval/accuracy",
             "--fork_server" if start == "warm" else "--no-fork_server", *TRIAL]
  began = time.perf_counter()
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          check=False)
  wall = time.perf_counter() - began
  if result.returncode != 0:
    raise RuntimeError(f"sweep failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
  with open(os.path.join(root, "sweep.json")) as f:
    trials = json.load(f)["trials"]
  elapsed, startup = [], []
  for trial in trials:
    with open(os.path.join(root, trial["name"], "results.json")) as f:
      results = json.load(f)
    elapsed.append(trial["elapsed_s"])
    startup.append(results["time_to_first_step_s"])
  return {"start": start, "parallel": parallel, "trials": len(trials),
          "sweep_wall_s": round(wall, 1),
          "trial_wall_s_mean": round(statistics.mean(elapsed), 2),
          "time_to_first_step_s_mean": round(statistics.mean(startup), 2),
          "startup_fraction": round(sum(startup) / sum(elapsed), 3)}


PRUNE_SEARCH = ["--random=learning_rate=loguniform:1e-5:1e-1", "--trials=12",
                "--seed=0", "--metric=eval/accuracy"]
PRUNE_STEPS = 600
PRUNE_TRIAL = ["--", "--dataset=digits", "--model=mlp",
               f"--train_steps={PRUNE_STEPS}", "--eval_every=100",
               "--mode=train_and_eval"]


def run_pruned_sweep(root: str, parallel: int, pruner: str) -> dict:
  """Runs the pruning benchmark's sweep in `root` with `pruner`; returns the
  compute its trials used."""
  import optuna
  command = [sys.executable, os.path.join(REPO, "scripts", "sweep.py"),
             f"--root={root}", f"--parallel={parallel}", *PRUNE_SEARCH,
             f"--pruner={pruner}", *PRUNE_TRIAL]
  began = time.perf_counter()
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          check=False)
  wall = time.perf_counter() - began
  if result.returncode != 0:
    raise RuntimeError(f"sweep failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
  with open(os.path.join(root, "sweep.json")) as f:
    trials = json.load(f)["trials"]
  steps = {}
  for trial in trials:
    with open(os.path.join(root, trial["name"], "results.json")) as f:
      steps[trial["name"]] = json.load(f)["global_step"]
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  study = optuna.load_study(study_name="sweep",
                            storage=f"sqlite:///{os.path.join(root, 'study.db')}")
  pruned = [t for t in study.get_trials()
            if t.state == optuna.trial.TrialState.PRUNED]
  completed = [t["metrics"].get("eval/accuracy") for t in trials
               if t["status"] == "completed"]
  return {"pruner": pruner, "parallel": parallel, "trials": len(trials),
          "pruned": len(pruned), "trial_steps": sum(steps.values()),
          "trial_steps_unpruned": len(trials) * PRUNE_STEPS,
          "steps_after_verdict": sum(steps[t.user_attrs["name"]] - t.last_step
                                     for t in pruned),
          "pruned_at": sorted(t.last_step for t in pruned),
          "sweep_wall_s": round(wall, 1),
          "best_eval_accuracy": max((a for a in completed if a is not None),
                                    default=None)}


def _prune_main(args) -> int:
  rows = []
  with tempfile.TemporaryDirectory() as scratch:
    for parallel in [int(p) for p in args.parallel.split(",")]:
      for pruner in args.pruners.split(","):
        root = os.path.join(scratch, f"{pruner}-p{parallel}")
        rows.append(run_pruned_sweep(root, parallel, pruner))
        print(json.dumps(rows[-1]), flush=True)
  print("\n| pruner | --parallel | trials | pruned (at steps) | trial-steps run "
        "| saved vs. no pruner | steps run after the verdict | sweep wall (s) "
        "| best eval/accuracy |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    baseline = next((b["trial_steps"] for b in rows if b["pruner"] == "none" and
                     b["parallel"] == r["parallel"]), r["trial_steps_unpruned"])
    print(f"| {r['pruner']} | {r['parallel']} | {r['trials']} | {r['pruned']} "
          f"({', '.join(map(str, r['pruned_at'])) or '-'}) | {r['trial_steps']} | "
          f"{1 - r['trial_steps'] / baseline:.0%} | {r['steps_after_verdict']} | "
          f"{r['sweep_wall_s']} | {r['best_eval_accuracy'] or 0:.4f} |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"pruning": rows}, f, indent=1)
  return 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--json", help="also write the numbers to this file")
  parser.add_argument("--pruners",
                      help="comma-separated pruners (none, median, asha, "
                           "hyperband): measure the compute pruning saves instead")
  parser.add_argument("--parallel", default="1,2",
                      help="comma-separated --parallel values (default 1,2)")
  parser.add_argument("--start", default="cold,warm",
                      help="comma-separated trial starts: cold, warm (default both)")
  args = parser.parse_args(argv)
  if args.pruners:
    return _prune_main(args)
  rows = []
  with tempfile.TemporaryDirectory() as scratch:
    for parallel in [int(p) for p in args.parallel.split(",")]:
      for start in args.start.split(","):
        root = os.path.join(scratch, f"{start}-p{parallel}")
        rows.append(run_sweep(root, parallel, start))
        print(json.dumps(rows[-1]), flush=True)
  print("\n| trials start | --parallel | trials | sweep wall (s) "
        "| trial wall, mean (s) "
        "| start-up to first step, mean (s) | start-up share |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['start']} | {r['parallel']} | {r['trials']} | {r['sweep_wall_s']} | "
          f"{r['trial_wall_s_mean']} | {r['time_to_first_step_s_mean']} | "
          f"{r['startup_fraction']:.0%} |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"sweeps": rows}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
