"""MODEL_DIR/results.json: what a run did, written by the chief at every exit."""

import math
import os
import platform
import statistics
import time
import uuid
from typing import Optional

import tensorflow as tf

from trainer.outputs import run_dir
from trainer.outputs.process_stats import peak_rss_mib, seconds_since_process_start


# Measured by an invocation; kept from results.json until this one measures them,
# so a resume or a no-op rerun does not erase them.
_MEASURED = ("train", "eval", "time_to_first_step_s", "steps_per_second",
             "examples_per_second", "examples_per_second_median", "timed_loop_calls",
             "export_dir", "eval_seconds", "eval_examples_per_second")


def improves(value, best, goal: str, min_delta: float = 0.0) -> bool:
  """Whether an evaluation's --best_metric `value` beats `best`, the best so far
  (None where there is none yet), under `goal` ("max" or "min"), by more than
  `min_delta` (--early_stopping_min_delta; Keras's EarlyStopping rule: a tie is
  no improvement). The one rule of the best checkpoint, early stopping and
  ReduceLROnPlateau. A value that is not a finite number (NaN) is never the
  best, and any finite one beats a best that is not (an older run's NaN).

  >>> improves(0.5, None, "min"), improves(0.5, 0.4, "min"), improves(0.5, 0.4, "max")
  (True, False, True)
  >>> improves(0.45, 0.4, "max", min_delta=0.1), improves(0.4, 0.4, "max")
  (False, False)
  """
  if not _finite(value):
    return False
  if not _finite(best):
    return True
  return value - min_delta > best if goal == "max" else value + min_delta < best


def _finite(value) -> bool:
  return isinstance(value, (int, float)) and math.isfinite(value)


class Results:
  """Accumulates a run's numbers; `finish` writes them (on the chief).

  The best evaluation lives in the run record (`checkpoints.record`), which
  travels with the checkpoints, so it always describes the steps the run kept.
  """

  def __init__(self, *, model_dir: str, task: str, train_steps: int, trainer,
               checkpoints, best_metric: str, best_goal: str,
               min_delta: float = 0.0):
    """Starts the record of a run.

    Args:
      model_dir: the run directory.
      task: the --task that names the run's task.
      train_steps: --train_steps.
      trainer: what trains.
      checkpoints: its Checkpoints (the run record).
      best_metric: "eval/NAME" that picks the best evaluation.
      best_goal: "max" or "min".
      min_delta: what an evaluation must beat the best by (improves).
    """
    self._trainer = trainer
    self._checkpoints = checkpoints
    self._best_name = best_metric.split("/", 1)[1]
    self._best_goal = best_goal
    self._min_delta = min_delta
    self._path = os.path.join(model_dir, run_dir.RESULTS_FILE)
    previous = run_dir.read_json(self._path)
    self.previous = previous if isinstance(previous, dict) else {}
    self.calls = 0
    self._intervals = []  # (steps, wall seconds) of each loop call after the first.
    self._eval_seconds = 0.0
    self._last_call_end = None
    self.eval_step = None
    cluster = trainer.cluster
    self.data = {
        "num_replicas": trainer.num_replicas,
        "num_workers": cluster.num_workers,
        "per_replica_batch_size": trainer.per_replica_batch_size,
        "global_batch_size": trainer.global_batch_size,
        "train_steps": train_steps,
        "model_dir": model_dir,
        "devices": list(cluster.devices),
        "tf_version": tf.__version__,
        "python_version": platform.python_version(),
        "task": task,
        # Which invocation wrote the file: a reader tells a new end from an old
        # one by it, not by the file's time (hosts' clocks differ).
        "invocation": uuid.uuid4().hex,
        "best_metric": best_metric,
        "best_goal": best_goal,
        **{k: self.previous[k] for k in _MEASURED if k in self.previous},
    }

  def record_train_call(self, *, step: int, steps: int, metrics: dict):
    """Records one loop call, right after it finished.

    Speed is wall-clock time from the end of one call to the end of the next, so it
    includes everything the loop does between calls (ledger check, summaries,
    progress, checkpoints, evals). The first call, which traces, is left out.
    """
    now = time.perf_counter()
    self.calls += 1
    if self.calls == 1:
      self.data["time_to_first_step_s"] = round(seconds_since_process_start(), 3)
    else:
      self._intervals.append((steps, now - self._last_call_end))
    self._last_call_end = now
    self.data["train"] = dict(metrics, step=step)

  def record_eval(self, step: int, metrics: dict, *,
                  seconds: Optional[float] = None) -> bool:
    """Records an evaluation (that took `seconds`, if given: "eval_seconds" sums
    this invocation's, "eval_examples_per_second" is the latest's rate); returns
    whether --best_metric improved (it is then the run's best_eval)."""
    self.eval_step = step
    self.data["eval"] = dict(metrics, step=step)
    if seconds is not None:
      self._eval_seconds += seconds
      self.data["eval_seconds"] = round(self._eval_seconds, 4)
      self.data["eval_examples_per_second"] = metrics["examples"] / max(seconds,
                                                                        1e-9)
    record = self._checkpoints.record
    best = record.best_eval
    if improves(metrics[self._best_name],
                best.get(self._best_name) if isinstance(best, dict) else None,
                self._best_goal, self._min_delta):
      record.best_eval = dict(metrics, step=step)
      return True
    return False

  def finish(self, status, *, step: int = None) -> dict:
    """Completes the record with `status` and writes results.json (chief only).

    Args:
      status: how the run ended (a RunStatus).
      step: the step it reached; default: the global step variable's (a hung
        run passes its last completed step: TensorFlow may be stuck).
    """
    trainer, record = self._trainer, self._checkpoints.record
    self.data["status"] = str(status)
    self.data["global_step"] = trainer.step if step is None else step
    self.data["best_eval"] = record.best_eval
    ledger = trainer.train_ledger
    self.data["replica_batches"] = {
        f"replica_{i}": int(n) for i, n in enumerate(ledger.total_batches)}
    self.data["replica_examples"] = {
        f"replica_{i}": int(n) for i, n in enumerate(ledger.total_examples)}
    # The ledger of the steps trained on other replica counts (elastic resumes).
    self.data["ledger_history"] = record.ledger_history
    if self._intervals:
      steps, seconds = (sum(column) for column in zip(*self._intervals))
      # An update trains on --grad_accum_steps global batches.
      per_step = trainer.global_batch_size * trainer.accum_steps
      self.data["steps_per_second"] = steps / seconds
      self.data["examples_per_second"] = steps / seconds * per_step
      self.data["examples_per_second_median"] = statistics.median(
          n / t * per_step for n, t in self._intervals)
      self.data["timed_loop_calls"] = len(self._intervals)
    self.data["peak_rss_mib"] = round(peak_rss_mib(), 1)
    if trainer.cluster.is_chief:
      run_dir.write_json(self._path, self.data)
    return self.data
