"""`--mode=eval`: evaluates the latest checkpoint of a run, read-only.

The task, model, data and batch flags come from the run's own flags (open_run);
the device flags from this invocation. It never takes the training lock, renames
or rewrites anything, so it can watch a live run, and works on a directory it
cannot write (another account's run): the evaluation is then printed only.
"""

import contextlib
import os
import time
from typing import Optional

from trainer.config import Config
from trainer import tasks
from trainer.errors import ConfigError, ModelDirError, RunStatus
from trainer.outputs import export, progress, run_dir
from trainer.outputs.summaries import Summaries
from trainer.tasks import Task
from trainer.training.open_run import open_run

EVAL_RESULTS_FILE = "eval_results.json"


def best_metric(config: Config, task: Task, reported) -> tuple:
  """(metric, goal) that picks the best evaluation, checked against the task's.

  Raises:
    ConfigError: --best_metric names a metric the task does not report.
  """
  metric = config.best_metric or type(task).best_metric
  if metric.split("/", 1)[-1] not in reported:
    raise ConfigError(f"--best_metric={metric}: task {config.task} reports "
                      f"{', '.join('eval/' + n for n in reported)}")
  return metric, config.best_goal or tasks.metric_goal(type(task), metric)


def export_weights(built, directory: str, *, best: Optional[str] = None,
                   keras_model: bool = True) -> Optional[str]:
  """Exports the evaluated weights (the moving averages with --eval_with_ema) of
  the model now, or of checkpoint `best`, to `directory`: the SavedModel and,
  with `keras_model`, model.keras. The one export of a run's model: the final
  one, export_best/ and the evaluator's.

  Args:
    built: the run as setup.build (or open_run) built it.
    directory: where to export, e.g. MODEL_DIR/export.
    best: a checkpoint's path (Checkpoints.best_path) whose weights to export
      (the current ones are given back after), or None: the current weights.
    keras_model: also write model.keras.

  Returns:
    None, or why model.keras is not written (one line; the SavedModel is).

  Raises:
    export.ExportFailure: the SavedModel could not be written.
  """
  trainer = built.trainer
  with contextlib.ExitStack() as stack:
    if best is not None:
      stack.enter_context(trainer.weights.best(best))
    stack.enter_context(trainer.weights.evaluated())
    export.export_saved_model(trainer.model, built.task, directory,
                              feature_spec=built.train_data.feature_spec)
    return export.save_keras_model(trainer.model, directory) if keras_model else None


def evaluate_run(config: Config, task: Task = None) -> dict:
  """Evaluates the latest checkpoint of --model_dir.

  Writes its eval scalars at the checkpoint's step and MODEL_DIR/eval_results.json
  when the directory is writable.

  Args:
    config: this invocation's config (model_dir and device flags).
    task: the run's task instance (a Python caller's); default: built from the
      run's flags.

  Returns:
    {"status": "evaluated", "global_step", "eval": the metrics}.

  Raises:
    ModelDirError: model_dir holds no trainer run or no checkpoint.
  """
  built = open_run(config.model_dir, invocation=config, task=task)
  try:
    step = built.checkpoints.restore()
    if step is None:
      raise ModelDirError(f"--model_dir={config.model_dir}: no checkpoint to "
                          "evaluate")
    start = time.perf_counter()
    metrics = built.trainer.evaluate(built.eval_data)
    seconds = time.perf_counter() - start  # Its tracing included.
  finally:
    built.checkpoints.close()
  results = {"status": str(RunStatus.EVALUATED), "global_step": step,
             "eval": metrics, "eval_seconds": round(seconds, 4),
             "eval_examples_per_second": metrics["examples"] / max(seconds, 1e-9)}
  console = built.console
  if built.cluster.is_chief:
    if os.access(config.model_dir, os.W_OK | os.X_OK):
      summaries = Summaries(config.model_dir, enabled=built.config.summaries)
      summaries.scalars("eval", step, {k: v for k, v in metrics.items()
                                       if k != "examples"})
      summaries.close()
      path = os.path.join(config.model_dir, EVAL_RESULTS_FILE)
      # An evaluator's record of the steps it evaluated stays (continuous_eval).
      kept = {k: v for k, v in (run_dir.read_json(path) or {}).items()
              if k in ("evaluated", "best_eval")}
      run_dir.write_json(path, dict(kept, **results))
    else:
      console.say(f"note: {config.model_dir} is not writable: this evaluation is "
                  f"printed only (no {EVAL_RESULTS_FILE}, no eval summaries)")
  console.say(f"eval of step {step}: {progress.format_metrics(metrics)}  "
              f"({metrics['examples']} examples)")
  return results
