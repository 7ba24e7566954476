"""`--mode=continuous_eval`: an evaluator beside training.

Model Garden's continuous_eval, Orbit's `evaluate_continuously` and tf.keras's
SidecarEvaluator in one mode: it evaluates every new checkpoint of --model_dir
once, in step order, as it appears, with the run's own task and flags (open_run:
read-only, no lock), so training never pauses to evaluate and the evaluator may
run on other hardware. A process whose TF_CONFIG task type is `evaluator` runs it
without being told (`scripts/launch_workers.py --evaluator` starts one).

It writes what in-process evaluation writes, and nothing training writes: the
`eval/` summaries at each checkpoint's step; MODEL_DIR/eval_results.json after
each evaluation (the latest, the best, and every step evaluated with its
metrics: a restarted evaluator goes on after the last of them); the best
checkpoint under checkpoints/best/; and, as it ends, export_best/. A checkpoint
that --keep_checkpoints deletes before or while it is read is skipped, with one
line. It ends (exit 0) once the run's results.json says it finished and its last
checkpoint is evaluated, or after --eval_timeout without a new checkpoint.
"""

import os
import time

from trainer import config as config_lib
from trainer.config import Config
from trainer.errors import ExportError, ModelDirError, RunStatus
from trainer.outputs import export, progress, results, run_dir
from trainer.outputs.summaries import Summaries
from trainer.tasks import Task
from trainer.training import checkpoint_files, evaluation
from trainer.training.open_run import open_run

_POLL_SECONDS = 1.0  # Between two looks at the checkpoint directory.


def evaluate_continuously(config: Config, task: Task = None, *, stop_request=None,
                          sleep=time.sleep) -> dict:
  """Evaluates the checkpoints of --model_dir as they appear, until the run ends.

  Args:
    config: this invocation's config (model_dir, device flags, eval_timeout).
    task: the run's task instance (a Python caller's); default: built from the
      run's flags.
    stop_request: true once a signal asks to stop (interrupts.StopRequest): the
      evaluator stops after the evaluation it is in (status interrupted).
    sleep: how to wait between looks (tests pass their own).

  Returns:
    eval_results.json's contents.

  Raises:
    ModelDirError: no trainer run appeared in --model_dir within --eval_timeout.
  """
  timeout = config.eval_timeout_seconds
  flags = os.path.join(config.model_dir, run_dir.FLAGS_FILE)
  waited = time.monotonic()
  while not os.path.isfile(flags):  # The run may not have started yet.
    if stop_request:
      return {"status": str(RunStatus.INTERRUPTED)}
    if time.monotonic() - waited > timeout:
      raise ModelDirError(f"--model_dir={config.model_dir}: no trainer run appeared "
                          f"within --eval_timeout={config.eval_timeout}")
    sleep(_POLL_SECONDS)
  built = open_run(config.model_dir, invocation=config, task=task)
  evaluator = _Evaluator(built, config.model_dir)
  try:
    last_new = time.monotonic()
    while True:
      if evaluator.evaluate_new(stop_request):
        last_new = time.monotonic()
      if stop_request:
        built.console.say(f"continuous_eval: {stop_request.signal_name}: stopping "
                          f"after the evaluation of step {evaluator.last_step}; "
                          "rerun to go on from there")
        evaluator.state["status"] = str(RunStatus.INTERRUPTED)
        return evaluator.state
      if evaluator.run_finished():
        built.console.say(f"continuous_eval: the run finished at step "
                          f"{evaluator.last_step}, evaluated")
        break
      if time.monotonic() - last_new > timeout:
        built.console.say(f"continuous_eval: no new checkpoint for "
                          f"--eval_timeout={config.eval_timeout}; stopping")
        break
      sleep(_POLL_SECONDS)
    evaluator.export_best()
  finally:
    evaluator.close()
  return evaluator.state


class _Evaluator:
  """Evaluates a run's checkpoints one by one, recording each."""

  def __init__(self, built, model_dir: str):
    self._built = built
    self._model_dir = model_dir
    self._path = os.path.join(model_dir, evaluation.EVAL_RESULTS_FILE)
    previous = run_dir.read_json(self._path) or {}
    evaluated = previous.get("evaluated")
    self.state = {"status": str(RunStatus.EVALUATED),
                  "evaluated": evaluated if isinstance(evaluated, dict) else {},
                  "best_eval": previous.get("best_eval")}
    self._metric, self._goal = evaluation.best_metric(
        built.config, built.task, built.trainer.reported_metrics)
    self._summaries = Summaries(model_dir, enabled=built.config.summaries)
    # The invocation whose end results.json records now: another one's end
    # is an end since this evaluator started (no clock is compared).
    self._seen_invocation = self._ended().get("invocation")
    self._directory = os.path.join(model_dir, checkpoint_files.CHECKPOINT_SUBDIR)

  @property
  def last_step(self) -> int:
    return max((int(s) for s in self.state["evaluated"]), default=-1)

  def evaluate_new(self, stop_request=None) -> bool:
    """Evaluates every checkpoint newer than the last evaluated, in step order,
    until a stop is requested; returns whether there was one."""
    steps = [s for s in checkpoint_files.checkpoint_steps(self._directory)
             if s > self.last_step]
    for step in steps:
      if stop_request:
        break
      self._evaluate(step)
    return bool(steps)

  def _evaluate(self, step: int):
    built, console = self._built, self._built.console
    if not built.checkpoints.restore_exactly(step):
      console.say(f"continuous_eval: checkpoint of step {step} was deleted before "
                  "it could be read (--keep_checkpoints rotates them); skipped")
      self.state["evaluated"][str(step)] = None
      return
    start = time.perf_counter()
    metrics = built.trainer.evaluate(built.eval_data)
    seconds = time.perf_counter() - start
    name = self._metric.split("/", 1)[1]
    best = self.state["best_eval"]
    if results.improves(metrics.get(name),
                        best.get(name) if isinstance(best, dict) else None,
                        self._goal, built.config.early_stopping_min_delta):
      built.checkpoints.save_best()
      self.state["best_eval"] = dict(metrics, step=step)
    self.state["evaluated"][str(step)] = metrics
    self.state.update(global_step=step, eval=metrics, eval_seconds=round(seconds, 4))
    self._summaries.scalars("eval", step, {k: v for k, v in metrics.items()
                                           if k != "examples"})
    self._summaries.flush()
    run_dir.write_json(self._path, self.state)
    console.say(f"eval of step {step}: {progress.format_metrics(metrics)}  "
                f"({metrics['examples']} examples)")

  def run_finished(self) -> bool:
    """Whether the run ended and every checkpoint on disk is evaluated: its
    results.json says it finished (a rerun changes nothing: at --train_steps of
    its flags.txt, or stopped), or its invocation ended (any status) since this
    evaluator started (a --max_time stop, an interrupt: a later rerun is
    another run to watch). results.json is only written as an invocation ends:
    an older one may describe the invocation before a resume that trains on."""
    newest = max(checkpoint_files.checkpoint_steps(self._directory), default=-1)
    if newest > self.last_step:
      return False
    ended = self._ended()
    try:
      status = RunStatus(ended.get("status"))
    except ValueError:
      return False
    ended_since = ended.get("invocation") not in (None, self._seen_invocation)
    flags = config_lib.read_flagfile(os.path.join(self._model_dir,
                                                  run_dir.FLAGS_FILE)) or {}
    steps = flags.get("train_steps")
    reached = status != RunStatus.COMPLETED or (
        str(ended.get("global_step")) == str(steps))
    return ended_since or (status.finished and reached)

  def _ended(self) -> dict:
    """The run's results.json, written as an invocation ends ({} before)."""
    ended = run_dir.read_json(os.path.join(self._model_dir, run_dir.RESULTS_FILE))
    return ended if isinstance(ended, dict) else {}

  def export_best(self):
    """Exports the best checkpoint's weights to MODEL_DIR/export_best, as
    in-process evaluation does (the SavedModel and model.keras)."""
    best = self._built.checkpoints.best_path()
    if best is None:
      return
    directory = os.path.join(self._model_dir, "export_best")
    try:
      not_written = evaluation.export_weights(self._built, directory, best=best)
      if not_written:
        self._built.console.say(f"export {directory}: {not_written}; the "
                                "SavedModel is written")
    except export.ExportFailure as e:
      raise ExportError(f"export to {directory} failed ({e}); the evaluations "
                        f"are in {self._path}: fix the cause and rerun to export"
                        ) from None
    self.state["export_best_dir"] = directory
    run_dir.write_json(self._path, self.state)

  def close(self):
    self._summaries.close()
    self._built.checkpoints.close()
