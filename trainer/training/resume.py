"""May this checkpoint be resumed by this run? The one answer.

A run may continue in a model_dir only as the same run: the same layout flags
(the model, the optimizer, the task and its layout hyperparameters), the same
global batch (the replica and worker counts may change: elastic resume), the same
training data (its shapes, size, files, and what Task.prepare made of it), and
weights of the same shapes. The newest checkpoint's run record says what the run
was; checkpoints of earlier versions, without a layout in their record, are
compared with the run's flags.txt and results.json. Every difference is listed in
one message.
"""

import dataclasses
import hashlib
import json
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from trainer.config import TASK_FLAG_ALIASES, read_flagfile
from trainer.errors import ModelDirError
from trainer.outputs import run_dir
from trainer.training import checkpoint_files
from trainer.training.checkpoints import weight_problems
from trainer.training.record import RunRecord


@dataclasses.dataclass(frozen=True)
class RunFacts:
  """What this invocation is: recorded in every checkpoint it writes.

  Attributes:
    layout: {flag: value} of the flags that fix the model and batch layout.
    flags: every flag of the run, as flags.txt lines.
    data: the training data's identity.
    global_batch_size: examples per step over every replica.
    per_replica_batch_size: examples per replica per step.
    num_replicas: replicas in sync.
    num_workers: processes training together.
    input_shards: the input shards its per-pipeline data is ordered over
      (data.Order.input_shards; 0 for other data).
  """
  layout: dict
  flags: tuple
  data: dict
  global_batch_size: int
  per_replica_batch_size: int
  num_replicas: int
  num_workers: int
  input_shards: int

  def record_into(self, record: RunRecord):
    """Writes these facts into a run record (saved with the next checkpoint)."""
    record.layout, record.data = dict(self.layout), dict(self.data)
    record.flags = list(self.flags)
    record.global_batch_size = self.global_batch_size
    record.num_replicas, record.num_workers = self.num_replicas, self.num_workers
    record.input_shards = self.input_shards or None
    record.input_pipelines = None  # Its earlier name: input_shards says it now.


def _newest_readable(directory: str) -> Optional[tuple]:
  """(path, record) of the newest checkpoint whose index and record can be read
  (an unreadable one is left for the restore to set aside), or None."""
  for step in reversed(checkpoint_files.checkpoint_steps(directory)):
    path = checkpoint_files.path_of(directory, step)
    try:
      return path, checkpoint_files.read_record(path)
    except (tf.errors.OpError, ValueError):
      continue
  return None


def differences(model_dir: str, facts: RunFacts, model) -> list:
  """How this run differs from the run whose newest checkpoint is in `model_dir`,
  one phrase per difference; empty when it may resume (or there is none)."""
  found = _newest_readable(os.path.join(model_dir,
                                        checkpoint_files.CHECKPOINT_SUBDIR))
  if found is None:
    return []
  path, record = found
  changes = _layout_changes(model_dir, facts, record)
  was = record.global_batch_size
  if was is None:  # A checkpoint of an earlier version: its results.json says.
    previous = run_dir.read_json(os.path.join(model_dir, run_dir.RESULTS_FILE))
    was = previous.get("global_batch_size") if isinstance(previous, dict) else None
  if was is not None and was != facts.global_batch_size:
    changes.append(f"global batch {facts.global_batch_size} ({facts.num_replicas} "
                   f"replica(s) x {facts.per_replica_batch_size}; the run has {was})")
  recorded, now = record.data, facts.data
  if recorded and recorded != now:
    changed = sorted(k for k in set(recorded) | set(now)
                     if recorded.get(k) != now.get(k))
    changes.append(f"trained on other data ({', '.join(changed)} differ: "
                   f"{recorded.get(changed[0])} then, {now.get(changed[0])} now)")
  try:
    changes += weight_problems(path, model)
  except tf.errors.OpError:
    pass  # The restore sets it aside as unreadable.
  return changes


def _layout_changes(model_dir: str, facts: RunFacts, record: RunRecord) -> list:
  """"--NAME=NEW (the run has OLD)" for each layout flag that changed, from the
  record (or, for a checkpoint without one, from flags.txt)."""
  recorded = record.layout
  if recorded is None:
    recorded = read_flagfile(os.path.join(model_dir, run_dir.FLAGS_FILE)) or {}
  return [f"--{_spelled(name)}={value} (the run has {recorded[name]})"
          for name, value in facts.layout.items()
          if name in recorded and recorded[name] != value]


def _spelled(name: str) -> str:
  """A layout flag as a user spells it: --model for --task.model."""
  short = name.removeprefix("task.")
  return short if short in TASK_FLAG_ALIASES else name


def check(model_dir: str, facts: RunFacts, model):
  """Refuses a checkpoint of another model, batch or data, listing every change.

  Raises:
    ModelDirError: quoting each change with the run's value, if there is any.
  """
  changes = differences(model_dir, facts, model)
  if changes:
    raise ModelDirError(
        f"--model_dir={model_dir} holds a checkpoint made with other flags or data: "
        f"{'; '.join(changes)}. Keep them (another replica count needs the same "
        "global batch, e.g. --global_batch_size) or use a new --model_dir")


def fingerprint(value) -> str:
  """A short digest of a JSON-like value (lists, dicts, numbers, strings, bytes,
  arrays and tensors inside), the same in every process that builds it."""

  def plain(item):
    if hasattr(item, "numpy"):
      item = item.numpy()
    if isinstance(item, np.ndarray):
      return item.tolist()
    if isinstance(item, bytes):
      return item.decode("utf-8", "backslashreplace")
    return repr(item)

  text = json.dumps(value, sort_keys=True, default=plain)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def data_identity(train_data, prepared) -> dict:
  """What the training data is: its features' specs, what the TaskData says
  (size, files) and what Task.prepare returned (a dict's entries one by one:
  strings as they are, other values by fingerprint)."""
  identity = {"features": str(train_data.feature_spec), **train_data.identity()}
  if isinstance(prepared, dict):
    identity.update({str(k): v if isinstance(v, str) else fingerprint(v)
                     for k, v in prepared.items()})
  elif prepared is not None:
    identity["prepared"] = fingerprint(prepared)
  return identity
