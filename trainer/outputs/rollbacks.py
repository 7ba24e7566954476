"""rollbacks.json: how many times --on_nan=rollback restored the last checkpoint
and the learning-rate multiplier it left (each rollback halves it).

The file outlives the checkpoints it rolled back to, so a restarted run, and the
replay of one of its steps, train at the rate the run had reached.
"""

import os

from trainer.outputs import run_dir

ROLLBACKS_FILE = "rollbacks.json"


def saved(model_dir: str) -> tuple:
  """(rollbacks so far, learning-rate multiplier) of a run, from its
  rollbacks.json; (0, 1.0) when it has none or it is unreadable."""
  record = run_dir.read_json(os.path.join(model_dir, ROLLBACKS_FILE))
  record = record if isinstance(record, dict) else {}
  return (_count(record.get("rollbacks"), int, 0),
          _count(record.get("lr_multiplier"), float, 1.0))


def save(model_dir: str, *, rollbacks: int, multiplier: float, step: int):
  """Records a rollback (atomically).

  Args:
    model_dir: the run directory.
    rollbacks: the run's rollbacks, this one included.
    multiplier: the learning-rate multiplier they leave.
    step: the step of the checkpoint this rollback restored.
  """
  run_dir.write_json(os.path.join(model_dir, ROLLBACKS_FILE),
                     {"rollbacks": rollbacks, "lr_multiplier": multiplier,
                      "step": step})


def _count(value, kind, default):
  return kind(value) if isinstance(value, (int, float)) and value >= 0 else default
