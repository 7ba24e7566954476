"""A sweep trial's run: its command, process, status and metrics, and what its
log and results.json say about it (trainer/sweeps/runner.py runs them)."""

import dataclasses
import os
import subprocess
from typing import Optional

from trainer.outputs import progress, run_dir
from trainer.sweeps.spec import Trial


@dataclasses.dataclass
class TrialRun:
  """A trial and what is known of its runs so far."""
  trial: Trial
  command: list
  model_dir: str
  log_path: str
  status: str = "pending"  # pending, running, completed, pruned, diverged, failed,
  # interrupted
  attempts: int = 0
  returncode: Optional[int] = None
  error: str = ""
  elapsed: float = 0.0
  metrics: dict = dataclasses.field(default_factory=dict)
  process: Optional[subprocess.Popen] = None
  started: float = 0.0
  log_offset: int = 0
  optuna_trial: object = None  # The study's trial this run is (while running).
  elapsed_before: float = 0.0  # Seconds of earlier invocations.
  pruning: bool = False  # The pruner stopped it.
  lost: bool = False  # Another sweep process took its trial over.
  locked_since: float = 0.0  # When it first found its model_dir locked (exit 5).
  start_after: float = 0.0  # Not started again before this (time.monotonic()).
  train_steps: int = 0  # Its --train_steps: an evaluation there is its last.
  gate: object = None  # Its pruning gate (trainer/sweeps/gate.py), while it runs.
  verdicts: dict = dataclasses.field(default_factory=dict)  # step -> pruned?
  pruned_at: Optional[dict] = None  # The evaluation the pruner stopped it at.

  @property
  def name(self) -> str:
    return self.trial.name

  def record(self) -> dict:
    return {"name": self.name, "values": self.trial.values, "status": self.status,
            "attempts": self.attempts, "returncode": self.returncode,
            "error": self.error, "elapsed_s": round(self.elapsed, 1),
            "metrics": self.metrics, "command": self.command}

  def read_progress(self) -> list:
    """The progress lines its log has gained since the last call, parsed (its
    live metrics updated with them); a half-written line is left for later.

    Returns:
      [{"step": N, "NAME": value, ...}] in the log's order.
    """
    with open(self.log_path) as f:
      f.seek(self.log_offset)
      text = f.read()
    complete = text[:text.rfind("\n") + 1]
    self.log_offset += len(complete.encode())
    lines = [v for v in map(progress.parse_line, complete.splitlines()) if v]
    for values in lines:
      self.metrics.update(values)
    return lines


def recorded_run(record, *, model_dir: str, log_path: str) -> TrialRun:
  """A trial that does not run in this process (another sweep process's, or
  finished) as a TrialRun: what the study's record and its files say.

  Args:
    record: its study.Record.
    model_dir: its directory.
    log_path: its log.
  """
  run = TrialRun(trial=Trial(name=record.name, values=record.values), command=[],
                 model_dir=model_dir, log_path="", status=record.status,
                 attempts=record.attempts, error=record.error,
                 elapsed=record.elapsed)
  results = run_dir.read_json(os.path.join(model_dir, run_dir.RESULTS_FILE))
  if isinstance(results, dict):
    run.metrics = results_metrics(results)
  if record.status == "pruned" and record.pruned_at:
    run.metrics.update(record.pruned_at)  # What the pruner judged, as Optuna.
  run.command = logged_command(log_path)
  return run


def results_metrics(results: dict) -> dict:
  """The metrics a sweep compares, from a trial's results.json."""
  metrics = {"step": results.get("global_step")}
  for split in ("train", "eval"):
    values = results.get(split)
    if not isinstance(values, dict):
      continue
    for name, value in values.items():
      if name not in ("step", "examples") and isinstance(value, (int, float)):
        metrics[f"{split}/{name}"] = value
  if "examples_per_second" in results:
    metrics["examples_per_second"] = results["examples_per_second"]
  return metrics


def logged_evaluations(log_path: str) -> dict:
  """{step: {"eval/NAME": value, ...}} of every evaluation line in a trial's log,
  over all its attempts (a step's first, as Optuna keeps a step's first value)."""
  evaluations = {}
  try:
    with open(log_path, errors="replace") as f:
      for line in f:
        values = progress.parse_line(line)
        if any(name.startswith("eval/") for name in values):
          evaluations.setdefault(values.pop("step"), values)
  except OSError:
    pass
  return evaluations


def trial_env() -> dict:
  """The environment a trial runs in (the sweep's, unbuffered, no cluster)."""
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.pop("TF_CONFIG", None)  # A trial is one process, never a cluster worker.
  return env


def logged_command(log_path: str) -> list:
  """The command of a trial's latest attempt, from its log (another process's)."""
  try:
    with open(log_path, errors="replace") as f:
      attempts = [line for line in f if line.startswith("# attempt ")]
  except OSError:
    return []
  return attempts[-1].split(": ", 1)[1].split() if attempts else []


def last_error_line(log_path: str) -> str:
  """The trainer's one-line error (or the last line) of a trial's latest attempt."""
  with open(log_path, errors="replace") as f:
    lines = f.read().split("# attempt ")[-1].splitlines()[1:]
  errors = [line for line in lines if line.startswith("error:")]
  if errors:
    return errors[-1]
  return next((line for line in reversed(lines) if line.strip()), "")
