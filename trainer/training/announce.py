"""What a run says as it starts (where it is, on what, and what it ignores) and
as it ends (what it reached, where it is, how to look further)."""

import math
import os
from typing import Optional

from trainer.outputs.progress import format_metrics
from trainer.training import optimizers
from trainer.training.record import RunRecord


def start_line(*, model_dir: str, task: str, trainer, restored, previous: RunRecord,
               multiplier: float, rollbacks: int) -> str:
  """`model_dir D: task T, starting at step 0, 2 replica(s) x 32 examples = global
  batch 64`, or the resume's version, with the learning rate when it changed."""
  elastic = restored is not None and elastic_line(trainer, previous)
  line = (f"model_dir {model_dir}: task {task}, "
          + (f"at step {restored}, {elastic}" if elastic else
             f"resuming at step {restored}, " if restored is not None
             else "starting at step 0, ")
          + ("" if elastic else
             f"{trainer.num_replicas} replica(s) x {trainer.per_replica_batch_size} "
             f"examples = global batch {trainer.global_batch_size}"))
  rate, was = trainer.base_learning_rate, previous.base_learning_rate
  if restored is not None and rate is not None and was is not None and was != rate:
    line += f", learning rate {rate:g} (was {was:g})"
  if multiplier != 1.0 and rate is not None:
    line += f", learning rate x{multiplier:g} after {rollbacks} rollback(s)"
  if trainer.task_optimizer:
    line += f", {optimizers.describe_task_optimizer(trainer.optimizer)}"
  if trainer.averaged_statistics and trainer.num_replicas > 1:
    line += (", BatchNormalization on each replica's own batch "
             "(--sync_batchnorm=false: not one device's)")
  return line


def elastic_line(trainer, previous: RunRecord):
  """"resuming on 4 replicas (was 2), global batch 64 unchanged" after an elastic
  resume; None when the replicas and workers are those of the run."""
  was = (previous.num_replicas, previous.num_workers or 1)
  now = (trainer.num_replicas, trainer.cluster.num_workers)
  if was[0] is None or was == now:
    return None

  def where(replicas, workers):
    return f"{replicas} replicas" + (f" on {workers} workers" if workers > 1 else "")

  before = was[0] if was[1] == now[1] else where(*was)  # "(was 2)" if only replicas.
  return (f"resuming on {where(*now)} (was {before}), global batch "
          f"{trainer.global_batch_size} unchanged ({trainer.per_replica_batch_size} "
          "per replica)")


def notes(config, *, built, restored, previous: RunRecord) -> list:
  """The lines on what this invocation reads or ignores: every worker's input line
  first, then the chief's notes."""
  cluster = built.cluster
  lines = []
  if restored is not None and built.train_data.per_pipeline:
    note = data_order_note(previous, built.trainer.order, cluster.num_pipelines)
    lines += [note] if note else []
  if config.init_checkpoint and restored is not None:
    lines.append(f"note: --init_checkpoint={config.init_checkpoint} is not used: the "
                 "run resumes from its own checkpoint")
  if config.strategy == "multi_worker" and config.cpu_devices > 1 and not any(
      "GPU" in d.upper() for d in cluster.devices):
    lines.append(f"note: --cpu_devices={config.cpu_devices} is ignored with "
                 "--strategy=multi_worker on CPUs: each worker runs one replica")
  if config.reduce_lr_patience and built.trainer.base_learning_rate is None:
    lines.append(f"note: --reduce_lr_patience={config.reduce_lr_patience} is "
                 "ignored: the task's optimizer has its own learning-rate schedule")
  for layer in built.trainer.own_moments_layers:
    lines.append(f"note: layer {layer.name!r} ({type(layer).__name__}) computes "
                 "its own _moments: left as written, on each replica's own batch "
                 "(its moving statistics are averaged over the replicas)")
  if config.eval_every and config.mode == "train":
    lines.append(f"note: --eval_every={config.eval_every} is ignored with "
                 "--mode=train" + (": use --mode=train_and_eval to evaluate"
                                   if built.eval_data is not None else
                                   f" (task {config.task} has no eval data)"))
  return lines


def data_order_note(previous: RunRecord, order, pipelines: int) -> Optional[str]:
  """The line saying that a resume of per-pipeline data reads other examples than
  an uninterrupted run would, or None: on a worker count that cannot share the
  run's input shards (the run then picked others: `order`'s), or from a
  checkpoint of an earlier version, whose pipelines each had what the shards now
  share."""
  was, now = previous.ordered_shards(), order.input_shards
  if was and was != now:
    return (f"note: the run's data is ordered over {was} input shards, which "
            f"{pipelines} worker(s) cannot share evenly; from here on it is ordered "
            f"over {now}, so the examples are not those an uninterrupted run would "
            "have read")
  if previous.input_shards is None and (was or 1) > 1:
    return (f"note: the checkpoint is of an earlier version, whose {was} input "
            "pipelines each had the whole shuffle buffer and block of files; this "
            "version shares them among its input shards, so the examples from here "
            "on are not those the earlier version would have read")
  return None


def closing_lines(data: dict, *, model_dir: str, best_metric: str) -> list:
  """The run's last lines, from its results: its status and final (and best)
  metrics, its absolute directory, and the commands that show more.

  Example:
    completed at step 300: eval loss 0.2131  accuracy 0.9388 (best accuracy
      0.9444 at step 250)
    run directory: /home/me/trainer/runs/q1
    look further: tensorboard --logdir /home/me/trainer/runs/q1, or python -m
      trainer.inspect /home/me/trainer/runs/q1
    the model: trainer.load("/home/me/trainer/runs/q1") in Python, or the
      SavedModel in /home/me/trainer/runs/q1/export
  """
  where = os.path.abspath(model_dir)
  split = "eval" if data.get("eval") else "train"
  measured = {k: v for k, v in (data.get(split) or {}).items() if k != "step"}
  line = f"{data['status']} at step {data['global_step']}"
  if measured:
    line += f": {split} {format_metrics(measured)}"
    at = (data.get(split) or {}).get("step")
    if split == "eval" and at is not None and at != data["global_step"]:
      line += f" (evaluated at step {at})"  # E.g. interrupted after it.
  not_numbers = [k for k, v in measured.items()
                 if isinstance(v, float) and not math.isfinite(v)]
  if not_numbers:
    line += (f" ({', '.join(not_numbers)} {'was' if len(not_numbers) == 1 else 'were'}"
             " not a number: null in results.json)")
  best, name = data.get("best_eval"), best_metric.split("/", 1)[-1]
  if best and name in best and best.get("step") != data["global_step"]:
    line += f" (best {name} {best[name]:.4f} at step {best['step']})"
  export = data.get("export_dir")
  return [line, f"run directory: {where}",
          f"look further: tensorboard --logdir {where}, or python -m "
          f"trainer.inspect {where}",
          f"the model: trainer.load({where!r}) in Python"
          + (f", or the SavedModel in {os.path.abspath(export)}" if export else "")]
