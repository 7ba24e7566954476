"""Evaluation over the whole test split, each example counted exactly once."""

import os

import tensorflow as tf

from trainer import config as config_lib
from trainer import data, run_dir
from trainer.errors import ModelDirError
from trainer.state import RunState, build_state
from trainer.steps import replica_batch_error
from trainer.summaries import Summaries


def evaluate_once(state: RunState) -> dict:
  """Runs the padded test split through the eval loop.

  Returns:
    {"loss", "accuracy", "examples"}: weighted means over the real examples, and
    their count, which equals the test split's size on any replica count.

  Raises:
    ReplicaBatchError: a replica did not get exactly one full batch per eval step.
  """
  dataset, num_batches = data.eval_dataset(state.source,
                                           global_batch_size=state.global_batch_size)
  iterator = iter(data.distribute(state.strategy, dataset))
  try:
    state.eval_loop(iterator, tf.constant(num_batches))
  except tf.errors.InvalidArgumentError as e:
    raise replica_batch_error(e) or e
  state.eval_ledger.check(expected_batches=num_batches,
                          per_replica_batch_size=state.config.per_replica_batch_size)
  totals = state.eval_totals.read()
  examples = totals["examples"]
  return {"loss": totals["loss"] / examples, "accuracy": totals["correct"] / examples,
          "examples": int(round(examples))}


_DEVICE_FIELDS = ("cpu_devices", "gpus", "strategy", "cluster_resolver",
                  "cross_device_ops", "memory_growth", "intra_op_threads",
                  "inter_op_threads", "summaries")


def evaluate_checkpoint(config: config_lib.Config) -> dict:
  """--mode=eval: evaluates the latest checkpoint of --model_dir.

  The model, data and batch flags come from the run's flags.txt; the device flags
  from this invocation. Writes eval scalars at the checkpoint's step and
  MODEL_DIR/eval_results.json; never takes the training lock, so it can watch a
  live run.

  Raises:
    ModelDirError: model_dir holds no trainer run or no checkpoint.
  """
  from trainer.loop import setup  # Shared with training; imported late (cycle).
  flags_path = os.path.join(config.model_dir, run_dir.FLAGS_FILE)
  if not os.path.isfile(flags_path):
    raise ModelDirError(f"--model_dir={config.model_dir}: no {run_dir.FLAGS_FILE}, "
                        "not a trainer run")
  saved = config_lib.load_flagfile(flags_path)
  config = saved.replace(mode="eval", model_dir=config.model_dir,
                         **{name: getattr(config, name) for name in _DEVICE_FIELDS})
  strategy, is_chief, source = setup(config)
  state = build_state(config, strategy, source, is_chief=is_chief)
  step = state.checkpoints.restore_latest()
  if step is None:
    raise ModelDirError(f"--model_dir={config.model_dir}: no checkpoint to evaluate")
  metrics = evaluate_once(state)
  results = {"status": "evaluated", "global_step": step, "eval": metrics}
  if is_chief:
    summaries = Summaries(config.model_dir, enabled=config.summaries)
    summaries.scalars("eval", step, {"loss": metrics["loss"],
                                     "accuracy": metrics["accuracy"]})
    summaries.close()
    run_dir.write_json(os.path.join(config.model_dir, "eval_results.json"), results)
  print(f"eval of step {step}: loss {metrics['loss']:.4f}  accuracy "
        f"{metrics['accuracy']:.4f}  ({metrics['examples']} examples)", flush=True)
  state.checkpoints.close()
  return results
