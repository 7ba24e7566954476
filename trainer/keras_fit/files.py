"""The files Keras callbacks write at epoch ends, written by the chief alone from
the run's History: CSVLogger's rows and ModelCheckpoint's model or weights.

Both read the History that the checkpoint keeps, so a resumed run writes what
an uninterrupted one would: CSVLogger(append=False) rewrites every epoch's row
once, and ModelCheckpoint(save_best_only=True) compares with the best of every
epoch recorded, as Keras's callback does with the best it has seen.
"""

import csv
import io
import os


from trainer.keras_fit.history import epoch_logs
from trainer.outputs.results import improves


def write_csv(logger, state: dict, epoch: int):
  """Writes CSVLogger `logger`'s file after `epoch`: Keras's columns ("epoch",
  then the first epoch's keys, sorted), one row per epoch.

  append=False: the whole file from the History (every epoch once, a resumed
  run's too); append=True: this epoch's row added, as Keras does.
  """
  rows = epoch_logs(state)
  keys = sorted(rows[0][1]) if rows else []
  if keys and not any(key.startswith("val_") for key in keys):
    keys += [f"val_{key}" for key in keys]  # As Keras: room for later ones.
  if logger.append:
    rows = [(e, logs) for e, logs in rows if e == epoch]
    header = not (os.path.exists(logger.filename) and
                  os.path.getsize(logger.filename))
    mode = "a"
  else:
    header, mode = True, "w"
  out = io.StringIO()

  class Dialect(csv.excel):
    delimiter = logger.sep

  writer = csv.DictWriter(out, fieldnames=["epoch", *keys], dialect=Dialect)
  if header:
    writer.writeheader()
  for e, logs in rows:
    writer.writerow({"epoch": e, **{key: logs.get(key, "NA") for key in keys}})
  directory = os.path.dirname(logger.filename)
  if directory:
    os.makedirs(directory, exist_ok=True)
  with open(logger.filename, mode, newline="") as f:
    f.write(out.getvalue())


def improved(checkpoint, state: dict, epoch: int, *, goal: str) -> tuple:
  """(whether `epoch`'s monitored value improves on every earlier epoch's (and
  initial_value_threshold) by more than min_delta, as Keras's ModelCheckpoint
  decides, the previous best or None)."""
  best = checkpoint.best  # initial_value_threshold, or None.
  current = None
  for e, logs in epoch_logs(state):
    value = logs.get(checkpoint.monitor)
    if value is None or e > epoch:
      continue
    if e == epoch:
      current = value
    elif improves(value, best, goal, checkpoint.min_delta):
      best = value
  if current is None:
    return False, best
  return improves(current, best, goal, checkpoint.min_delta), best


def save_checkpoint(checkpoint, model, state: dict, epoch: int, *, goal: str,
                    say=print):
  """ModelCheckpoint `checkpoint` after `epoch`: saves the model (or its
  weights) to its filepath, formatted with the epoch and the logs; with
  save_best_only, only when its monitor improved."""
  logs = dict(epoch_logs(state))[epoch]
  path = checkpoint.filepath.format(epoch=epoch + 1, **logs)
  if checkpoint.save_best_only:
    better, best = improved(checkpoint, state, epoch, goal=goal)
    if not better:
      if checkpoint.verbose > 0:
        say(f"Epoch {epoch + 1}: {checkpoint.monitor} did not improve from "
            f"{_number(best)}")
      return
    if checkpoint.verbose > 0:
      say(f"Epoch {epoch + 1}: {checkpoint.monitor} improved from "
          f"{_number(best)} to {_number(logs[checkpoint.monitor])}, saving model "
          f"to {path}")
  elif checkpoint.verbose > 0:
    say(f"Epoch {epoch + 1}: saving model to {path}")
  directory = os.path.dirname(path)
  if directory:
    os.makedirs(directory, exist_ok=True)
  if checkpoint.save_weights_only:
    model.save_weights(path)
  else:
    model.save(path)


def _number(value) -> str:
  return "inf" if value is None else f"{value:.5f}"


def epoch_line(epoch: int, epochs: int, logs: dict) -> str:
  """Keras's verbose=2 line of an epoch's logs."""
  values = " - ".join(f"{key}: {_short(value)}" for key, value in sorted(
      logs.items()))
  return f"Epoch {epoch + 1}/{epochs} - {values}"


def _short(value: float) -> str:
  value = float(value)
  return f"{value:.4f}" if value == 0 or abs(value) >= 1e-3 else f"{value:.4e}"
