"""Evaluation during training: every --eval_every steps and at --train_steps (with
--mode=train_and_eval). Records it (results, TensorBoard, a line), keeps the best
checkpoint (checkpoints/best/) and stops early when --best_metric stalls.

It runs before the checkpoint of the same step, so the checkpoint's run record
holds that evaluation (a resume neither repeats nor loses it) and its events are
flushed with the checkpoint.
"""

import time
from typing import Optional

import tensorflow as tf

from trainer.actions.base import Action, LoopCall, Stop, due, next_multiple
from trainer.errors import RunStatus
from trainer.outputs import profile
from trainer.outputs.results import improves


class Evaluate(Action):
  """Evaluates the model and records it; keeps the best and counts patience."""

  def __init__(self, *, trainer, eval_data, checkpoints, results, summaries, console,
               best_metric: tuple, every: int, train_steps: int, enabled: bool,
               patience: int, min_delta: float):
    """Creates the evaluator.

    Args:
      trainer: what trains (and evaluates).
      eval_data: the task's eval data (TaskData).
      checkpoints: the run's Checkpoints (the best one, the record's patience).
      results: the run's results.json.
      summaries: its TensorBoard writer.
      console: its output.
      best_metric: ("eval/NAME", "max" or "min").
      every: --eval_every (0: only at --train_steps).
      train_steps: --train_steps.
      enabled: whether training evaluates (--mode=train_and_eval).
      patience: --early_stopping_patience (0: off).
      min_delta: --early_stopping_min_delta.
    """
    self._trainer = trainer
    self._data = eval_data
    self._checkpoints = checkpoints
    self._results = results
    self._summaries = summaries
    self._console = console
    self._name = best_metric[0].split("/", 1)[1]
    self._goal = best_metric[1]
    self._every = every
    self._train_steps = train_steps
    self._enabled = enabled
    self._patience = patience
    self._min_delta = min_delta
    self._latest = (None, None)  # (step, metrics) of the latest evaluation.

  def next_stop(self, step):
    if not (self._enabled and self._every):
      return None
    return next_multiple(step, self._every)

  def metrics_at(self, step: int) -> Optional[dict]:
    """The metrics of the evaluation at `step`, or None if none ran there."""
    return self._latest[1] if self._latest[0] == step else None

  def evaluate(self) -> dict:
    """Evaluates now; records it, keeps the best and counts patience."""
    trainer = self._trainer
    step = trainer.step
    # Named in a profile's trace: its host time is not the loop's.
    start = time.perf_counter()
    with tf.profiler.experimental.Trace(profile.HOST_WORK[0]):
      metrics = trainer.evaluate(self._data)
    seconds = time.perf_counter() - start
    self._latest = (step, metrics)
    improved = self._results.record_eval(step, metrics, seconds=seconds)
    self._summaries.scalars("eval", step, {k: v for k, v in metrics.items()
                                           if k != "examples"})
    self._console.report_eval(step, metrics)
    if improved and self._enabled:
      self._checkpoints.save_best()
    self._count_patience(metrics[self._name])
    return metrics

  def _count_patience(self, value: float):
    """Counts evaluations since --best_metric last improved by more than
    --early_stopping_min_delta (results.improves, the best checkpoint's rule)."""
    record = self._checkpoints.record
    if improves(value, record.patience_reference, self._goal, self._min_delta):
      record.patience_reference, record.evals_without_improvement = value, 0
    else:
      record.evals_without_improvement += 1

  def __call__(self, call: LoopCall):
    if not self._enabled or not (call.step >= self._train_steps or
                                 due(call.step, self._every)):
      return None
    self.evaluate()
    if self._patience and (self._checkpoints.record.evals_without_improvement
                           >= self._patience):
      return Stop(RunStatus.EARLY_STOPPED, (
          f"early stop at step {call.step}: {self._patience} evaluations without "
          f"eval/{self._name} improving by more than {self._min_delta:g}"))
    return None
