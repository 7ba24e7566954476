"""`python -m trainer.inspect PATH`: a run or sweep summary without TensorBoard.

For use over ssh: reads results.json and the event files (every point, none
sampled away) and prints what TensorBoard would show in numbers. PATH is a run
directory (with train/ and maybe results.json) or a sweep root (with sweep.json,
or run directories below it).
"""

import math
import os
import sys

from trainer import tf_loader
from trainer.outputs import run_dir
from trainer.outputs.progress import format_metrics
from trainer.sweeps import report
from trainer.sweeps.runner import SWEEP_FILE
from trainer.sweeps.trial_run import TrialRun, results_metrics
from trainer.sweeps.spec import Trial

SPLITS = ("train", "eval")


def read_scalars(directory: str) -> dict:
  """{tag: [(step, value), ...]} of the scalar event files in `directory`."""
  tf_loader.load_tensorflow()  # TensorBoard's readers load TensorFlow if present.
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  accumulator = event_accumulator.EventAccumulator(
      directory, size_guidance={event_accumulator.TENSORS: 0,
                                event_accumulator.SCALARS: 0})
  accumulator.Reload()
  scalars = {}
  for tag in accumulator.Tags()[event_accumulator.TENSORS]:
    points = [(e.step, tensor_util.make_ndarray(e.tensor_proto))
              for e in accumulator.Tensors(tag)]
    if points and points[0][1].shape == () and points[0][1].dtype.kind == "f":
      scalars[tag] = [(step, float(value)) for step, value in points]
  return scalars


def is_run(path: str) -> bool:
  return (os.path.isfile(os.path.join(path, run_dir.RESULTS_FILE)) or
          os.path.isdir(os.path.join(path, "train")))


def _object(value) -> dict:
  """`value` if it is a JSON object, else {} (a hand-edited or foreign file)."""
  return value if isinstance(value, dict) else {}


def _number(value):
  """`value` if it is a number, else None."""
  return value if isinstance(value, (int, float)) and not isinstance(value,
                                                                      bool) else None


def run_summary(path: str) -> str:
  """A few lines on one run: status, metrics, ledger and every scalar's last value."""
  results = _object(run_dir.read_json(os.path.join(path, run_dir.RESULTS_FILE)))
  lines = []
  if results:
    speed = _number(results.get("examples_per_second"))
    lines.append(
        f"run {path}: {results.get('status')} at step {results.get('global_step')}/"
        f"{results.get('train_steps')}, {results.get('num_replicas')} replica(s) x "
        f"{results.get('per_replica_batch_size')} = global batch "
        f"{results.get('global_batch_size')}"
        + (f", {speed:,.0f} examples/s" if speed else ""))
    for split in SPLITS:
      values = _object(results.get(split))
      if values:
        numbers = {k: v for k, v in values.items()
                   if k != "step" and _number(v) is not None}
        extra = (f", {numbers['examples']} examples" if "examples" in numbers
                 else "")
        lines.append(f"  {split:<5} {format_metrics(numbers)}  (step "
                     f"{values.get('step')}{extra})")
    metric = results.get("best_metric")
    metric = metric if isinstance(metric, str) else "eval/loss"
    best = _object(results.get("best_eval"))
    value = _number(best.get(metric.split("/", 1)[-1]))
    if value is not None:
      lines.append(f"  best {metric} {value:.4f} at step {best.get('step')}")
    ledger = _object(results.get("replica_batches"))
    if ledger:
      lines.append("  ledger (batches per replica): " +
                   ", ".join(f"{k} {v}" for k, v in sorted(ledger.items())))
  else:
    lines.append(f"run {path}: no readable results.json yet (running, or stopped "
                 "before its first loop call ended)")
  lines.append("  scalars:")
  for split in SPLITS:
    directory = os.path.join(path, split)
    if not os.path.isdir(directory):
      continue
    for tag, points in sorted(read_scalars(directory).items()):
      values = [v for _, v in points]
      finite = [v for v in values if math.isfinite(v)]
      lines.append(f"    {split + '/' + tag:<34} {len(points):>5} points, steps "
                   f"{points[0][0]}..{points[-1][0]}, last {values[-1]:.6g}"
                   + (f", min {min(finite):.6g}, max {max(finite):.6g}" if finite
                      else ""))
  return "\n".join(lines)


def _sweep_runs(root: str, record: dict) -> list:
  """TrialRuns of a sweep root, from sweep.json refreshed by each results.json."""
  if record:
    entries = record.get("trials")
    entries = [e for e in (entries if isinstance(entries, list) else [])
               if isinstance(e, dict) and isinstance(e.get("name"), str)]
  else:
    entries = [{"name": n} for n in sorted(os.listdir(root))
               if is_run(os.path.join(root, n))]
  runs = []
  for entry in entries:
    command = entry.get("command")
    run = TrialRun(trial=Trial(name=entry["name"], values=_object(entry.get("values"))),
                   command=command if isinstance(command, list) else [],
                   model_dir=os.path.join(root, entry["name"]), log_path="",
                   status=str(entry.get("status", "unknown")),
                   attempts=_number(entry.get("attempts")) or 0,
                   error=str(entry.get("error", "")),
                   elapsed=_number(entry.get("elapsed_s")) or 0.0,
                   metrics={k: v for k, v in _object(entry.get("metrics")).items()
                            if _number(v) is not None})
    results = _object(run_dir.read_json(os.path.join(run.model_dir,
                                                     run_dir.RESULTS_FILE)))
    if results:
      run.metrics.update({k: v for k, v in results_metrics(results).items()
                          if _number(v) is not None})
      if not record:
        run.status = str(results.get("status", "unknown"))
    runs.append(run)
  return runs


def sweep_summary(root: str) -> str:
  """The sweep's trials, best first by its --metric, as the sweep's live table."""
  record = _object(run_dir.read_json(os.path.join(root, SWEEP_FILE)))
  runs = _sweep_runs(root, record)
  if not runs:
    return f"{root}: no runs here"
  metric = record.get("metric")
  metric = metric if isinstance(metric, str) else "eval/loss"
  goal = record.get("goal") if record.get("goal") in ("max", "min") else (
      "max" if metric == "examples_per_second" else "min")
  ordered = report.ranked(runs, metric=metric, goal=goal)
  return (f"sweep {root}: {len(runs)} trials, sorted by {metric} ({goal})\n"
          + report.live_table(ordered, list(runs[0].trial.values)) + "\n"
          + report.best_summary(runs, metric=metric, goal=goal))


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) != 1 or argv[0].startswith("-"):
    print("usage: python -m trainer.inspect RUN_OR_SWEEP_DIR", file=sys.stderr)
    return 2
  path = argv[0]
  if not os.path.isdir(path):
    print(f"inspect: error: {path}: no such directory", file=sys.stderr)
    return 2
  print(run_summary(path) if is_run(path) else sweep_summary(path))
  return 0


if __name__ == "__main__":
  sys.exit(main())
