"""`trainer.train`: one run, top to bottom.

Everything that can be checked is checked before MODEL_DIR is touched (flags,
task, devices, data, the model and its metrics); then the chief claims the
directory, the latest checkpoint is restored, the controller trains to
--train_steps with its actions, and the run ends with a final evaluation, an
export and results.json.
"""

import contextlib
import os
import time

import tensorflow as tf

from trainer import data, interrupts, tasks
from trainer.config import Config
from trainer.errors import ConfigError, ModelDirError, TaskError, TrainerError
from trainer.interrupts import stop_on_signals
from trainer.outputs import run_dir
from trainer.outputs.export import check_serving_signature, export_saved_model
from trainer.outputs.progress import Progress
from trainer.outputs.results import Results
from trainer.outputs.summaries import Summaries, markdown_flags
from trainer.tasks import Task
from trainer.training import actions
from trainer.training.checkpoints import find_checkpoint, warm_start
from trainer.training.controller import Controller
from trainer.training.evaluation import evaluate_checkpoint
from trainer.training.setup import resolve_task, setup
from trainer.training.state import RunState, build_state
from trainer.training.watchdog import HangWatchdog


def run(config: Config, task: Task = None) -> dict:
  """Runs --mode (train, train_and_eval or eval) and returns the results dict.

  Args:
    config: the run's configuration.
    task: the task instance; default: built from config.task and task_params.

  Raises:
    TrainerError: bad input, a locked model_dir, divergence or a ledger mismatch.
  """
  if config.mode == "eval":
    # The run's own task and hyperparameters come from its flags.txt; a task
    # instance given here replaces them (a Python caller's unimportable class).
    return evaluate_checkpoint(config, task)
  config, task = resolve_task(config, task)
  return train(config, task)


def best_metric(config: Config, task: Task, metric_names) -> tuple:
  """(metric, goal) that picks the best evaluation, checked against the task's.

  Raises:
    ConfigError: --best_metric names a metric the task does not have.
  """
  metric = config.best_metric or type(task).best_metric
  available = list(metric_names)
  if metric.split("/", 1)[-1] not in available:
    raise ConfigError(f"--best_metric={metric}: task {config.task} reports "
                      f"{', '.join('eval/' + n for n in available)}")
  return metric, config.best_goal or tasks.metric_goal(type(task), metric)


def train(config: Config, task: Task) -> dict:
  """Trains (and with train_and_eval, evaluates) as the config says."""
  config = config.with_model_dir()
  with stop_on_signals() as stop_request:
    found = setup(config, task)
    interrupts.refresh()  # The strategy's start-up may have replaced them.
    state = build_state(config, task, found.strategy, train_data=found.train_data,
                        prepared=found.prepared,
                        eval_data=found.eval_data, is_chief=found.is_chief)
    best = best_metric(config, task, state.reported_metrics)
    export_dir = config.export_dir or os.path.join(config.model_dir, "export")
    if config.init_checkpoint and not state.checkpoints.exists():
      _warm_start(state)  # Before MODEL_DIR is touched: a bad one writes nothing.
    check_serving_signature(task, data.feature_spec(state.train_data))
    with contextlib.ExitStack() as claimed:
      refusal = None
      if found.is_chief:
        try:
          run_dir.check_writable_target(export_dir, flag="--export_dir")
          run_dir.ensure_writable(config.model_dir)
          claimed.enter_context(run_dir.locked(config.model_dir))
        except TrainerError as e:
          refusal = e
      # Every worker learns whether the chief could claim the directory: a worker
      # going on alone would wait forever in the first collective.
      if state.stop_vote(refusal is not None):
        raise refusal or ModelDirError(
            f"--model_dir={config.model_dir}: the chief could not use it (its "
            "error says why)")
      return _train_in_dir(state, best, stop_request, export_dir)


def _finished_before(state: RunState, results: Results, restored) -> bool:
  """Whether an earlier invocation completed this run (a rerun changes nothing)."""
  previous = results.previous
  done = (previous.get("status") == "early_stopped" or
          (previous.get("status") == "completed" and
           state.step >= state.config.train_steps))
  return (restored is not None and done and
          previous.get("global_step") == state.step and
          os.path.isdir(previous.get("export_dir") or ""))


def _refuse_changes(config: Config, changes: list):
  """Refuses a checkpoint of another model, batch or data, listing the changes.

  Raises:
    ModelDirError: quoting each change with the run's value, if there is any.
  """
  if changes:
    raise ModelDirError(
        f"--model_dir={config.model_dir} holds a checkpoint made with other flags "
        f"or data: {'; '.join(changes)}. Keep them (another replica count needs the "
        "same global batch, e.g. --global_batch_size) or use a new --model_dir")


def _start_line(state: RunState, restored, nan_policy) -> str:
  config = state.config
  elastic = restored is not None and state.layout_change_line()
  line = (f"model_dir {config.model_dir}: task {config.task}, "
          + (f"at step {restored}, {elastic}" if elastic else
             f"resuming at step {restored}, " if restored is not None
             else "starting at step 0, ")
          + ("" if elastic else
             f"{state.num_replicas} replica(s) x {state.per_replica_batch_size} "
             f"examples = global batch {state.global_batch_size}"))
  rate = state.base_learning_rate
  was = state.record.data.get("base_learning_rate")
  if restored is not None and rate is not None and was is not None and was != rate:
    line += f", learning rate {rate:g} (was {was:g})"
  if nan_policy.multiplier != 1.0 and rate is not None:
    line += (f", learning rate x{nan_policy.multiplier:g} after "
             f"{nan_policy.rollbacks} rollback(s)")
  return line


def _train_in_dir(state: RunState, best, stop_request, export_dir) -> dict:
  config = state.config
  if state.checkpoints.exists():  # Before restoring: another model would not fit.
    _refuse_changes(config, run_dir.layout_changes(
        config.model_dir, config, tasks.layout_field_names(type(state.task))))
  restored = state.restore_checkpoint()
  if restored is not None:
    _refuse_changes(config, state.resume_changes())
  state.checkpoints.clean_leftovers()
  results = Results(config, state, best_metric=best[0], best_goal=best[1])
  # Every collective from here on is bounded: a lost peer is a hang report, exit 7.
  watchdog = HangWatchdog(
      limit=config.hang_timeout_seconds, directory=config.model_dir,
      worker=_worker_name(state.strategy),
      on_hang=lambda step: results.finish("hung", step=step))
  watchdog.completed(state.step)
  with watchdog:
    return _train_watched(state, results, watchdog, restored=restored,
                          stop_request=stop_request, export_dir=export_dir,
                          best=best)


def _train_watched(state: RunState, results: Results, watchdog: HangWatchdog, *,
                   restored, stop_request, export_dir, best) -> dict:
  """Trains (and evaluates, exports) from the restored state, with the watchdog
  on: every collective runs inside one of its guards."""
  config, is_chief = state.config, state.is_chief
  summaries = Summaries(config.model_dir, enabled=is_chief and config.summaries)
  progress = Progress(total_steps=config.train_steps,
                      enabled=is_chief and config.summaries, speak=is_chief)

  def vote(phase: str, stop: bool) -> bool:
    with watchdog.guard(phase, step=state.step):
      return state.stop_vote(stop)

  # Decided together: a worker that cannot see the export would otherwise go on.
  if vote("the vote on whether the run is finished",
          _finished_before(state, results, restored)):
    progress.say(f"model_dir {config.model_dir}: already completed at step "
                 f"{state.step} >= --train_steps={config.train_steps}; nothing to "
                 "train, nothing changed")
    return results.previous
  nan_policy = actions.NanPolicy(state=state, results=results, progress=progress,
                                 on_replayed_step=watchdog.progressed)
  nan_policy.apply_learning_rate()
  progress.say(_start_line(state, restored, nan_policy))
  _say_input(state, restored)
  if config.init_checkpoint and restored is not None:
    progress.say(f"note: --init_checkpoint={config.init_checkpoint} is not used: the "
                 "run resumes from its own checkpoint")
  if config.strategy == "multi_worker" and config.cpu_devices > 1 and not any(
      "GPU" in d.upper() for d in state.strategy.extended.worker_devices):
    progress.say(f"note: --cpu_devices={config.cpu_devices} is ignored with "
                 "--strategy=multi_worker on CPUs: each worker runs one replica")
  if is_chief:
    run_dir.write_flags(config.model_dir, config)
  summaries.text("train", state.step, "flags", markdown_flags(config.to_flags()))
  summaries.hparams({name: config.value(name) for name in config.hparams})
  if restored is None:
    with watchdog.guard("checkpoint", step=0):
      state.save_checkpoint()  # A rollback target and an eval-able step 0.
  evaluator = actions.Evaluator(state=state, results=results, summaries=summaries,
                                progress=progress, best_metric=best)
  profiler = actions.Profiler(state, results, progress)

  def stopping(during: str) -> bool:
    """A signal came (before or) during `during`: every worker agrees to stop."""
    if not vote(f"the stop vote {during}", bool(stop_request)):
      return False
    progress.say(f"{stop_request.signal_name or 'a stop request'} {during}: the "
                 f"checkpoint of step {state.step} is kept; rerun the same command "
                 "to finish")
    return True

  try:
    if stopping("during set-up"):
      return results.finish("interrupted")
    if state.step >= config.train_steps:
      progress.say(f"already at step {state.step} >= --train_steps="
                   f"{config.train_steps}; nothing to train")
      status = "completed"
    else:
      profiler.before_training()
      status = Controller(state=state, actions=[
          actions.check_ledger(state),
          nan_policy,
          actions.record(state, results, summaries, progress),
          profiler,
          evaluator,
          actions.checkpoint(state, summaries),
          actions.stop_vote(state, stop_request, progress),
          actions.time_limit(state, progress, started=time.monotonic()),
      ], watchdog=watchdog).train()
    profiler.close()
    if status not in ("completed", "early_stopped"):
      return results.finish(status)
    if config.mode == "train_and_eval" and results.eval_step != state.step:
      with watchdog.guard("final evaluation", step=state.step):
        evaluator.evaluate()
      if stopping("during the final evaluation"):
        return results.finish("interrupted")
    if is_chief:
      _export(state, results, export_dir)
      if stop_request:
        progress.say(f"{stop_request.signal_name} during the export: rerun the same "
                     "command to finish")
        return results.finish("interrupted")
    return results.finish(status)
  finally:
    profiler.close()
    summaries.close()
    state.checkpoints.close()


def _say_input(state: RunState, restored):
  """Every worker says what it reads (files, sharding); a resume on another number
  of input pipelines says that the examples differ from here on."""
  line = data.describe(state.strategy, state.train_data)
  if line is None:
    return
  if state.is_chief or state.num_workers > 1:
    print(line, flush=True)
  was = state.record.data.get("input_pipelines")
  now = data.input_pipelines(state.strategy)[0]
  if restored is not None and was is not None and was != now and state.is_chief:
    print(f"note: the run read its data through {was} input pipeline(s), now {now}: "
          "each worker reads other files, so the examples from here on are not "
          "those an uninterrupted run would have read", flush=True)


def _worker_name(strategy) -> str:
  """This process in the cluster: "worker-1" (or "worker-0" outside one)."""
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not resolver.cluster_spec().as_dict():
    return "worker-0"
  return f"{resolver.task_type}-{resolver.task_id}"


def _warm_start(state: RunState):
  """--init_checkpoint: the model's weights that fit, before step 0."""
  path = find_checkpoint(state.config.init_checkpoint)
  restored, skipped = warm_start(state.model, path)
  state.reset_averages()  # Average from the warm weights, not the random ones.
  if state.is_chief:
    print(f"warm start from {path}: restored {len(restored)} of "
          f"{len(restored) + len(skipped)} model weights" +
          ("; not restored: " + ", ".join(f"{name} ({why})" for name, why in skipped)
           if skipped else ""), flush=True)


def _export(state: RunState, results: Results, export_dir: str):
  """Exports the final model (the moving averages with --eval_with_ema) and, when
  evaluations picked a best checkpoint, its weights to MODEL_DIR/export_best.

  A failure of the task's serving code is one line (exit 2) and leaves the trained
  run unexported, for a rerun to export.
  """
  feature_spec = data.feature_spec(state.train_data)
  try:
    with state.evaluated_weights():
      export_saved_model(state.model, state.task, export_dir,
                         feature_spec=feature_spec)
    best = state.checkpoints.best_path()
    if best:
      best_dir = os.path.join(state.config.model_dir, "export_best")
      with state.best_weights(best), state.evaluated_weights():
        export_saved_model(state.model, state.task, best_dir,
                           feature_spec=feature_spec)
      results.data["export_best_dir"] = best_dir
  except (ValueError, TypeError, tf.errors.OpError, TaskError) as e:
    results.finish("unexported")
    cause = (str(e) if isinstance(e, TaskError) else
             f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")
    raise TaskError(f"export to {export_dir} failed ({cause}); training finished "
                    "and its checkpoint is kept: fix the task's serving methods and "
                    "rerun to export") from None
  results.data["export_dir"] = export_dir
