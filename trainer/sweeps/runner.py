"""Runs a sweep's trials as `python -m trainer.main` processes, --parallel at once:
forked warm from the fork server (trainer/sweeps/forkserver.py) by default, or
started cold (trainer/sweeps/launcher.py).

The trials come from the sweep's Optuna study (trainer/sweeps/study.py), which
several sweep processes may share: each claims the next waiting trial. Each trial
trains in ROOT/<trial name> and logs to ROOT/logs/<trial name>.log. Its
evaluations are reported to the study's pruner as they appear in the log, each
while the trial waits for the verdict at that evaluation (trainer/sweeps/gate.py,
trainer/sweeps/pruning.py); a pruned trial stops there like an interrupted one
(checkpoint, exit 4) and is marked "pruned", with the evaluation the pruner
judged as its values. The last evaluation is never pruned (nothing is left to
save). A failed trial is retried; a failure is recorded with its error line and
never stops the other trials. An interrupted trial goes back to the queue and
resumes from its checkpoints when the sweep is rerun; the evaluations of earlier
attempts that the study lacks are reported when it is claimed. ROOT/sweep.json
records every trial's state for `python -m trainer.inspect ROOT`.

A trial dies with its sweep (PR_SET_PDEATHSIG: a SIGKILLed sweep's trials get a
SIGTERM, save and stop), so a rerun can take them over; the rerun waits for one
still saving to let go of its model_dir.
"""

import os
import signal
import sys
import time
from typing import Optional

from trainer.errors import ExitCode
from trainer.outputs import run_dir
from trainer.sweeps import report, trial_run
from trainer.sweeps.display import Display
from trainer.sweeps.launcher import Launcher
from trainer.sweeps.ownership import HEARTBEAT_SECONDS, STALE_SECONDS
from trainer.sweeps.pruning import Pruning, record_pruned
from trainer.sweeps.trial_run import results_metrics

SWEEP_FILE = "sweep.json"
FINISHED = ("completed", "early_stopped")  # A trial's results.json statuses: done.
LOG_DIR = "logs"
_POLL_SECONDS = 0.25
# A killed sweep's trial saves its checkpoint before it lets go of its model_dir:
# the rerun's attempt that finds it locked waits this long for it, then fails.
LOCK_WAIT_SECONDS = 300.0
_LOCK_RETRY_SECONDS = 2.0


class Sweep:
  """Runs the trials this process claims from the study, and keeps the record."""

  def __init__(self, *, root: str, queue, make_run, parallel: int, retries: int,
               table, out=None, ranking: Optional[dict] = None,
               prune_metric: Optional[str] = None, fork_server: bool = False):
    """Creates the scheduler.

    Args:
      root: the sweep directory (trials are its subdirectories).
      queue: the sweep's StudyQueue.
      make_run: `make_run(name, values) -> TrialRun`, a trial's command.
      parallel: how many trials this process runs at once.
      retries: extra attempts a failed trial gets in this invocation.
      table: `table(runs) -> str`, the live table's text.
      out: where the table and messages go (default stdout).
      ranking: {"metric": ..., "goal": ...}, recorded in sweep.json for readers.
      prune_metric: "eval/NAME" reported to the study's pruner (None: no pruning).
      fork_server: start trials warm, forked from a process that has imported
        TensorFlow (trainer/sweeps/forkserver.py), instead of cold.
    """
    self._ranking = ranking or {}
    self.bad_metric = None  # Why --metric cannot rank, once a trial shows it.
    self.root = root
    self._queue = queue
    self._make_run = make_run
    self._parallel = parallel
    self._retries = retries
    self._display = Display(out=out or sys.stdout,
                            table=lambda: table(self.runs()))
    self._say = self._display.say
    self._pruning = Pruning(queue=queue, metric=prune_metric, say=self._say)
    self._launcher = Launcher(fork_server=fork_server, say=self._say)
    self._stopping = None  # The signal name once asked to stop.
    self._running = []
    # Runs to start again: failed with attempts left, or waiting for a lock.
    # Started before new claims once due.
    self._retry = []
    self._attempts_left = {}  # name -> attempts left in this invocation.
    self._last_beat = 0.0

  def _done(self, name) -> bool:
    results = run_dir.read_json(os.path.join(self.root, name, run_dir.RESULTS_FILE))
    return isinstance(results, dict) and results.get("status") in FINISHED

  def run(self) -> int:
    """Runs trials until the study has none waiting; returns the exit code.

    Returns:
      0 if no trial failed (the others completed, were pruned, or still run in
      other sweep processes), 4 if interrupted, 1 if any trial failed or diverged
      (the rest still ran).
    """
    os.makedirs(os.path.join(self.root, LOG_DIR), exist_ok=True)
    done = self._queue.prepare(done=self._done)
    if done:
      self._say(f"{done} of {self._queue.total} trials already completed; "
                "skipping them")
    previous = {s: signal.signal(s, self._request_stop)
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      while True:
        # In a log, a table per trial end is enough.
        changed = self._start_trials() and self._display.live
        if self._stopping:  # Left for the rerun, as an interrupted trial is.
          for run in self._retry:
            self._end(run, "interrupted" if run.status == "pending" else None)
          self._retry.clear()
        if not self._running and not self._retry:
          break
        self._display.draw(force=changed)
        self._pruning.wait(self._running, _POLL_SECONDS)
        changed = self._follow_trials()
        for run in self._heartbeat(self._retry):
          self._retry.remove(run)
        self._display.draw(force=changed)
    finally:
      for sig, old in previous.items():
        signal.signal(sig, old)
      self._launcher.close()
      for run in self._running:
        self._pruning.close_gate(run)
      self._save_record()
    self._display.draw(force=True, final=True)
    return self._exit_code()

  def _start_trials(self) -> bool:
    """Starts trials while fewer than --parallel run here: retries that are due,
    then new claims. Returns whether any was taken up."""
    taken = False
    while len(self._running) < self._parallel and not self._stopping:
      ready = [r for r in self._retry if r.start_after <= time.monotonic()]
      run = ready[0] if ready else self._claim()
      if run is None:
        break
      if ready:
        self._retry.remove(run)
      self._attempts_left.setdefault(run.name, 1 + self._retries)
      self._attempts_left[run.name] -= 1
      if self._start(run):
        self._running.append(run)
      taken = True
    return taken

  def _follow_trials(self) -> bool:
    """Reads the running trials' logs, answers their gates, and deals with those
    that ended. Returns whether any ended."""
    ended = False
    for run in list(self._running):
      self._pruning.read_log(run)
      self._pruning.answer(run)
      if run.process.poll() is None:
        run.elapsed = run.elapsed_before + time.monotonic() - run.started
        continue
      self._running.remove(run)
      self._finish(run)
      ended = True
      if run.lost:
        self._say(f"{run.name}: another sweep process took it over (no heartbeat "
                  f"from here for {STALE_SECONDS:.0f}s); stopped here")
      elif self._wait_for_lock(run):
        self._attempts_left[run.name] += 1  # Not an attempt: it never started.
        self._retry.append(run)
      elif run.status == "failed" and self._attempts_left[run.name] > 0 and (
          not self._stopping):
        self._say(f"{run.name}: failed ({run.error}); retrying once")
        self._retry.append(run)
      else:
        self._end(run)
    return ended

  def _exit_code(self) -> int:
    """The sweep's exit code, once this process has no trial left (see `run`)."""
    if self.bad_metric:
      return int(ExitCode.BAD_INPUT)
    if self._stopping:
      return int(ExitCode.INTERRUPTED)
    runs = self.runs()
    elsewhere = sum(r.status == "running" for r in runs)
    if elsewhere:
      self._say(f"{elsewhere} trial(s) still running in other sweep processes of "
                "this study; their results join the table when they finish")
    return 1 if any(r.status in ("failed", "diverged") for r in runs) else 0

  def _end(self, run, status=None):
    """Records in the study (and the trial's results.json) how a run ended."""
    run.status = status or run.status
    self._queue.finish(run.optuna_trial, status=run.status,
                       value=run.metrics.get(self._ranking.get("metric")),
                       attempts=run.attempts, error=run.error, elapsed=run.elapsed)
    report.write_trial_status(run.model_dir, run.status, step=run.metrics.get("step"))
    if not self._display.live:  # A log: a line per finished trial, not a table.
      self._say(report.trial_line(run, metric=self._ranking.get("metric")))

  def _wait_for_lock(self, run) -> bool:
    """Whether a trial that found its model_dir locked (exit 5) tries again soon:
    for LOCK_WAIT_SECONDS, the time a killed sweep's trial may take to save."""
    now = time.monotonic()
    if run.returncode != int(ExitCode.LOCKED) or self._stopping or (
        run.locked_since and now - run.locked_since > LOCK_WAIT_SECONDS):
      return False
    if not run.locked_since:
      run.locked_since = now
      self._say(f"{run.name}: its model_dir is locked by an earlier run of it (e.g. "
                "a killed sweep's trial still saving); waiting for it")
    run.attempts -= 1
    run.status = "pending"
    run.start_after = now + _LOCK_RETRY_SECONDS
    return True

  def _claim(self):
    """The next claimed trial to start, or None when the study has none waiting.
    One found pruned already (its sweep process was killed after the verdict) is
    recorded as pruned, not started."""
    while True:
      claimed = self._queue.claim()
      if claimed is None:
        return None
      trial, name, values = claimed
      run = self._make_run(name, values)
      run.optuna_trial = trial
      run.attempts = trial.user_attrs.get("attempts", 0)
      run.elapsed_before = run.elapsed = trial.user_attrs.get("elapsed", 0.0)
      if not self._pruning.catch_up(run):
        return run
      self._end_pruned_unstarted(run)

  def _end_pruned_unstarted(self, run):
    """Records a claimed trial that the pruner has stopped already as pruned."""
    run.pruning = True
    results = run_dir.read_json(os.path.join(run.model_dir, run_dir.RESULTS_FILE))
    if isinstance(results, dict):
      run.metrics.update(results_metrics(results))
    record_pruned(run, results)
    self._say(f"{run.name}: pruned at its evaluation at step "
              f"{run.pruned_at['step']} (its sweep process ended before it did); "
              "not resumed")
    self._end(run, "pruned")

  def _heartbeat(self, waiting) -> list:
    """Tells the study that this process's trials (running, or `waiting` to start
    again) are alive. Returns the waiting ones another process took over meanwhile;
    running ones it took over are stopped (SIGTERM) and marked lost."""
    if time.monotonic() - self._last_beat < HEARTBEAT_SECONDS:
      return []
    self._last_beat = time.monotonic()
    lost = []
    for run in self._running + list(waiting):
      if not self._queue.set_attrs(run.optuna_trial, heartbeat=time.time()):
        run.lost = True
        if run in self._running:
          run.process.send_signal(signal.SIGTERM)
        else:
          lost.append(run)
    return lost

  def runs(self) -> list:
    """Every trial of the study as a TrialRun: this process's running ones live,
    the others from the study and their results.json."""
    live = {run.name: run for run in self._running}
    runs = []
    for record in self._queue.records():
      if record.name in live:
        runs.append(live[record.name])
      else:  # A trial of another process, or finished.
        runs.append(trial_run.recorded_run(
            record, model_dir=os.path.join(self.root, record.name),
            log_path=os.path.join(self.root, LOG_DIR, record.name + ".log")))
    return runs

  def _request_stop(self, signum, frame):
    del frame
    self._stopping = signal.Signals(signum).name
    for run in self._running:
      if run.process is not None and run.process.poll() is None:
        run.process.send_signal(signal.SIGTERM)  # The trial saves and exits 4.

  def _start(self, run) -> bool:
    """Starts a run's next attempt; False if its trial is no longer this
    process's (another sweep process took it over)."""
    run.attempts += 1
    if not self._queue.set_attrs(run.optuna_trial, attempts=run.attempts):
      self._say(f"{run.name}: another sweep process took it over; not started here")
      return False
    run.status, run.error, run.returncode = "running", "", None
    run.started = time.monotonic()
    log = open(run.log_path, "a")
    log.write(f"# attempt {run.attempts}: {' '.join(run.command)}\n")
    log.flush()
    run.log_offset = os.path.getsize(run.log_path)
    self._pruning.open_gate(run)
    with log:
      run.process = self._launcher.spawn(run, log=log)
    if self._stopping:  # Asked to stop while it was being started.
      run.process.send_signal(signal.SIGTERM)
    self._save_record()
    return True

  def _finish(self, run):
    run.returncode = run.process.returncode
    # Lines written after the last read (an interrupted trial's last evaluation
    # is still judged: pruned, it is not resumed).
    self._pruning.read_log(run,
                           can_prune=run.returncode == int(ExitCode.INTERRUPTED))
    self._pruning.close_gate(run)
    run.elapsed = run.elapsed_before + time.monotonic() - run.started
    results = run_dir.read_json(os.path.join(run.model_dir, run_dir.RESULTS_FILE))
    if isinstance(results, dict):
      run.metrics.update(results_metrics(results))
    run.status = self._ended_status(run, results)
    if run.pruning and run.status in ("interrupted", "completed"):
      record_pruned(run, results)
    if run.status not in ("completed", "pruned"):
      run.error = (trial_run.last_error_line(run.log_path) or
                   f"exit code {run.returncode}")
    metric = self._ranking.get("metric")
    if run.status == "completed" and metric and metric not in run.metrics:
      reported = sorted(k for k in run.metrics
                        if "/" in k or k == "examples_per_second")
      self.bad_metric = (f"--metric={metric}: trial {run.name} completed without "
                         f"reporting it (it reports {', '.join(reported)})")
      self._request_stop(signal.SIGTERM, None)  # No trial can be ranked: stop.
    self._save_record()

  def _ended_status(self, run, results) -> str:
    """How a trial's process ended, from its exit code and results.json (before
    pruning is taken into account)."""
    statuses = {0: "completed", int(ExitCode.DIVERGED): "diverged",
                int(ExitCode.INTERRUPTED): "interrupted"}
    status = statuses.get(run.returncode, "failed")
    if status == "completed" and isinstance(results, dict) and (
        results.get("status") == "time_limit"):
      status = "interrupted"  # Out of --max_time: a rerun resumes it.
    if self._stopping and run.returncode in (-signal.SIGTERM, -signal.SIGINT):
      status = "interrupted"  # Stopped by the sweep before it could save.
    return status

  def _save_record(self):
    run_dir.write_json(os.path.join(self.root, SWEEP_FILE),
                       dict(self._ranking, trials=[r.record() for r in self.runs()]))
