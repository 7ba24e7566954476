"""The outer loop: loop calls of K steps, summaries, eval, checkpoints and faults.

`run(config)` is `trainer.train`. It validates everything that can be validated
before touching MODEL_DIR, then claims the directory, restores the latest
checkpoint and trains to --train_steps, checking the replica ledger after every
loop call.
"""

import os
import time

import tensorflow as tf

from trainer import data, devices, run_dir
from trainer.config import Config
from trainer.errors import DataError, DivergedError, ModelDirError
from trainer.evaluation import evaluate_once
from trainer.export import export_saved_model
from trainer.interrupts import stop_on_signals
from trainer.results import Results
from trainer.state import RunState, build_state
from trainer.steps import replica_batch_error
from trainer.progress import Progress
from trainer.summaries import Summaries, markdown_flags

_AUTO_TARGET_SECONDS = 1.0  # --steps_per_loop=0: aim for loop calls this long.
_AUTO_MAX_STEPS = 1000
_MAX_ROLLBACKS = 3


def run(config: Config) -> dict:
  """Runs --mode (train, train_and_eval or eval) and returns the results dict.

  Raises:
    TrainerError: bad input, a locked model_dir, divergence or a ledger mismatch.
  """
  if config.mode == "eval":
    from trainer.evaluation import evaluate_checkpoint
    return evaluate_checkpoint(config)
  return train(config)


def setup(config: Config):
  """Devices, strategy and data: everything that can fail before MODEL_DIR is used.

  Returns:
    (strategy, is_chief, source).
  """
  devices.configure_devices(config)
  strategy = devices.make_strategy(config)
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  source = data.load_source(config)
  global_batch = config.per_replica_batch_size * strategy.num_replicas_in_sync
  if len(source.x_train) < global_batch:
    raise DataError(f"the training set has {len(source.x_train)} examples, fewer than "
                    f"one global batch of {global_batch} (--per_replica_batch_size="
                    f"{config.per_replica_batch_size} x {strategy.num_replicas_in_sync} "
                    "replicas)")
  return strategy, devices.is_chief(strategy), source


def train(config: Config) -> dict:
  """Trains (and with train_and_eval, evaluates) as the config says."""
  config = config.with_model_dir()
  strategy, is_chief, source = setup(config)
  if is_chief:
    run_dir.ensure_writable(config.model_dir)
    with run_dir.locked(config.model_dir):
      return _train_in_dir(config, strategy, is_chief, source)
  return _train_in_dir(config, strategy, is_chief, source)


def _train_in_dir(config, strategy, is_chief, source):
  state = build_state(config, strategy, source, is_chief=is_chief)
  if state.checkpoints.exists():
    run_dir.check_layout(config.model_dir, config)
  results = Results(config, state)
  summaries = Summaries(config.model_dir, enabled=is_chief and config.summaries)
  progress = Progress(total_steps=config.train_steps, enabled=is_chief and
                      config.summaries, speak=is_chief)
  restored = state.checkpoints.restore_latest()
  progress.say(f"model_dir {config.model_dir}: "
               + (f"resuming at step {restored}" if restored is not None
                  else "starting at step 0")
               + f", {state.num_replicas} replica(s) x {config.per_replica_batch_size} "
               f"examples = global batch {state.global_batch_size}")
  if config.strategy == "multi_worker" and config.cpu_devices > 1 and not any(
      "GPU" in d.upper() for d in state.strategy.extended.worker_devices):
    progress.say(f"note: --cpu_devices={config.cpu_devices} is ignored with "
                 "--strategy=multi_worker on CPUs: each worker runs one replica")
  if is_chief:
    run_dir.write_flags(config.model_dir, config)
  summaries.text("train", state.step, "flags", markdown_flags(config.to_flags()))
  summaries.hparams({name: getattr(config, name) for name in config.hparams})
  if restored is None:
    state.checkpoints.save()  # A rollback target and an eval-able step 0.
  try:
    with stop_on_signals() as stop_request:
      status = _train_steps(state, results, summaries, progress, stop_request)
    if status == "completed":
      if config.mode == "train_and_eval" and results.eval_step != state.step:
        _evaluate(state, results, summaries, progress)
      if is_chief:
        export_dir = config.export_dir or os.path.join(config.model_dir, "export")
        export_saved_model(state.model, export_dir, input_shape=source.input_shape,
                           scale=source.scale)
        results.data["export_dir"] = export_dir
    return results.finish(status)
  finally:
    summaries.close()
    state.checkpoints.close()


def _next_stop(step: int, config: Config) -> int:
  """The next step at which a loop call must end (checkpoint, eval, summary, end)."""
  stops = [config.train_steps, _next_multiple(step, config.checkpoint_every)]
  if config.mode == "train_and_eval" and config.eval_every:
    stops.append(_next_multiple(step, config.eval_every))
  if config.summary_every:
    stops.append(_next_multiple(step, config.summary_every))
  return min(stops)


def _next_multiple(step, every):
  return (step // every + 1) * every


def _train_iterator(state: RunState):
  dataset = data.train_dataset(state.source, global_batch_size=state.global_batch_size,
                               seed=state.config.seed, shuffle=state.config.shuffle,
                               start_step=state.step)
  return iter(data.distribute(state.strategy, dataset))


def _train_steps(state, results, summaries, progress, stop_request) -> str:
  """Trains to --train_steps; returns "completed" or "interrupted"."""
  config = state.config
  step = state.step  # Then from each call's outputs: reading the variable is an op.
  if step >= config.train_steps:
    progress.say(f"already at step {step} >= --train_steps={config.train_steps}; "
                 "nothing to train")
    return "completed"
  iterator = _train_iterator(state)
  steps_per_loop = config.steps_per_loop or 1  # Auto: one step first (it traces).
  rollbacks = 0
  while step < config.train_steps:
    num_steps = min(steps_per_loop, _next_stop(step, config) - step)
    start = time.perf_counter()
    try:
      out = {k: v.numpy() for k, v in
             state.train_loop(iterator, tf.constant(num_steps)).items()}
    except tf.errors.InvalidArgumentError as e:
      raise replica_batch_error(e) or e
    seconds = time.perf_counter() - start
    ledger = state.train_ledger.check(
        expected_batches=num_steps,
        per_replica_batch_size=config.per_replica_batch_size,
        counts=(out["ledger_batches"], out["ledger_examples"]))
    step = int(out["step"])
    loss = float(out["loss"]) / num_steps
    accuracy = float(out["correct"]) / max(float(out["examples"]), 1)
    if not bool(out["all_finite"]):
      if config.on_nan == "rollback" and rollbacks < _MAX_ROLLBACKS:
        rollbacks += 1
        iterator = _roll_back(state, progress, step)
        step = state.step
        continue
      results.finish("diverged")
      raise DivergedError(f"non-finite loss or gradients at step {step} (loss {loss}); "
                          "the last good checkpoint is kept. Lower --learning_rate or "
                          "use --on_nan=rollback")
    results.record_train_call(step=step, steps=num_steps, loss=loss,
                              accuracy=accuracy)
    examples_per_second = num_steps * state.global_batch_size / seconds
    summaries.scalars("train", step, {
        "loss": loss, "accuracy": accuracy, "gradient_norm": out["gradient_norm"],
        "learning_rate": out["learning_rate"],
        "examples_per_second": examples_per_second,
        "steps_per_second": num_steps / seconds,
        **{f"replica_batches/replica_{i}": n for i, n in enumerate(ledger)}})
    progress.report(step, loss=loss, accuracy=accuracy,
                    examples_per_second=examples_per_second)
    if step % config.checkpoint_every == 0 or step >= config.train_steps:
      state.checkpoints.save()
      summaries.flush()  # Events on disk reach at least the checkpoint's step.
    if (config.mode == "train_and_eval" and config.eval_every and
        step % config.eval_every == 0):
      _evaluate(state, results, summaries, progress)
    if bool(state.stop_vote(bool(stop_request))):
      state.checkpoints.save()
      progress.say(f"{stop_request.signal_name or 'a stop request'}: saved a checkpoint "
                   f"at step {step}; rerun the same command to resume")
      return "interrupted"
    if not config.steps_per_loop:
      steps_per_loop = _auto_steps_per_loop(num_steps, seconds, first=results.calls == 1)
  return "completed"


def _auto_steps_per_loop(num_steps, seconds, *, first):
  if first:
    return 10  # The first call traced; measure a short untraced one next.
  return max(1, min(_AUTO_MAX_STEPS, int(num_steps * _AUTO_TARGET_SECONDS / seconds)))


def _roll_back(state, progress, step):
  """Restores the last checkpoint and halves the learning rate; returns an iterator."""
  restored = state.checkpoints.restore_latest()
  if restored is None:
    raise ModelDirError("--on_nan=rollback: no checkpoint to roll back to")
  learning_rate = state.optimizer.learning_rate
  learning_rate.assign(learning_rate * 0.5)
  progress.say(f"non-finite loss at step {step}: rolled back to step {restored}, "
               f"learning rate halved to {float(learning_rate.numpy()):g}")
  return _train_iterator(state)


def _evaluate(state, results, summaries, progress):
  metrics = evaluate_once(state)
  results.record_eval(state.step, metrics)
  summaries.scalars("eval", state.step, {"loss": metrics["loss"],
                                         "accuracy": metrics["accuracy"]})
  progress.report_eval(state.step, loss=metrics["loss"], accuracy=metrics["accuracy"],
                       examples=metrics["examples"])
