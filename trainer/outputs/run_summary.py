"""A run's summary in a few lines, from its results.json and event files (every
point, none sampled away): what TensorBoard would show, in numbers, over ssh."""

import math
import os

from trainer import tf_loader
from trainer.outputs import run_dir
from trainer.outputs.progress import format_metrics

SPLITS = ("train", "eval")


def read_scalars(directory: str) -> dict:
  """{tag: [(step, value), ...]} of the scalar event files in `directory`."""
  tf_loader.load_tensorflow()  # TensorBoard's readers load TensorFlow if present.
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.util import tensor_util
  accumulator = event_accumulator.EventAccumulator(
      directory, size_guidance={event_accumulator.TENSORS: 0,
                                event_accumulator.SCALARS: 0})
  accumulator.Reload()
  scalars = {}
  for tag in accumulator.Tags()[event_accumulator.TENSORS]:
    points = [(e.step, tensor_util.make_ndarray(e.tensor_proto))
              for e in accumulator.Tensors(tag)]
    if points and points[0][1].shape == () and points[0][1].dtype.kind == "f":
      scalars[tag] = [(step, float(value)) for step, value in points]
  return scalars


def is_run(path: str) -> bool:
  return (os.path.isfile(os.path.join(path, run_dir.RESULTS_FILE)) or
          os.path.isdir(os.path.join(path, "train")))


def as_object(value) -> dict:
  """`value` if it is a JSON object, else {} (a hand-edited or foreign file)."""
  return value if isinstance(value, dict) else {}


def as_number(value):
  """`value` if it is a number, else None."""
  return value if isinstance(value, (int, float)) and not isinstance(value,
                                                                      bool) else None


def run_summary(path: str) -> str:
  """A few lines on one run: status, metrics, ledger and every scalar's last value."""
  results = as_object(run_dir.read_json(os.path.join(path, run_dir.RESULTS_FILE)))
  lines = []
  if results:
    speed = as_number(results.get("examples_per_second"))
    lines.append(
        f"run {path}: {results.get('status')} at step {results.get('global_step')}/"
        f"{results.get('train_steps')}, {results.get('num_replicas')} replica(s) x "
        f"{results.get('per_replica_batch_size')} = global batch "
        f"{results.get('global_batch_size')}"
        + (f", {speed:,.0f} examples/s" if speed else ""))
    for split in SPLITS:
      values = as_object(results.get(split))
      if values:
        numbers = {k: v for k, v in values.items()
                   if k != "step" and as_number(v) is not None}
        extra = (f", {numbers['examples']} examples" if "examples" in numbers
                 else "")
        lines.append(f"  {split:<5} {format_metrics(numbers)}  (step "
                     f"{values.get('step')}{extra})")
    metric = results.get("best_metric")
    metric = metric if isinstance(metric, str) else "eval/loss"
    best = as_object(results.get("best_eval"))
    value = as_number(best.get(metric.split("/", 1)[-1]))
    if value is not None:
      lines.append(f"  best {metric} {value:.4f} at step {best.get('step')}")
    ledger = as_object(results.get("replica_batches"))
    if ledger:
      lines.append("  ledger (batches per replica): " +
                   ", ".join(f"{k} {v}" for k, v in sorted(ledger.items())))
  else:
    lines.append(f"run {path}: no readable results.json yet (running, or stopped "
                 "before its first loop call ended)")
  lines.append("  scalars:")
  for split in SPLITS:
    directory = os.path.join(path, split)
    if not os.path.isdir(directory):
      continue
    for tag, points in sorted(read_scalars(directory).items()):
      values = [v for _, v in points]
      finite = [v for v in values if math.isfinite(v)]
      lines.append(f"    {split + '/' + tag:<34} {len(points):>5} points, steps "
                   f"{points[0][0]}..{points[-1][0]}, last {values[-1]:.6g}"
                   + (f", min {min(finite):.6g}, max {max(finite):.6g}" if finite
                      else ""))
  return "\n".join(lines)
