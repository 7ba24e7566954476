"""`trainer.train`: one run, top to bottom.

Everything that can be checked is checked before MODEL_DIR is touched (flags,
task, devices, data, the model and its metrics); then the chief claims the
directory, the latest checkpoint is restored, the controller trains to
--train_steps with its actions, and the run ends with a final evaluation, an
export and results.json.
"""

import os

from trainer import data, tasks
from trainer.config import Config
from trainer.errors import ConfigError
from trainer.interrupts import stop_on_signals
from trainer.outputs import run_dir
from trainer.outputs.export import export_saved_model
from trainer.outputs.progress import Progress
from trainer.outputs.results import Results
from trainer.outputs.summaries import Summaries, markdown_flags
from trainer.tasks import Task
from trainer.training import actions
from trainer.training.controller import Controller
from trainer.training.evaluation import evaluate_checkpoint
from trainer.training.setup import setup
from trainer.training.state import RunState, build_state


def run(config: Config, task: Task = None) -> dict:
  """Runs --mode (train, train_and_eval or eval) and returns the results dict.

  Args:
    config: the run's configuration.
    task: the task instance; default: built from config.task and task_params.

  Raises:
    TrainerError: bad input, a locked model_dir, divergence or a ledger mismatch.
  """
  config, task = resolve_task(config, task)
  if config.mode == "eval":
    return evaluate_checkpoint(config, task)
  return train(config, task)


def resolve_task(config: Config, task: Task = None) -> tuple:
  """(config, task) that agree: the task built from the config, or the config
  recording a given task's name and hyperparameters (so flags.txt holds them).

  Raises:
    ConfigError: the task cannot be built, or is not a trainer.Task.
  """
  if task is None:
    return config, tasks.build_task(config.task, config.task_kwargs)
  if not isinstance(task, Task):
    raise ConfigError(f"task={task!r}: must be an instance of a trainer.Task subclass")
  for field in tasks.hyperparameters(type(task)):
    tasks.param_type(type(task), field.name)
  return config.replace(task=tasks.task_spec(type(task)),
                        task_params=tuple(tasks.task_params(task).items())), task


def best_metric(config: Config, task: Task, metric_names) -> tuple:
  """(metric, goal) that picks the best evaluation, checked against the task's.

  Raises:
    ConfigError: --best_metric names a metric the task does not have.
  """
  metric = config.best_metric or type(task).best_metric
  available = ["loss", *metric_names]
  if metric.split("/", 1)[-1] not in available:
    raise ConfigError(f"--best_metric={metric}: task {config.task} reports "
                      f"{', '.join('eval/' + n for n in available)}")
  return metric, config.best_goal or tasks.metric_goal(type(task), metric)


def train(config: Config, task: Task) -> dict:
  """Trains (and with train_and_eval, evaluates) as the config says."""
  config = config.with_model_dir()
  found = setup(config, task)
  state = build_state(config, task, found.strategy, train_data=found.train_data,
                      eval_data=found.eval_data, is_chief=found.is_chief)
  best = best_metric(config, task, state.metric_names)
  if not found.is_chief:
    return _train_in_dir(state, best)
  run_dir.ensure_writable(config.model_dir)
  with run_dir.locked(config.model_dir):
    return _train_in_dir(state, best)


def _start_line(state: RunState, restored) -> str:
  config = state.config
  return (f"model_dir {config.model_dir}: task {config.task}, "
          + (f"resuming at step {restored}" if restored is not None
             else "starting at step 0")
          + f", {state.num_replicas} replica(s) x {config.per_replica_batch_size} "
          f"examples = global batch {state.global_batch_size}")


def _train_in_dir(state: RunState, best) -> dict:
  config, task, is_chief = state.config, state.task, state.is_chief
  if state.checkpoints.exists():
    run_dir.check_layout(config.model_dir, config,
                         tasks.layout_field_names(type(task)))
  results = Results(config, state, best_metric=best[0], best_goal=best[1])
  summaries = Summaries(config.model_dir, enabled=is_chief and config.summaries)
  progress = Progress(total_steps=config.train_steps,
                      enabled=is_chief and config.summaries, speak=is_chief)
  restored = state.checkpoints.restore_latest()
  progress.say(_start_line(state, restored))
  if config.strategy == "multi_worker" and config.cpu_devices > 1 and not any(
      "GPU" in d.upper() for d in state.strategy.extended.worker_devices):
    progress.say(f"note: --cpu_devices={config.cpu_devices} is ignored with "
                 "--strategy=multi_worker on CPUs: each worker runs one replica")
  if is_chief:
    run_dir.write_flags(config.model_dir, config)
  summaries.text("train", state.step, "flags", markdown_flags(config.to_flags()))
  summaries.hparams({name: config.value(name) for name in config.hparams})
  if restored is None:
    state.checkpoints.save()  # A rollback target and an eval-able step 0.
  evaluator = actions.Evaluator(state=state, results=results, summaries=summaries,
                                progress=progress)
  try:
    with stop_on_signals() as stop_request:
      if state.step >= config.train_steps:
        progress.say(f"already at step {state.step} >= --train_steps="
                     f"{config.train_steps}; nothing to train")
        status = "completed"
      else:
        status = Controller(state=state, actions=[
            actions.check_ledger(state),
            actions.NanPolicy(state=state, results=results, progress=progress),
            actions.record(state, results, summaries, progress),
            actions.checkpoint(state, summaries),
            evaluator,
            actions.stop_vote(state, stop_request, progress),
        ]).train()
    if status == "completed":
      if config.mode == "train_and_eval" and results.eval_step != state.step:
        evaluator.evaluate()
      if is_chief:
        export_dir = config.export_dir or os.path.join(config.model_dir, "export")
        export_saved_model(state.model, task, export_dir,
                           feature_spec=data.feature_spec(state.train_data))
        results.data["export_dir"] = export_dir
    return results.finish(status)
  finally:
    summaries.close()
    state.checkpoints.close()
