"""Runs a sweep's trials as `python -m trainer.main` subprocesses, --parallel at once.

Each trial trains in ROOT/<trial name> and logs to ROOT/logs/<trial name>.log. A
trial whose results.json says "completed" is done and skipped on a rerun; an
interrupted one resumes from its checkpoints (the trainer does that by itself on
the same model_dir); a failed one is retried. A failure is recorded with its error
line and never stops the other trials. ROOT/sweep.json records every trial's state
so a rerun (and `python -m trainer.inspect ROOT`) knows what happened.
"""

import dataclasses
import os
import signal
import subprocess
import sys
import time
from typing import Optional

from trainer.outputs import progress, run_dir
from trainer.errors import ExitCode
from trainer.sweeps.spec import Trial

SWEEP_FILE = "sweep.json"
FINISHED = ("completed", "early_stopped")  # A trial's results.json statuses: done.
LOG_DIR = "logs"
_POLL_SECONDS = 0.25
_LIVE_TABLE_SECONDS = 1.0  # On a terminal the table is redrawn in place.
_PLAIN_TABLE_SECONDS = 30.0  # In a log: on every start and end, and this often.


@dataclasses.dataclass
class TrialRun:
  """A trial and what is known of its runs so far."""
  trial: Trial
  command: list
  model_dir: str
  log_path: str
  status: str = "pending"  # pending, running, completed, diverged, failed, interrupted
  attempts: int = 0
  returncode: Optional[int] = None
  error: str = ""
  elapsed: float = 0.0
  metrics: dict = dataclasses.field(default_factory=dict)
  process: Optional[subprocess.Popen] = None
  started: float = 0.0
  log_offset: int = 0

  @property
  def name(self) -> str:
    return self.trial.name

  def record(self) -> dict:
    return {"name": self.name, "values": self.trial.values, "status": self.status,
            "attempts": self.attempts, "returncode": self.returncode,
            "error": self.error, "elapsed_s": round(self.elapsed, 1),
            "metrics": self.metrics, "command": self.command}


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


class Sweep:
  """Schedules the trials of one sweep root and keeps its record."""

  def __init__(self, *, root: str, runs: list, parallel: int, retries: int,
               table, out=None, ranking: Optional[dict] = None):
    """Creates the scheduler.

    Args:
      root: the sweep directory (trials are its subdirectories).
      runs: TrialRun for every trial, in order.
      parallel: how many trials run at once.
      retries: extra attempts a failed trial gets in this invocation.
      table: `table(runs) -> str`, the live table's text.
      out: where the table and messages go (default stdout).
      ranking: {"metric": ..., "goal": ...}, recorded in sweep.json for readers.
    """
    self._ranking = ranking or {}
    self.bad_metric = None  # Why --metric cannot rank, once a trial shows it.
    self.root = root
    self.runs = runs
    self._parallel = parallel
    self._retries = retries
    self._table = table
    self._out = out or sys.stdout
    self._stopping = None  # The signal name once asked to stop.
    self._drawn_lines = 0
    self._last_draw = 0.0
    self._live = self._out.isatty()

  def run(self) -> int:
    """Runs every unfinished trial; returns the sweep's exit code.

    Returns:
      0 if every trial completed, 4 if interrupted, 1 if any trial failed or
      diverged (the rest still ran).
    """
    os.makedirs(os.path.join(self.root, LOG_DIR), exist_ok=True)
    self._load_previous()
    queue = [r for r in self.runs if r.status != "completed"]
    done = len(self.runs) - len(queue)
    if done:
      self._say(f"{done} of {len(self.runs)} trials already completed; skipping them")
    attempts_left = {r.name: 1 + self._retries for r in queue}
    previous = {s: signal.signal(s, self._request_stop)
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      running = []
      while queue or running:
        changed = False
        while queue and len(running) < self._parallel and not self._stopping:
          run = queue.pop(0)
          attempts_left[run.name] -= 1
          self._start(run)
          running.append(run)
          changed = self._live  # In a log, a table per trial end is enough.
        self._draw(force=changed)
        time.sleep(_POLL_SECONDS)
        changed = False
        for run in list(running):
          self._read_log(run)
          if run.process.poll() is not None:
            running.remove(run)
            self._finish(run)
            changed = True
            if run.status == "failed" and attempts_left[run.name] > 0:
              self._say(f"{run.name}: failed ({run.error}); retrying once")
              queue.append(run)
          else:
            run.elapsed = time.monotonic() - run.started
        if self._stopping:
          queue = []
        self._draw(force=changed)
    finally:
      for sig, old in previous.items():
        signal.signal(sig, old)
      self._save_record()
    self._draw(force=True, final=True)
    if self.bad_metric:
      return int(ExitCode.BAD_INPUT)
    if self._stopping:
      return int(ExitCode.INTERRUPTED)
    return 0 if all(r.status == "completed" for r in self.runs) else 1

  def _request_stop(self, signum, frame):
    del frame
    self._stopping = signal.Signals(signum).name
    for run in self.runs:
      if run.process is not None and run.process.poll() is None:
        run.process.send_signal(signal.SIGTERM)  # The trial saves and exits 4.

  def _load_previous(self):
    """Marks trials completed by an earlier invocation; keeps their record."""
    record = run_dir.read_json(os.path.join(self.root, SWEEP_FILE))
    trials = record.get("trials") if isinstance(record, dict) else None
    previous = {t["name"]: t for t in (trials if isinstance(trials, list) else [])
                if isinstance(t, dict) and isinstance(t.get("name"), str)}
    for run in self.runs:
      old = previous.get(run.name, {})
      attempts, elapsed = old.get("attempts"), old.get("elapsed_s")
      run.attempts = attempts if isinstance(attempts, int) else 0
      run.elapsed = float(elapsed) if isinstance(elapsed, (int, float)) else 0.0
      results = run_dir.read_json(os.path.join(run.model_dir, run_dir.RESULTS_FILE))
      if isinstance(results, dict) and results.get("status") in FINISHED:
        run.status, run.metrics = "completed", results_metrics(results)
        run.error = ""
      elif old:
        run.status, run.error = old.get("status", "pending"), old.get("error", "")
        if run.status == "completed":  # Its results.json is gone: redo it.
          run.status = "pending"

  def _start(self, run):
    run.attempts += 1
    run.status, run.error, run.returncode = "running", "", None
    run.started = time.monotonic()
    log = open(run.log_path, "a")  # pylint: disable=consider-using-with
    log.write(f"# attempt {run.attempts}: {' '.join(run.command)}\n")
    log.flush()
    run.log_offset = os.path.getsize(run.log_path)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)  # A trial is one process, never a cluster worker.
    with log:
      run.process = subprocess.Popen(run.command, stdout=log, stderr=subprocess.STDOUT,
                                     env=env, stdin=subprocess.DEVNULL)
    self._save_record()

  def _read_log(self, run):
    """Updates the trial's live metrics from new progress lines in its log."""
    with open(run.log_path) as f:
      f.seek(run.log_offset)
      text = f.read()
    complete = text[:text.rfind("\n") + 1]  # Leave a half-written line for later.
    run.log_offset += len(complete.encode())
    for line in complete.splitlines():
      run.metrics.update(progress.parse_line(line))

  def _finish(self, run):
    run.returncode = run.process.returncode
    run.elapsed = time.monotonic() - run.started
    results = run_dir.read_json(os.path.join(run.model_dir, run_dir.RESULTS_FILE))
    if isinstance(results, dict):
      run.metrics.update(results_metrics(results))
    statuses = {0: "completed", int(ExitCode.DIVERGED): "diverged",
                int(ExitCode.INTERRUPTED): "interrupted"}
    run.status = statuses.get(run.returncode, "failed")
    if run.status == "completed" and isinstance(results, dict) and (
        results.get("status") == "time_limit"):
      run.status = "interrupted"  # Out of --max_time: a rerun resumes it.
    if self._stopping and run.returncode in (-signal.SIGTERM, -signal.SIGINT):
      run.status = "interrupted"  # Stopped by the sweep before it could save.
    if run.status != "completed":
      run.error = _last_error_line(run.log_path) or f"exit code {run.returncode}"
    metric = self._ranking.get("metric")
    if run.status == "completed" and metric and metric not in run.metrics:
      reported = sorted(k for k in run.metrics if "/" in k or k == "examples_per_second")
      self.bad_metric = (f"--metric={metric}: trial {run.name} completed without "
                         f"reporting it (it reports {', '.join(reported)})")
      self._request_stop(signal.SIGTERM, None)  # No trial can be ranked: stop.
    self._save_record()

  def _save_record(self):
    run_dir.write_json(os.path.join(self.root, SWEEP_FILE),
                       dict(self._ranking, trials=[r.record() for r in self.runs]))

  def _say(self, message):
    self._out.write(message + "\n")
    self._out.flush()
    self._drawn_lines = 0

  def _draw(self, *, force=False, final=False):
    """Redraws the table in place on a terminal, else prints it now and then.

    Args:
      force: a trial started or ended: draw now.
      final: the last table, left on screen.
    """
    now = time.monotonic()
    interval = _LIVE_TABLE_SECONDS if self._live else _PLAIN_TABLE_SECONDS
    if not (force or final or now - self._last_draw >= interval):
      return
    text = self._table(self.runs)
    if self._live and self._drawn_lines:
      self._out.write(f"\x1b[{self._drawn_lines}F\x1b[J")  # Up, then clear below.
    self._out.write(text + "\n")
    self._out.flush()
    self._drawn_lines = text.count("\n") + 1 if self._live and not final else 0
    self._last_draw = now


def _last_error_line(log_path: str) -> str:
  """The trainer's one-line error (or the last line) of a trial's latest attempt."""
  with open(log_path, errors="replace") as f:
    lines = f.read().split("# attempt ")[-1].splitlines()[1:]
  errors = [line for line in lines if line.startswith("error:")]
  if errors:
    return errors[-1]
  return next((line for line in reversed(lines) if line.strip()), "")
