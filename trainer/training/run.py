"""`trainer.train`: one run, top to bottom.

  1-3  devices and strategy, task and data, the trainer       (setup.build)
  4    claim the directory, check the resume, restore
  5    the actions, in the order they run after each loop call
  6    the controller: loop calls to --train_steps
  7    final evaluation, export, results.json

Everything that can be checked is checked before MODEL_DIR is touched (flags,
task, devices, data, the model and its metrics). Every collective after the claim
runs under the hang watchdog; every worker votes before a phase that only some of
them might otherwise enter.
"""

import contextlib
import dataclasses
import functools
import os


from trainer import actions as actions_lib
from trainer import interrupts, tasks
from trainer.actions.checkpoint import Checkpoint
from trainer.actions.evaluate import Evaluate
from trainer.actions.histograms import Histograms
from trainer.actions.ledger import LedgerCheck
from trainer.actions.limits import SignalStop, TimeLimit
from trainer.actions.nan_policy import NanPolicy
from trainer.actions.plateau import ReduceOnPlateau
from trainer.actions.profiler import Profiler
from trainer.actions.report import Report
from trainer.actions.user import UserAction
from trainer.config import Config
from trainer.errors import (ExportError, ModelDirError, RunStatus,
                            UserCodeError, disk_full_is_one_line, no_space,
                            user_code)
from trainer.interrupts import stop_on_signals
from trainer.distribute import devices
from trainer.outputs import export, run_dir
from trainer.outputs.results import Results
from trainer.outputs.summaries import Summaries, markdown_flags
from trainer.tasks import Task
from trainer.training import (announce, continuous_eval, divergence, equivalence,
                              evaluation, optimizers, peers, resume,
                              setup)
from trainer.training.checkpoint_files import find_checkpoint, warm_start
from trainer.training.controller import Controller
from trainer.training.stop_policy import StopPolicy
from trainer.training.watchdog import HangWatchdog


def run(config: Config, task: Task = None, actions=()) -> dict:
  """Runs --mode (train, train_and_eval or eval) and returns the results dict.

  Args:
    config: the run's configuration.
    task: the task instance; default: built from config.task and task_params.
    actions: user actions run after every loop call, after the task's own.

  Raises:
    TrainerError: bad input, a locked model_dir, divergence, a ledger mismatch,
      user code that raised (UserCodeError), or another worker's failure
      (peers.PeerFailedError).
  """
  # Under multi-worker, a failure of this worker alone is told to the others,
  # which stop at once (and say so in one line) instead of waiting for it.
  with peers.failures_shared():
    config = evaluator_config(config)
    if config.mode == "eval":
      # The run's own task and hyperparameters come from its flags.txt; a task
      # instance given here replaces them (a Python caller's unimportable class).
      return evaluation.evaluate_run(config, task)
    if config.mode == "continuous_eval":
      with stop_on_signals(config.requeue_signal) as stop_request:
        return continuous_eval.evaluate_continuously(config, task,
                                                     stop_request=stop_request)
    config, task = setup.resolve_task(config.with_model_dir(), task)
    with stop_on_signals(config.requeue_signal) as stop_request:
      return train(config, task, actions=list(actions), stop_request=stop_request)


def evaluator_config(config: Config) -> Config:
  """`config` for a process whose TF_CONFIG task is the cluster's evaluator:
  --mode=continuous_eval on its own devices (it is no training worker)."""
  if devices.tf_config_task_type() != "evaluator":
    return config
  return config.replace(mode="continuous_eval", strategy=(
      "mirrored" if config.strategy == "multi_worker" else config.strategy))


def train(config: Config, task: Task, *, actions: list, stop_request) -> dict:
  """Trains (and with train_and_eval, evaluates) as the config says."""
  # Every phase that waits on a peer, set-up included, is bounded from here on.
  with HangWatchdog(limit=config.hang_timeout_seconds,
                    directory=config.model_dir) as watchdog:
    # ---- 1-3. Devices and strategy, the task and its data, the trainer. ----
    built = setup.build(config, task, watchdog=watchdog)
    interrupts.refresh()  # The strategy's start-up may have replaced them.
    return _train_built(built, actions=actions, stop_request=stop_request,
                        watchdog=watchdog)


def _train_built(built: setup.Built, *, actions: list, stop_request,
                 watchdog: HangWatchdog) -> dict:
  """Phases 4 to 7 of `train` on what setup.build built."""
  config, task = built.config, built.task  # --mode resolved.
  trainer, checkpoints, console = built.trainer, built.checkpoints, built.console
  cluster, train_data = built.cluster, built.train_data
  best = evaluation.best_metric(config, task, trainer.reported_metrics)
  flag_lines = optimizers.applied_flags(config.to_flags(),
                                        task_optimizer=trainer.task_optimizer)
  export_dir = config.export_dir or os.path.join(config.model_dir, "export")
  facts = resume.RunFacts(
      layout=config.layout_flags(tasks.layout_field_names(type(task))),
      flags=tuple(flag_lines),
      data=resume.data_identity(train_data, built.prepared),
      global_batch_size=trainer.global_batch_size,
      per_replica_batch_size=trainer.per_replica_batch_size,
      num_replicas=trainer.num_replicas, num_workers=cluster.num_workers,
      input_shards=trainer.order.input_shards)
  if config.init_checkpoint and not checkpoints.exists():
    _warm_start(trainer, config.init_checkpoint, console)  # A bad one writes nothing.
  export.check_serving_signature(task, train_data.feature_spec)
  with user_code("Task.actions"):
    actions = list(task.actions()) + actions
  policy = StopPolicy(trainer=trainer, watchdog=watchdog, stop_request=stop_request,
                      cluster=cluster, console=console)

  # ---- 4. Claim the directory, check the resume, restore. ----
  # A full disk, whichever file it hit, is one line; earlier checkpoints stay.
  with disk_full_is_one_line(), contextlib.ExitStack() as stack:
    _claim(stack, config, export_dir, policy)
    resume.check(config.model_dir, facts, trainer.model)
    restored = checkpoints.restore()
    previous = dataclasses.replace(checkpoints.record)
    facts.record_into(checkpoints.record)
    checkpoints.clean_leftovers()
    stack.callback(checkpoints.close)
    results = Results(model_dir=config.model_dir, task=config.task,
                      train_steps=config.train_steps, trainer=trainer,
                      checkpoints=checkpoints, best_metric=best[0],
                      best_goal=best[1], min_delta=config.early_stopping_min_delta)
    watchdog.on_hang = functools.partial(_hung, results)
    watchdog.completed(trainer.step)
    # On the way out with an error: results.json says how the run ended.
    stack.push(lambda _, error, __: _record_failure(results, error, watchdog))
    # Decided together: a worker that cannot see the export would otherwise go on.
    if policy.vote("the vote on whether the run is finished",
                   _finished_before(results.previous, trainer.step, restored,
                                    config.train_steps)):
      ended = results.previous.get("status")
      console.say(f"model_dir {config.model_dir}: already {ended} at step "
                  f"{trainer.step}" + (f" >= --train_steps={config.train_steps}"
                                       if ended == RunStatus.COMPLETED else "")
                  + "; nothing to train, nothing changed")
      return results.previous
    if config.verify_equivalence != "false" and trainer.step < config.train_steps:
      equivalence.check_before_training(
          trainer, train_data, console=console, vote=policy.vote,
          watchdog=watchdog, strict=config.verify_equivalence == "strict")
    summaries = Summaries(config.model_dir,
                          enabled=cluster.is_chief and config.summaries)
    stack.callback(summaries.close)
    nan_policy = NanPolicy(
        on_nan=config.on_nan, trainer=trainer, checkpoints=checkpoints,
        results=results, console=console, model_dir=config.model_dir,
        find_divergence=functools.partial(
            divergence.find_divergence, trainer, train_data, checkpoints,
            model_dir=config.model_dir,
            on_step=watchdog.progressed))  # A replay is no hang.
    nan_policy.apply_learning_rate()
    _announce(built, restored=restored, previous=previous, nan_policy=nan_policy)
    if cluster.is_chief:
      run_dir.write_flags(config.model_dir, flag_lines, comments=[
          optimizers.describe_task_optimizer(trainer.optimizer)]
                          if trainer.task_optimizer else [])
    summaries.text("train", trainer.step, "flags", markdown_flags(flag_lines))
    summaries.hparams({name: config.value(name) for name in config.hparams})
    if restored is None:
      with watchdog.guard("checkpoint", step=0):
        checkpoints.save()  # A rollback target and an eval-able step 0.

    # ---- 5. The actions, in the order they run after each loop call. ----
    evaluate = Evaluate(
        trainer=trainer, eval_data=built.eval_data, checkpoints=checkpoints,
        results=results, summaries=summaries, console=console, best_metric=best,
        every=config.eval_every, train_steps=config.train_steps,
        enabled=config.mode == "train_and_eval",
        patience=config.early_stopping_patience,
        min_delta=config.early_stopping_min_delta)
    profiler = Profiler(window=config.profile_steps, model_dir=config.model_dir,
                        is_chief=cluster.is_chief, results=results, console=console)
    stack.callback(profiler.close)
    checkpoint = Checkpoint(checkpoints=checkpoints, summaries=summaries,
                            every=config.checkpoint_every,
                            train_steps=config.train_steps)
    context = functools.partial(
        actions_lib.action_context, model=trainer.model, model_dir=config.model_dir,
        is_chief=cluster.is_chief, evaluate=evaluate, summaries=summaries)
    loop_actions = [
        LedgerCheck(trainer), nan_policy,
        Report(trainer=trainer, results=results, summaries=summaries,
               console=console, clip_norm=config.clip_norm),
        Histograms(trainer=trainer, summaries=summaries,
                   every=config.histogram_every),
        profiler, evaluate,
        ReduceOnPlateau(evaluate=evaluate, checkpoints=checkpoints,
                        checkpoint=checkpoint,
                        nan_policy=nan_policy, console=console,
                        patience=config.reduce_lr_patience,
                        factor=config.reduce_lr_factor,
                        min_rate=config.min_learning_rate,
                        base_rate=trainer.base_learning_rate, metric=best[0]),
        *[UserAction(action, context=context) for action in actions],
        checkpoint,
        SignalStop(stop_request, requeue_signal=interrupts.requeue_signal_name()),
        TimeLimit(max_time=config.max_time, budget=config.max_time_seconds)]

    # ---- 6. The controller: loop calls to --train_steps. ----
    if policy.stopping("during set-up"):
      return results.finish(policy.stop_status())
    if trainer.step >= config.train_steps:
      console.say(f"already at step {trainer.step} >= --train_steps="
                  f"{config.train_steps}; nothing to train")
      status = RunStatus.COMPLETED
    else:
      profiler.before_training(trainer.step)
      status = Controller(trainer=trainer, train_data=train_data,
                          actions=loop_actions, train_steps=config.train_steps,
                          steps_per_loop=config.steps_per_loop, watchdog=watchdog,
                          on_stop=functools.partial(policy.save_and_say,
                                                    checkpoint)).train()
    profiler.close()
    if status in (RunStatus.INTERRUPTED, RunStatus.REQUEUED):
      status = policy.stop_status(status)
    if not status.finished:
      return _closing(results.finish(status), config, console, best[0])

    # ---- 7. Final evaluation, export, results. ----
    if config.mode == "train_and_eval" and results.eval_step != trainer.step:
      with watchdog.guard("final evaluation", step=trainer.step):
        evaluate.evaluate()
      if policy.stopping("during the final evaluation"):
        return results.finish(policy.stop_status())
    if cluster.is_chief:
      _export(built, results, export_dir)
      if stop_request:
        console.say(f"{stop_request.signal_name} during the export: rerun the "
                    "same command to finish")
        return results.finish(policy.stop_status())
    return _closing(results.finish(status), config, console, best[0])


def _hung(results: Results, step):
  """The watchdog's last word in results.json: hung at `step`."""
  results.finish(RunStatus.HUNG, step=step)


def _announce(built: setup.Built, *, restored, previous, nan_policy):
  """Says where the run starts, what each worker reads and the chief's notes."""
  trainer, cluster, console = built.trainer, built.cluster, built.console
  console.say(announce.start_line(
      model_dir=built.config.model_dir, task=built.config.task, trainer=trainer,
      restored=restored, previous=previous, multiplier=nan_policy.multiplier,
      rollbacks=nan_policy.rollbacks))
  described = built.train_data.describe(cluster, trainer.order)
  if described and (cluster.is_chief or cluster.num_workers > 1):
    console.say_as_worker(f"input: {described}")
  for line in announce.notes(built.config, built=built, restored=restored,
                             previous=previous):
    console.say(line)


def _record_failure(results: Results, error, watchdog: HangWatchdog):
  """Finishes results.json for a run that ends with `error` (None: no error):
  hung at the last completed step when a peer's failure aborted a collective
  outside a guarded phase, failed when user code raised. Other errors finish it
  themselves (or are bad input, found before anything ran)."""
  if error is None:
    return
  if peers.peer_failure(error) is not None:
    results.finish(RunStatus.HUNG, step=watchdog.last_completed_step)
  elif isinstance(error, UserCodeError):
    results.finish(RunStatus.FAILED)


def _closing(data: dict, config: Config, console, best_metric: str) -> dict:
  """Says the closing lines (what the run reached, where it is, how to look
  further) and returns the results."""
  for line in announce.closing_lines(data, model_dir=config.model_dir,
                                     best_metric=best_metric):
    console.say(line)
  return data


def _claim(stack: contextlib.ExitStack, config: Config, export_dir: str,
           policy: StopPolicy):
  """The chief claims MODEL_DIR (creates it, checks it and the export directory
  can be written, locks it); every worker learns whether it could, since a worker
  going on alone would wait forever in the first collective. Directories the
  claim made are removed again if the run leaves them empty (it refused before
  writing anything).

  Raises:
    ModelDirError, LockedError: the chief could not claim it.
  """
  refusal = None
  if policy.cluster.is_chief:
    try:
      if config.export_dir:  # Before model_dir is made: a refusal writes nothing.
        run_dir.check_writable_target(export_dir, flag="--export_dir")
      stack.callback(run_dir.remove_if_empty, run_dir.missing_parents(
          config.model_dir))
      run_dir.ensure_writable(config.model_dir)
      stack.enter_context(run_dir.locked(config.model_dir))
    except (ModelDirError, run_dir.LockedError) as e:
      refusal = e
  if policy.vote("the claim vote", refusal is not None):
    raise refusal or ModelDirError(
        f"--model_dir={config.model_dir}: the chief could not use it (its error "
        "says why)")


def _finished_before(previous: dict, step: int, restored, train_steps: int) -> bool:
  """Whether an earlier invocation finished this run (a rerun changes nothing)."""
  status = previous.get("status")
  done = status in (RunStatus.EARLY_STOPPED, RunStatus.STOPPED) or (
      status == RunStatus.COMPLETED and step >= train_steps)
  return (restored is not None and done and previous.get("global_step") == step and
          os.path.isdir(previous.get("export_dir") or ""))


def _warm_start(trainer, init_checkpoint: str, console):
  """--init_checkpoint: the model's weights that fit, before step 0."""
  path = find_checkpoint(init_checkpoint)
  restored, skipped = warm_start(trainer.model, path)
  trainer.weights.reset_averages()  # From the warm weights, not the random ones.
  console.say(f"warm start from {path}: restored {len(restored)} of "
              f"{len(restored) + len(skipped)} model weights" +
              ("; not restored: " + ", ".join(f"{name} ({why})"
                                              for name, why in skipped)
               if skipped else ""))


def _export(built, results: Results, export_dir: str):
  """Exports the final model (the moving averages with --eval_with_ema) and, when
  evaluations picked a best checkpoint, its weights to MODEL_DIR/export_best.

  Raises:
    ExportError: the export failed (one line naming the cause; status
      unexported; the checkpoints are kept and a rerun exports).
  """
  try:
    not_written = evaluation.export_weights(built, export_dir)
    if not_written:
      built.console.say(f"export {export_dir}: {not_written}; the SavedModel is "
                        "written")
    # Only this run's own evaluations' best: in --mode=train, checkpoints/best
    # is an evaluator's (continuous_eval exports it itself).
    best = (built.checkpoints.best_path()
            if built.config.mode == "train_and_eval" else None)
    if best:
      best_dir = os.path.join(built.config.model_dir, "export_best")
      evaluation.export_weights(built, best_dir, best=best,
                                keras_model=not not_written)
      results.data["export_best_dir"] = best_dir
  except export.ExportFailure as e:
    if no_space(e.__cause__):
      raise no_space(e.__cause__) from None  # A full disk, not the export's.
    results.finish(RunStatus.UNEXPORTED)
    raise ExportError(f"export to {export_dir} failed ({e}); training finished and "
                      "its checkpoints are kept: fix the cause and rerun to "
                      "export") from None
  results.data["export_dir"] = export_dir
