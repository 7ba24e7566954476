"""Runs a sweep's trials as `python -m trainer.main` processes, --parallel at once:
forked warm from the fork server (trainer/sweeps/forkserver.py) by default, or
started cold.

The trials come from the sweep's Optuna study (trainer/sweeps/study.py), which
several sweep processes may share: each claims the next waiting trial. Each trial
trains in ROOT/<trial name> and logs to ROOT/logs/<trial name>.log. Its
evaluations are reported to the study's pruner as they appear in the log, each
while the trial waits for the verdict at that evaluation (trainer/sweeps/gate.py);
a pruned trial stops there like an interrupted one (checkpoint, exit 4) and is
marked "pruned", with the evaluation the pruner judged as its values. The last
evaluation is never pruned (nothing is left to save). A failed trial is retried;
a failure is recorded with its error line and never stops the other trials. An
interrupted trial goes back to the queue and resumes from its checkpoints when
the sweep is rerun; the evaluations of earlier attempts that the study lacks are
reported when it is claimed. ROOT/sweep.json records every trial's state for
`python -m trainer.inspect ROOT`.

A trial dies with its sweep (PR_SET_PDEATHSIG: a SIGKILLed sweep's trials get a
SIGTERM, save and stop), so a rerun can take them over; the rerun waits for one
still saving to let go of its model_dir.
"""

import os
import select
import signal
import subprocess
import sys
import time
from typing import Optional

from trainer.outputs import progress, run_dir
from trainer.errors import ExitCode
from trainer.sweeps import forkserver, gate, report, trial_run
from trainer.sweeps.spec import Trial
from trainer.sweeps.trial_run import TrialRun, results_metrics
from trainer.sweeps.study import HEARTBEAT_SECONDS, STALE_SECONDS

SWEEP_FILE = "sweep.json"
FINISHED = ("completed", "early_stopped")  # A trial's results.json statuses: done.
LOG_DIR = "logs"
_POLL_SECONDS = 0.25
_LIVE_TABLE_SECONDS = 1.0  # On a terminal the table is redrawn in place.
_PLAIN_TABLE_SECONDS = 30.0  # In a log: on every start and end, and this often.
# A killed sweep's trial saves its checkpoint before it lets go of its model_dir:
# the rerun's attempt that finds it locked waits this long for it, then fails.
LOCK_WAIT_SECONDS = 300.0
_LOCK_RETRY_SECONDS = 2.0


_DIE_WITH_PARENT = forkserver.die_with_parent_function()


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
    self._prune_metric = prune_metric
    self._parallel = parallel
    self._retries = retries
    self._table = table
    self._out = out or sys.stdout
    self._stopping = None  # The signal name once asked to stop.
    self._drawn_lines = 0
    self._last_draw = 0.0
    self._live = self._out.isatty()
    self._running = []
    self._last_beat = 0.0
    self._fork_server = fork_server
    self._server = None  # The ForkServer, once the first trial starts.

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
    retry = []  # Runs to start again: failed with attempts left, or waiting
    # for a lock. Started before new claims once due.
    attempts_left = {}
    try:
      while True:
        changed = False
        while len(self._running) < self._parallel and not self._stopping:
          ready = [r for r in retry if r.start_after <= time.monotonic()]
          run = ready[0] if ready else self._claim()
          if run is None:
            break
          if ready:
            retry.remove(run)
          attempts_left.setdefault(run.name, 1 + self._retries)
          attempts_left[run.name] -= 1
          if self._start(run):
            self._running.append(run)
          changed = self._live  # In a log, a table per trial end is enough.
        if self._stopping:  # Left for the rerun, as an interrupted trial is.
          for run in retry:
            self._end(run, "interrupted" if run.status == "pending" else None)
          retry.clear()
        if not self._running and not retry:
          break
        self._draw(force=changed)
        self._wait_for_trials()
        changed = False
        for run in list(self._running):
          self._read_log(run)
          self._answer(run)
          if run.process.poll() is None:
            run.elapsed = run.elapsed_before + time.monotonic() - run.started
            continue
          self._running.remove(run)
          self._finish(run)
          changed = True
          if run.lost:
            self._say(f"{run.name}: another sweep process took it over (no heartbeat "
                      f"from here for {STALE_SECONDS:.0f}s); stopped here")
          elif self._wait_for_lock(run):
            attempts_left[run.name] += 1  # Not an attempt: it never started.
            retry.append(run)
          elif run.status == "failed" and attempts_left[run.name] > 0 and (
              not self._stopping):
            self._say(f"{run.name}: failed ({run.error}); retrying once")
            retry.append(run)
          else:
            self._end(run)
        for run in self._heartbeat(retry):
          retry.remove(run)
        self._draw(force=changed)
    finally:
      for sig, old in previous.items():
        signal.signal(sig, old)
      if self._server is not None:
        self._server.close()
      for run in self._running:
        self._close_gate(run)
      self._save_record()
    self._draw(force=True, final=True)
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
      if not self._catch_up(run):
        return run
      self._end_pruned_unstarted(run)

  def _catch_up(self, run) -> bool:
    """Reports the evaluations of a claimed trial's earlier attempts that the
    study lacks: its log's evaluation lines (and its results.json's last one).
    A killed sweep's trial evaluates once more while it saves, and the sweep may
    not have read its last lines; a copy (trainer/sweeps/study.py) has none.

    Returns:
      Whether the trial is pruned already: by a verdict its earlier sweep
      process recorded, or now, on its newest evaluation (never its last one).
    """
    metric = self._prune_metric
    if metric is None:
      return False
    trial = run.optuna_trial
    if trial.user_attrs.get("pruned_at"):
      run.pruned_at = trial.user_attrs["pruned_at"]
      return True
    logged = trial_run.logged_evaluations(run.log_path)
    results = run_dir.read_json(os.path.join(run.model_dir, run_dir.RESULTS_FILE))
    if isinstance(results, dict) and isinstance(results.get("eval"), dict):
      last = results["eval"]
      logged.setdefault(last.get("step"), {f"eval/{k}": v for k, v in last.items()
                                           if k not in ("step", "examples")})
    known = self._queue.frozen(trial).intermediate_values
    missing = sorted(s for s, values in logged.items()
                     if isinstance(s, int) and s not in known and metric in values)
    newest = False
    for step in missing:
      newest = self._queue.report(trial, step, logged[step][metric])
    if not (missing and newest and not self._last(run, missing[-1]) and
            self._queue.should_prune(trial)):
      return False
    run.pruned_at = {"step": missing[-1], **logged[missing[-1]]}
    self._queue.set_attrs(trial, pruned_at=run.pruned_at)
    return True

  def _end_pruned_unstarted(self, run):
    """Records a claimed trial that the pruner has stopped already as pruned."""
    run.pruning = True
    results = run_dir.read_json(os.path.join(run.model_dir, run_dir.RESULTS_FILE))
    if isinstance(results, dict):
      run.metrics.update(results_metrics(results))
      run_dir.write_json(os.path.join(run.model_dir, run_dir.RESULTS_FILE),
                         dict(results, status="pruned"))
    run.metrics.update(run.pruned_at)
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
        continue
      # A trial of another process, or finished: what the study and files say.
      run = TrialRun(trial=Trial(name=record.name, values=record.values), command=[],
                     model_dir=os.path.join(self.root, record.name), log_path="",
                     status=record.status, attempts=record.attempts,
                     error=record.error, elapsed=record.elapsed)
      results = run_dir.read_json(os.path.join(run.model_dir, run_dir.RESULTS_FILE))
      if isinstance(results, dict):
        run.metrics = results_metrics(results)
      if record.status == "pruned" and record.pruned_at:
        run.metrics.update(record.pruned_at)  # What the pruner judged, as Optuna.
      log = os.path.join(self.root, LOG_DIR, record.name + ".log")
      run.command = trial_run.logged_command(log)
      runs.append(run)
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
    run.gate = self._open_gate() if self._prune_metric else None
    command = run.command
    if run.gate is not None:  # The same trainer run, its evaluations gated.
      command = [command[0], "-m", "trainer.sweeps.gate", run.gate.prefix,
                 *command[3:]]
    with log:
      run.process = self._spawn_warm(run) or subprocess.Popen(
          command, stdout=log, stderr=subprocess.STDOUT, env=trial_run.trial_env(),
          stdin=subprocess.DEVNULL, preexec_fn=_DIE_WITH_PARENT)
    if self._stopping:  # Asked to stop while it was being started.
      run.process.send_signal(signal.SIGTERM)
    self._save_record()
    return True

  def _spawn_warm(self, run):
    """Forks the trial from the fork server (started on first use); None to start
    it cold: no fork server, or it failed (then every later trial starts cold)."""
    if not self._fork_server:
      return None
    if self._server is None:
      self._server = forkserver.ForkServer.start(env=trial_run.trial_env(),
                                                 preexec_fn=_DIE_WITH_PARENT)
      if self._server is None:
        self._fork_server = False
        return None
    try:
      return self._server.spawn(run.command[3:], log_path=run.log_path,
                                gate=run.gate.prefix if run.gate else None)
    except OSError as e:
      # Its running trials go on (and report their exits); new ones start cold.
      self._say(f"{run.name}: {e}; this and later trials start cold")
      self._server.stop_starting()
      self._fork_server = False
      return None

  def _open_gate(self):
    """A new gate for a trial (trainer/sweeps/gate.py); None where FIFOs cannot
    be made (then the pruner's SIGTERM stops the trial a loop call later)."""
    try:
      return gate.Gate()
    except OSError as e:
      self._say(f"note: no pruning gate ({e}); a pruned trial stops a loop call "
                "after its evaluation")
      return None

  def _close_gate(self, run):
    if run.gate is not None:
      run.gate.close()
      run.gate = None

  def _wait_for_trials(self):
    """Waits a poll interval, or less when a trial asks at an evaluation."""
    gates = [run.gate for run in self._running if run.gate is not None]
    if gates:
      select.select(gates, [], [], _POLL_SECONDS)
    else:
      time.sleep(_POLL_SECONDS)

  def _answer(self, run):
    """Answers the trial's gate: the verdict on each evaluation it waits at."""
    if run.gate is None:
      return
    for step in run.gate.asked():
      if step not in run.verdicts:  # Its line was written after the last read.
        self._read_log(run)
      run.gate.answer(step, prune=run.verdicts.get(step, False))

  def _read_log(self, run, *, can_prune=True):
    """Updates the trial's live metrics from new progress lines in its log, and
    judges its evaluations (see `_judge`)."""
    with open(run.log_path) as f:
      f.seek(run.log_offset)
      text = f.read()
    complete = text[:text.rfind("\n") + 1]  # Leave a half-written line for later.
    run.log_offset += len(complete.encode())
    for line in complete.splitlines():
      values = progress.parse_line(line)
      run.metrics.update(values)
      if self._prune_metric in values:
        self._judge(run, values, can_prune=can_prune)

  def _last(self, run, step) -> bool:
    """Whether an evaluation at `step` is the trial's last (at --train_steps)."""
    return bool(run.train_steps) and step >= run.train_steps

  def _judge(self, run, values, *, can_prune: bool):
    """Reports an evaluation to the study and records the pruner's verdict on it
    (which the trial's gate waits for). The verdict is about this evaluation, the
    trial's newest in the study; it never prunes the last one (the trial has
    nothing left to save, and a SIGTERM would only interrupt its export)."""
    step, prune = values["step"], False
    if not run.pruning and self._queue.report(run.optuna_trial, step,
                                              values[self._prune_metric]):
      # Asked at the last evaluation too: ASHA and Hyperband record rungs there.
      prune = (self._queue.should_prune(run.optuna_trial) and can_prune and
               not self._last(run, step))
    run.verdicts[step] = prune
    if not prune:
      return
    run.pruning = True
    run.pruned_at = {"step": step, **{k: v for k, v in values.items()
                                      if k.startswith("eval/")}}
    self._queue.set_attrs(run.optuna_trial, pruned_at=run.pruned_at)
    # The gate stops the trial at this evaluation; a trial without one (or past
    # it) stops at the end of its loop call: checkpoint, exit 4.
    run.process.send_signal(signal.SIGTERM)

  def _finish(self, run):
    run.returncode = run.process.returncode
    # Lines written after the last read (an interrupted trial's last evaluation
    # is still judged: pruned, it is not resumed).
    self._read_log(run, can_prune=run.returncode == int(ExitCode.INTERRUPTED))
    self._close_gate(run)
    run.elapsed = run.elapsed_before + time.monotonic() - run.started
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
    if run.pruning and run.status in ("interrupted", "completed"):
      run.status = "pruned"
      run.metrics.update(run.pruned_at)  # The evaluation the pruner judged.
      if isinstance(results, dict):  # trainer.inspect of the trial says so too.
        run_dir.write_json(os.path.join(run.model_dir, run_dir.RESULTS_FILE),
                           dict(results, status="pruned"))
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

  def _save_record(self):
    run_dir.write_json(os.path.join(self.root, SWEEP_FILE),
                       dict(self._ranking, trials=[r.record() for r in self.runs()]))

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
    text = self._table(self.runs())
    if self._live and self._drawn_lines:
      self._out.write(f"\x1b[{self._drawn_lines}F\x1b[J")  # Up, then clear below.
    self._out.write(text + "\n")
    self._out.flush()
    self._drawn_lines = text.count("\n") + 1 if self._live and not final else 0
    self._last_draw = now
