"""Evaluation over the whole eval split, each example counted exactly once."""

import os

import tensorflow as tf

from trainer import config as config_lib
from trainer import data
from trainer.errors import ModelDirError
from trainer.outputs import run_dir
from trainer.outputs.progress import format_metrics
from trainer.outputs.summaries import Summaries
from trainer.tasks import Task
from trainer.training.setup import resolve_task, setup
from trainer.training.state import RunState, build_state
from trainer.training.steps import call_checked


def evaluate_once(state: RunState) -> dict:
  """Runs the padded eval split through the eval loop.

  Returns:
    {"loss", each task metric (after `Task.finalize_metrics`), "examples"}:
    weighted means over the real examples, and their count, which equals the
    split's size on any replica count.

  Raises:
    ReplicaBatchError: a replica did not get exactly one full batch per eval step.
  """
  dataset, num_batches = data.eval_input(
      state.strategy, state.eval_data, global_batch_size=state.global_batch_size,
      preprocess=state.task.preprocess)
  iterator = iter(dataset)
  with state.evaluated_weights():  # The moving averages, with --ema_decay.
    call_checked(state.eval_loop, iterator, tf.constant(num_batches),
                 explain_input_error=lambda e: data.input_error(
                     state.strategy, state.eval_data, e, split="eval",
                     step=state.step))
  state.eval_ledger.check(expected_batches=num_batches,
                          per_replica_batch_size=state.per_replica_batch_size)
  totals = state.eval_totals.read()
  examples = totals.pop("examples")
  means = state.task.finalize_metrics({k: v / examples for k, v in totals.items()})
  return dict(means, examples=int(round(examples)))


_DEVICE_FIELDS = ("cpu_devices", "gpus", "strategy", "cluster_resolver",
                  "cross_device_ops", "memory_growth", "intra_op_threads",
                  "inter_op_threads", "summaries")


def evaluate_checkpoint(config: config_lib.Config, task: Task = None) -> dict:
  """--mode=eval: evaluates the latest checkpoint of --model_dir.

  The task, model, data and batch flags come from the run's flags.txt; the device
  flags from this invocation. Writes eval scalars at the checkpoint's step and
  MODEL_DIR/eval_results.json; never takes the training lock, so it can watch a
  live run.

  Args:
    config: this invocation's config (model_dir and device flags).
    task: the run's task instance (a Python caller's); default: built from
      flags.txt.

  Raises:
    ModelDirError: model_dir holds no trainer run or no checkpoint.
  """
  from trainer import tasks  # pylint: disable=g-import-not-at-top
  flags_path = os.path.join(config.model_dir, run_dir.FLAGS_FILE)
  if not os.path.isfile(flags_path):
    raise ModelDirError(f"--model_dir={config.model_dir}: no {run_dir.FLAGS_FILE}, "
                        "not a trainer run")
  run_dir.check_writable_target(config.model_dir, flag="--model_dir")
  saved = config_lib.load_flagfile(flags_path)
  config = saved.replace(mode="eval", model_dir=config.model_dir,
                         **{name: getattr(config, name) for name in _DEVICE_FIELDS})
  if task is None:
    task = tasks.build_task(config.task, config.task_kwargs)
  else:
    config, task = resolve_task(config, task)
  found = setup(config, task)
  state = build_state(config, task, found.strategy, train_data=found.train_data,
                      prepared=found.prepared,
                      eval_data=found.eval_data, is_chief=found.is_chief,
                      read_only=True)
  step = state.restore_checkpoint()
  if step is None:
    raise ModelDirError(f"--model_dir={config.model_dir}: no checkpoint to evaluate")
  metrics = evaluate_once(state)
  results = {"status": "evaluated", "global_step": step, "eval": metrics}
  if found.is_chief:
    summaries = Summaries(config.model_dir, enabled=config.summaries)
    summaries.scalars("eval", step, scalars(metrics))
    summaries.close()
    run_dir.write_json(os.path.join(config.model_dir, "eval_results.json"), results)
  print(f"eval of step {step}: {format_metrics(metrics)}  ({metrics['examples']} "
        "examples)", flush=True)
  state.checkpoints.close()
  return results



def scalars(metrics: dict) -> dict:
  """An evaluation's metrics as summary scalars (without the example count)."""
  return {name: value for name, value in metrics.items() if name != "examples"}
