"""Small actions the controller runs after every loop call, in order.

Each is a callable `action(call) -> outcome` on a `controller.LoopCall`: None to go
on, `controller.ROLLED_BACK` after restoring an earlier step, or a status string
that ends training ("interrupted").

Evaluation runs before the checkpoint of the same step, so the checkpoint's run
record holds that evaluation (a resume neither repeats nor loses it) and its
events are flushed with the checkpoint.
"""

import os
import time

from trainer.errors import DivergedError, ModelDirError
from trainer.outputs import run_dir
from trainer.outputs.progress import Progress
from trainer.outputs.results import Results
from trainer.outputs.summaries import Summaries
from trainer.training import divergence, evaluation, profile
from trainer.training.controller import ROLLED_BACK, LoopCall
from trainer.training.state import RunState

MAX_ROLLBACKS = 3
ROLLBACKS_FILE = divergence.ROLLBACKS_FILE


def check_ledger(state: RunState):
  """Stops the run (ReplicaBatchError) unless every replica got one batch per step."""

  def action(call: LoopCall):
    state.train_ledger.check(
        expected_batches=call.num_steps * state.config.grad_accum_steps,
        per_replica_batch_size=state.per_replica_batch_size,
        counts=(call.outputs["ledger_batches"], call.outputs["ledger_examples"]))

  return action


class NanPolicy:
  """--on_nan: stop (DivergedError), or roll back and halve the learning rate.

  Each rollback halves the rate the previous one left (0.5, 0.25, 0.125 of the
  flag's), at most MAX_ROLLBACKS times in the run. Both numbers live in
  MODEL_DIR/rollbacks.json, written at each rollback, so a restart keeps them
  (the checkpoint restored by a rollback predates it).
  """

  def __init__(self, *, state: RunState, results: Results, progress: Progress,
               on_replayed_step=None):
    """Reads the rollbacks so far.

    Args:
      state: the run's state.
      results: the run's results.json.
      progress: where the rollback and divergence lines go.
      on_replayed_step: called after each step a divergence replay takes (the
        watchdog's `progressed`: a long replay is not a hang).
    """
    self._state = state
    self._results = results
    self._progress = progress
    self._on_replayed_step = on_replayed_step
    self._path = os.path.join(state.config.model_dir, ROLLBACKS_FILE)
    self.rollbacks, self.multiplier = divergence.saved_rollbacks(
        state.config.model_dir)

  def apply_learning_rate(self):
    """Sets the optimizer's rate to the flag's times the rollbacks' multiplier."""
    state = self._state
    if state.base_learning_rate is not None:
      state.set_peak_rate(state.base_learning_rate * self.multiplier)

  def __call__(self, call: LoopCall):
    if call.all_finite:
      return None
    state = self._state
    if state.config.on_nan == "rollback" and self.rollbacks < MAX_ROLLBACKS:
      restored = state.restore_checkpoint()
      if restored is None:
        raise ModelDirError("--on_nan=rollback: no checkpoint to roll back to")
      self.rollbacks += 1
      self.multiplier *= 0.5
      if state.is_chief:
        run_dir.write_json(self._path, {"rollbacks": self.rollbacks,
                                        "lr_multiplier": self.multiplier,
                                        "step": restored})
      if state.base_learning_rate is None:
        rate = "the task's learning-rate schedule is left as it is"
      else:
        self.apply_learning_rate()
        rate = (f"learning rate halved to "
                f"{state.base_learning_rate * self.multiplier:g}")
      self._progress.say(f"non-finite loss at step {call.step}: rolled back to step "
                         f"{restored} (rollback {self.rollbacks} of {MAX_ROLLBACKS}), "
                         f"{rate}")
      return ROLLED_BACK
    report = divergence.find_divergence(state, until=call.step,
                                        on_step=self._on_replayed_step)
    self._results.data["divergence"] = divergence.DIVERGENCE_FILE
    self._results.finish("diverged", step=call.step)
    where = (f"step {report['step']}" if not report["finite"] else
             f"a step of {report['checkpoint_step'] + 1} to {call.step}")
    layer = report["first_nonfinite_gradient"]
    raise DivergedError(
        f"non-finite loss or gradients at {where} (loss {report['loss']}, gradient "
        f"norm {report['gradient_norm']}"
        + (f", first non-finite gradient {layer}" if layer else "")
        + f"); the last good checkpoint is kept. {divergence.DIVERGENCE_FILE} "
        f"says more; replay it with: {report['replay']}. Lower --learning_rate or "
        "use --on_nan=rollback")


def record(state: RunState, results: Results, summaries: Summaries,
           progress: Progress):
  """Records the call in results.json's data, TensorBoard and the progress line."""

  def action(call: LoopCall):
    results.record_train_call(step=call.step, steps=call.num_steps,
                              metrics=call.metrics)
    examples_per_second = (call.num_steps * state.global_batch_size *
                           state.config.grad_accum_steps / call.seconds)
    ledger = state.train_ledger.total_batches
    clipping = ({"clipped_fraction": call.outputs["clipped"] / call.num_steps}
                if state.config.clip_norm else {})
    summaries.scalars("train", call.step, {
        **call.metrics, "gradient_norm": call.outputs["gradient_norm"], **clipping,
        "learning_rate": call.outputs["learning_rate"],
        "examples_per_second": examples_per_second,
        "steps_per_second": call.num_steps / call.seconds,
        **{f"replica_batches/replica_{i}": n for i, n in enumerate(ledger)}})
    progress.report(call.step, call.metrics, examples_per_second=examples_per_second)

  return action


def checkpoint(state: RunState, summaries: Summaries):
  """Saves every --checkpoint_every steps and at --train_steps."""
  config = state.config

  def action(call: LoopCall):
    if call.step % config.checkpoint_every == 0 or call.step >= config.train_steps:
      state.save_checkpoint()
      summaries.flush()  # Events on disk reach at least the checkpoint's step.

  return action


class Evaluator:
  """Evaluates the model and records it (results, TensorBoard, a line); keeps the
  best checkpoint (checkpoints/best/) and stops early when --best_metric stalls.
  """

  def __init__(self, *, state: RunState, results: Results, summaries: Summaries,
               progress: Progress, best_metric: tuple):
    """Creates the evaluator.

    Args:
      state: the run's state.
      results: its results record.
      summaries: its TensorBoard writer.
      progress: its progress lines.
      best_metric: ("eval/NAME", "max" or "min").
    """
    self._state = state
    self._results = results
    self._summaries = summaries
    self._progress = progress
    self._name = best_metric[0].split("/", 1)[1]
    self._goal = best_metric[1]

  def evaluate(self) -> dict:
    state = self._state
    step = state.step
    metrics = evaluation.evaluate_once(state)
    improved = self._results.record_eval(step, metrics)
    self._summaries.scalars("eval", step, evaluation.scalars(metrics))
    self._progress.report_eval(step, metrics)
    if improved and state.config.mode == "train_and_eval":
      state.save_best_checkpoint()
    self._count_patience(metrics[self._name])
    return metrics

  def _count_patience(self, value: float):
    """Counts evaluations since --best_metric last improved by --min_delta."""
    record = self._state.record.data
    reference = record.get("patience_reference")
    delta = self._state.config.early_stopping_min_delta
    gain = (None if reference is None else
            value - reference if self._goal == "max" else reference - value)
    if gain is None or gain >= delta:
      record["patience_reference"], record["evals_without_improvement"] = value, 0
    else:
      record["evals_without_improvement"] = record.get(
          "evals_without_improvement", 0) + 1

  def should_stop_early(self) -> bool:
    patience = self._state.config.early_stopping_patience
    return bool(patience) and self._state.record.data.get(
        "evals_without_improvement", 0) >= patience

  def __call__(self, call: LoopCall):
    """As an action: every --eval_every steps and at --train_steps, with
    --mode=train_and_eval (so the final checkpoint's record holds the final
    evaluation)."""
    state = self._state
    config = state.config
    if config.mode == "train_and_eval" and (
        call.step >= config.train_steps or
        (config.eval_every and call.step % config.eval_every == 0)):
      self.evaluate()
      if self.should_stop_early():
        state.save_checkpoint()
        self._progress.say(
            f"early stop at step {call.step}: {config.early_stopping_patience} "
            f"evaluations without eval/{self._name} improving by "
            f">= {config.early_stopping_min_delta:g}")
        return "early_stopped"
    return None


class Profiler:
  """--profile_steps=A,B: a TensorFlow profiler trace of the loop calls running
  steps A to B (loop calls end at A - 1 and B), under MODEL_DIR/train. When the
  window is complete, where a step's time went (training.profile) goes to
  results.json ("profile") and to one progress line."""

  def __init__(self, state: RunState, results: Results, progress: Progress):
    self._state, self._results, self._progress = state, results, progress
    self._window = tuple(state.config.profile_steps)
    self._active = False
    self._calls = 0

  def _log_dir(self):
    return os.path.join(self._state.config.model_dir, "train")

  def _start(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.profiler.experimental.start(self._log_dir())
    self._active = True

  def close(self):
    """Stops a trace still recording (the run ended inside the window)."""
    if self._active:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      tf.profiler.experimental.stop()
      self._active = False

  def _report(self):
    try:
      trace = profile.latest_trace(self._log_dir())
      breakdown = profile.step_breakdown(
          trace, steps=self._window[1] - self._window[0] + 1)
    except Exception as e:  # pylint: disable=broad-except
      # A trace that cannot be read (corrupt, too large, none) never fails a run.
      self._progress.say(f"note: no step breakdown from the profile "
                         f"({type(e).__name__}: {e})")
      return
    if breakdown["loop_calls"] != self._calls:
      self._progress.say(
          f"note: no step breakdown from the profile: it holds "
          f"{breakdown['loop_calls']} loop calls, not the {self._calls} of steps "
          f"{self._window[0]}-{self._window[1]} (a rollback inside the window)")
      return
    self._results.data["profile"] = dict(breakdown, trace=trace)
    self._progress.say(profile.describe(breakdown))

  def before_training(self):
    if self._window and self._state.is_chief and self._state.step == self._window[0] - 1:
      self._start()

  def __call__(self, call: LoopCall):
    if not self._window or not self._state.is_chief:
      return
    if self._active:
      self._calls += 1  # Loop calls that ran inside the trace.
    if self._active and call.step >= self._window[1]:
      self.close()
      self._report()
    elif not self._active and call.step == self._window[0] - 1:
      self._start()


def time_limit(state: RunState, progress: Progress, started: float):
  """--max_time: ends training ("time_limit") with a checkpoint after the first
  loop call past the budget (every worker agrees on the call)."""
  budget = state.config.max_time_seconds

  def action(call: LoopCall):
    if budget is None:
      return None
    if state.stop_vote(time.monotonic() - started > budget):
      state.save_checkpoint()
      progress.say(f"--max_time={state.config.max_time} reached at step "
                   f"{call.step}: saved a checkpoint; rerun (with a new budget) to "
                   "resume")
      return "time_limit"
    return None

  return action


def stop_vote(state: RunState, stop_request, progress: Progress):
  """Ends training ("interrupted") after a checkpoint once any worker got a signal."""

  def action(call: LoopCall):
    if state.stop_vote(bool(stop_request)):
      state.save_checkpoint()
      progress.say(f"{stop_request.signal_name or 'a stop request'}: saved a "
                   f"checkpoint at step {call.step}; rerun the same command to resume")
      return "interrupted"
    return None

  return action
