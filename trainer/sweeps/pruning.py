"""The sweep's side of pruning: a trial's evaluations reported to the study's
pruner as they appear in its log, the pruner's verdicts recorded, and the trial's
gate (trainer/sweeps/gate.py) answered with them.

A verdict is about the evaluation just reported, the trial's newest in the
study. The last evaluation (at the trial's --train_steps) is reported too (ASHA
and Hyperband record rungs there) but never pruned: the trial has nothing left
to save, and a SIGTERM would only interrupt its export. A pruned trial stops at
the judged evaluation (its gate waits for the verdict there), or, without a
gate, at the end of its loop call; it is recorded with the evaluation the pruner
judged (`pruned_at`), the value Optuna gives a pruned trial.

A trial claimed again (interrupted, or taken over from a killed sweep process)
first catches up: the evaluations its earlier attempts logged that the study
lacks are reported, and the pruner may stop it on the newest of them before it
starts again.

Example (trainer/sweeps/runner.py):

  pruning = Pruning(queue=queue, metric="eval/accuracy", say=print)
  pruned = pruning.catch_up(run)  # Once claimed; True: do not start it.
  pruning.open_gate(run)          # Before its process starts.
  pruning.wait(running, 0.25)     # Until one of them asks, or 0.25 s.
  pruning.read_log(run)           # Then: judge its new evaluations,
  pruning.answer(run)             # and answer its gate.
  pruning.close_gate(run)         # Once it has ended.
"""

import os
import select
import signal
import time
from typing import Optional

from trainer.outputs import run_dir
from trainer.sweeps import gate, trial_run


class Pruning:
  """Reports a sweep's trials' evaluations to the study and acts on its verdicts."""

  def __init__(self, *, queue, metric: Optional[str], say):
    """Creates the bookkeeping.

    Args:
      queue: the sweep's StudyQueue.
      metric: "eval/NAME" reported to the study's pruner; None: the sweep does
        not prune (then `read_log` only updates the trials' live metrics, and no
        trial is gated).
      say: `say(message)`: a line on the sweep's output.
    """
    self._queue = queue
    self._metric = metric
    self._say = say

  def open_gate(self, run):
    """Gives a run about to start a gate (run.gate), when the sweep prunes; none
    where FIFOs cannot be made (then the pruner's SIGTERM stops the trial a loop
    call later)."""
    run.gate = None
    if self._metric is None:
      return
    try:
      run.gate = gate.Gate()
    except OSError as e:
      self._say(f"note: no pruning gate ({e}); a pruned trial stops a loop call "
                "after its evaluation")

  @staticmethod
  def close_gate(run):
    if run.gate is not None:
      run.gate.close()
      run.gate = None

  @staticmethod
  def wait(runs: list, seconds: float):
    """Waits `seconds`, or less when one of the runs asks at an evaluation."""
    gates = [run.gate for run in runs if run.gate is not None]
    if gates:
      select.select(gates, [], [], seconds)
    else:
      time.sleep(seconds)

  def answer(self, run):
    """Answers the trial's gate: the verdict on each evaluation it waits at."""
    if run.gate is None:
      return
    for step in run.gate.asked():
      if step not in run.verdicts:  # Its line was written after the last read.
        self.read_log(run)
      run.gate.answer(step, prune=run.verdicts.get(step, False))

  def read_log(self, run, *, can_prune: bool = True):
    """Updates the trial's live metrics from new progress lines in its log, and
    judges its evaluations (see the module docstring).

    Args:
      run: a TrialRun that has started.
      can_prune: whether a verdict may prune it: False for a trial that has
        ended other than interrupted (only an interrupted one would be resumed,
        which a pruned one is not).
    """
    for values in run.read_progress():
      if self._metric in values:
        self._judge(run, values, can_prune=can_prune)

  def _judge(self, run, values: dict, *, can_prune: bool):
    """Reports an evaluation to the study and records the pruner's verdict on it
    (which the trial's gate waits for)."""
    step, prune = values["step"], False
    if not run.pruning and self._queue.report(run.optuna_trial, step,
                                              values[self._metric]):
      # Asked at the last evaluation too: ASHA and Hyperband record rungs there.
      prune = (self._queue.should_prune(run.optuna_trial) and can_prune and
               not _last(run, step))
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

  def catch_up(self, run) -> bool:
    """Reports the evaluations of a claimed trial's earlier attempts that the
    study lacks: its log's evaluation lines (and its results.json's last one).
    A killed sweep's trial evaluates once more while it saves, and the sweep may
    not have read its last lines; a copy (trainer/sweeps/study.py) has none.

    Returns:
      Whether the trial is pruned already: by a verdict its earlier sweep
      process recorded, or now, on its newest evaluation (never its last one).
    """
    if self._metric is None:
      return False
    trial = run.optuna_trial
    if trial.user_attrs.get("pruned_at"):
      run.pruned_at = trial.user_attrs["pruned_at"]
      return True
    logged = _earlier_evaluations(run)
    known = self._queue.frozen(trial).intermediate_values
    missing = sorted(s for s, values in logged.items() if isinstance(s, int) and
                     s not in known and self._metric in values)
    newest = False
    for step in missing:
      newest = self._queue.report(trial, step, logged[step][self._metric])
    if not (missing and newest and not _last(run, missing[-1]) and
            self._queue.should_prune(trial)):
      return False
    run.pruned_at = {"step": missing[-1], **logged[missing[-1]]}
    self._queue.set_attrs(trial, pruned_at=run.pruned_at)
    return True


def _last(run, step: int) -> bool:
  """Whether an evaluation at `step` is the trial's last (at --train_steps)."""
  return bool(run.train_steps) and step >= run.train_steps


def _earlier_evaluations(run) -> dict:
  """{step: {"eval/NAME": value}} of a trial's earlier attempts: its log's
  evaluation lines, and its results.json's last evaluation."""
  logged = trial_run.logged_evaluations(run.log_path)
  results = run_dir.read_json(os.path.join(run.model_dir, run_dir.RESULTS_FILE))
  if isinstance(results, dict) and isinstance(results.get("eval"), dict):
    last = results["eval"]
    logged.setdefault(last.get("step"), {f"eval/{k}": v for k, v in last.items()
                                         if k not in ("step", "examples")})
  return logged


def record_pruned(run, results):
  """Records a pruned run as such: its status, the evaluation the pruner judged
  as its metrics (as Optuna has it), and results.json's status, so that
  trainer.inspect of the trial says so too.

  Args:
    run: the TrialRun, with its `pruned_at`.
    results: the trial's results.json (None if it has none).
  """
  run.status = "pruned"
  run.metrics.update(run.pruned_at)
  if isinstance(results, dict):
    run_dir.write_json(os.path.join(run.model_dir, run_dir.RESULTS_FILE),
                       dict(results, status="pruned"))
