"""This process's place in the run: computed once from the strategy.

Every other module asks a `Cluster` (whether it is the chief, its name, how many
workers and input pipelines there are and which one is its own) instead of
reading the strategy's cluster resolver, or its private attributes, itself.
"""

import dataclasses
import os
from typing import Optional

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Cluster:
  """Where this process stands in a run.

  Attributes:
    is_chief: whether it writes the run's files (summaries, results, the real
      checkpoints, the export); always, outside a multi-worker cluster.
    worker: its name, e.g. "worker-1" ("worker-0" outside a cluster).
    num_workers: the processes training together.
    num_pipelines: the input pipelines (one per worker under multi-worker).
    pipeline_id: this worker's input pipeline (its input context's id).
    num_replicas: replicas in sync over every worker.
    devices: the devices this worker's replicas run on.
  """
  is_chief: bool = True
  worker: str = "worker-0"
  num_workers: int = 1
  num_pipelines: int = 1
  pipeline_id: int = 0
  num_replicas: int = 1
  devices: tuple = ()

  @property
  def local_replicas(self) -> int:
    """Replicas of this worker (of its input pipeline)."""
    return self.num_replicas // self.num_pipelines

  def scratch_dir(self, checkpoint_dir: str) -> Optional[str]:
    """Where a non-chief worker saves its (collective) checkpoints: a hidden folder
    under the run's checkpoints, so a killed worker's leftovers are found and
    removed next time; None on the chief."""
    return None if self.is_chief else os.path.join(checkpoint_dir, f".{self.worker}")


def cluster_of(strategy: tf.distribute.Strategy) -> Cluster:
  """The Cluster of this process under `strategy`."""
  replicas = strategy.num_replicas_in_sync
  devices = tuple(strategy.extended.worker_devices)
  resolver = getattr(strategy, "cluster_resolver", None)
  spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
  if not spec:
    return Cluster(num_replicas=replicas, devices=devices)
  task_type, task_id = resolver.task_type, resolver.task_id
  is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0 and
                                      "chief" not in spec)
  # The strategy's own count and id: the input context's, with the chief (if the
  # cluster names one) as pipeline 0. Public nowhere else.
  extended = strategy.extended
  num_workers = int(getattr(extended, "_num_workers", 1))
  pipeline_id = int(getattr(extended, "_id_in_cluster", 0))
  multi = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
  return Cluster(is_chief=is_chief, worker=f"{task_type}-{task_id}",
                 num_workers=num_workers,
                 num_pipelines=num_workers if multi else 1,
                 pipeline_id=pipeline_id if multi else 0, num_replicas=replicas,
                 devices=devices)
