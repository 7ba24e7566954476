"""The run record: what a checkpoint carries besides the weights, so that a resume
continues the run rather than starting a new one (its ledger, best evaluation,
learning rate, and what it trained on: layout, batch, data). Stored as JSON in
a string variable of the checkpoint; the keys are those of earlier versions, so
their checkpoints still resume.
"""

import dataclasses
import json
from typing import Optional

import tensorflow as tf


@dataclasses.dataclass
class RunRecord:
  """The run's own numbers, as of a checkpoint.

  Attributes:
    ledger_batches: batches each replica received, over the run.
    ledger_examples: examples each replica received, over the run.
    ledger_history: the ledgers of earlier replica counts (elastic resumes).
    base_learning_rate: the optimizer's rate as the flags built it.
    data: what the training data is (TaskData.identity and Task.prepare's).
    layout: the flags that fix the model and batch layout ({name: value}).
    flags: every flag of the run (flags.txt's lines), should that file be lost.
    global_batch_size: examples per step over every replica.
    num_replicas: replicas in sync when it was saved.
    num_workers: workers when it was saved.
    input_shards: the input shards per-pipeline data is ordered over
      (data.Order.input_shards; None for other data).
    input_pipelines: what checkpoints of earlier versions recorded instead: the
      input pipelines their order was defined over (read, never written).
    best_eval: the best evaluation so far (by --best_metric), with its step.
    patience_reference: --best_metric's value that later ones must beat.
    evals_without_improvement: evaluations since it was last beaten.
    lr_plateau_factor: what --reduce_lr_patience has multiplied the learning rate
      by so far.
  """
  ledger_batches: Optional[list] = None
  ledger_examples: Optional[list] = None
  ledger_history: list = dataclasses.field(default_factory=list)
  base_learning_rate: Optional[float] = None
  data: Optional[dict] = None
  layout: Optional[dict] = None
  flags: Optional[list] = None
  global_batch_size: Optional[int] = None
  num_replicas: Optional[int] = None
  num_workers: Optional[int] = None
  input_shards: Optional[int] = None
  input_pipelines: Optional[int] = None
  best_eval: Optional[dict] = None
  patience_reference: Optional[float] = None
  evals_without_improvement: int = 0
  lr_plateau_factor: float = 1.0

  def ordered_shards(self) -> Optional[int]:
    """The input shards the run's per-pipeline data was ordered over: its
    input_shards, or in a checkpoint of an earlier version its input pipelines
    (before those were recorded: one per worker); None where nothing says."""
    return self.input_shards or self.input_pipelines or self.num_workers

  def to_json(self) -> str:
    return json.dumps({k: v for k, v in dataclasses.asdict(self).items()
                       if v is not None}, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "RunRecord":
    """The record in `text`; an empty one when it is empty or unreadable."""
    try:
      values = json.loads(text or "{}")
    except ValueError:
      values = {}
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in (values if isinstance(values, dict) else {}).items()
                  if k in names})


class RecordVariable:
  """The checkpoint's copy of a RunRecord: JSON in a string variable."""

  def __init__(self):
    # Outside any strategy scope: a string variable cannot be mirrored to a GPU.
    self.variable = tf.Variable("{}", dtype=tf.string, trainable=False,
                                name="run_record")

  def read(self) -> RunRecord:
    return RunRecord.from_json(self.variable.numpy().decode())

  def write(self, record: RunRecord):
    self.variable.assign(record.to_json())
