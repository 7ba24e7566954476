"""A sweep's summary: its trials as the live table, best first, from sweep.json
refreshed by each trial's results.json (`python -m trainer.inspect ROOT`)."""

import os

from trainer.outputs import run_dir
from trainer.outputs.run_summary import as_number, as_object, is_run
from trainer.sweeps import report
from trainer.sweeps.runner import SWEEP_FILE
from trainer.sweeps.spec import Trial
from trainer.sweeps.trial_run import TrialRun, results_metrics


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
    trial = Trial(name=entry["name"], values=as_object(entry.get("values")))
    run = TrialRun(trial=trial,
                   command=command if isinstance(command, list) else [],
                   model_dir=os.path.join(root, entry["name"]), log_path="",
                   status=str(entry.get("status", "unknown")),
                   attempts=as_number(entry.get("attempts")) or 0,
                   error=str(entry.get("error", "")),
                   elapsed=as_number(entry.get("elapsed_s")) or 0.0,
                   metrics={k: v for k, v in as_object(entry.get("metrics")).items()
                            if as_number(v) is not None})
    results = as_object(run_dir.read_json(os.path.join(run.model_dir,
                                                     run_dir.RESULTS_FILE)))
    if results:
      run.metrics.update({k: v for k, v in results_metrics(results).items()
                          if as_number(v) is not None})
      if not record:
        run.status = str(results.get("status", "unknown"))
    runs.append(run)
  return runs


def sweep_summary(root: str) -> str:
  """The sweep's trials, best first by its --metric, as the sweep's live table."""
  record = as_object(run_dir.read_json(os.path.join(root, SWEEP_FILE)))
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
