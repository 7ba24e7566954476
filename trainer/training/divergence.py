"""Divergence you can replay: the step, the examples and the variable that went
non-finite.

A loop call only says that one of its K steps went non-finite. When a run
diverges with --on_nan=stop, `find_divergence` restores the last good checkpoint
and replays the steps after it one at a time with the trainer's `diagnose_step`
(the step the train loop runs, returning its gradients) until the first
non-finite one; the chief writes its report to MODEL_DIR/divergence.json.
`replay_to` does the same for any step of a run opened read-only (`python -m
trainer.replay`), so the bad batch and layer can be looked at again; under
--deterministic it prints the same numbers, bit for bit.

The examples of a step are a pure function of (seed, step) for array data: the
report lists their indices in the training set. Streamed data's report gives the
step's positions in its (seeded) stream instead.
"""

import math
import os

import numpy as np
import tensorflow as tf

from trainer.errors import ModelDirError
from trainer.outputs import rollbacks, run_dir
from trainer.outputs.run_dir import DIVERGENCE_FILE
from trainer.training import graph_passes
from trainer.training.checkpoint_files import (CHECKPOINT_SUBDIR, checkpoint_steps,
                                               path_of)

def _number(value):
  """A float for JSON: finite ones as they are, others as "nan", "inf", "-inf"."""
  value = float(value)
  return value if math.isfinite(value) else str(value)


def _finite(outputs) -> bool:
  return bool(np.isfinite(outputs["loss"]) and np.isfinite(outputs["gradient_norm"]))


def variable_names(trainer) -> list:
  return [getattr(v, "path", v.name) for v in trainer.model.trainable_variables]


def _report(trainer, train_data, *, model_dir: str, step: int,
            checkpoint_step: int, outputs) -> dict:
  names = variable_names(trainer)
  norms = [float(n) for n in outputs["gradient_norms"]]
  first_bad = next((name for name, finite in zip(names, outputs["gradients_finite"])
                    if not finite), None)
  return {
      "step": step,
      "finite": _finite(outputs),
      "checkpoint": os.path.basename(path_of("", checkpoint_step)),
      "checkpoint_step": checkpoint_step,
      "loss": _number(outputs["loss"]),
      "gradient_norm": _number(outputs["gradient_norm"]),
      # The first variable (in the model's order) with an inf or NaN gradient;
      # None when only the global norm overflowed (then see the largest norms).
      "first_nonfinite_gradient": first_bad,
      # Pairs, in the model's order (a JSON object's keys may be sorted).
      "gradient_norms": [[name, _number(n)] for name, n in zip(names, norms)],
      "examples": train_data.step_examples(
          trainer.order, first_step=(step - 1) * trainer.accum_steps,
          steps=trainer.accum_steps),
      "replay": f"python -m trainer.replay --model_dir={model_dir} --step={step}",
  }


def replay_to(trainer, train_data, checkpoints, *, model_dir: str, step: int,
              stop_at_nonfinite: bool, on_step=None, rollback_multiplier=None):
  """Restores the newest checkpoint before `step` and replays up to it.

  Args:
    trainer: the run's trainer (its weights are replaced).
    train_data: its training data.
    checkpoints: its Checkpoints.
    model_dir: the run directory (named in the report's replay command).
    step: the step to report (the update to global step `step`).
    stop_at_nonfinite: report the first non-finite step before `step` instead.
    on_step: called with no arguments after each replayed step, or None.
    rollback_multiplier: where given (a replay in a new process), the rate is set
      to the flag's times it times the restored checkpoint's plateau factor;
      else (inside the run) the rate is the one the run trains at.

  Returns:
    (the report dict, the outputs of the reported step: gradients included).

  Raises:
    ModelDirError: there is no checkpoint before `step`.
  """
  checkpoint_step = checkpoints.restore(before=step)
  if checkpoint_step is None:
    raise ModelDirError(f"--model_dir={model_dir}: no checkpoint before step {step} "
                        "to replay from")
  if rollback_multiplier is not None and trainer.base_learning_rate is not None:
    # A plateau's reduction is checkpointed where it happens (ReduceOnPlateau),
    # so the restored factor holds up to `step`.
    trainer.set_peak_rate(trainer.base_learning_rate * rollback_multiplier *
                          checkpoints.record.lr_plateau_factor)
  iterator = trainer.train_iterator(train_data)
  for current in range(checkpoint_step + 1, step + 1):
    # Compiled as the train loop is, so that it runs the graph training ran.
    with graph_passes.applied(trainer.lean_graph_passes):
      diagnosed = trainer.diagnose_step(trainer.loop_input(iterator, 1))
    outputs = {k: (v.numpy() if hasattr(v, "numpy") else [t.numpy() for t in v])
               for k, v in diagnosed.items()}
    if on_step is not None:
      on_step()
    if current == step or (stop_at_nonfinite and not _finite(outputs)):
      return _report(trainer, train_data, model_dir=model_dir, step=current,
                     checkpoint_step=checkpoint_step, outputs=outputs), outputs
  raise AssertionError("unreachable: the loop returns at `step`")


def find_divergence(trainer, train_data, checkpoints, *, model_dir: str, until: int,
                    on_step=None) -> dict:
  """The first non-finite step after the last checkpoint, up to `until`; written
  to MODEL_DIR/divergence.json by the chief. Every worker must call it (the
  replayed steps are collective). `on_step` is called after each replayed step."""
  report, _ = replay_to(trainer, train_data, checkpoints, model_dir=model_dir,
                        step=until, stop_at_nonfinite=True, on_step=on_step)
  if report["finite"]:
    report["note"] = (f"the replay from step {report['checkpoint_step']} to {until} "
                      "stayed finite: the divergence did not reproduce (rerun with "
                      "--deterministic)")
  if trainer.cluster.is_chief:
    run_dir.write_json(os.path.join(model_dir, DIVERGENCE_FILE), report)
  return report


def _exact(value) -> str:
  """A report number as text that reads back to the same float."""
  return repr(value) if isinstance(value, float) else str(value)


def format_report(report: dict) -> str:
  """The report as lines a person reads (floats exactly, with repr)."""
  lines = [f"step {report['step']} (replayed from {report['checkpoint']}):",
           f"  loss {_exact(report['loss'])}",
           f"  gradient norm {_exact(report['gradient_norm'])}",
           f"  first non-finite gradient: {report['first_nonfinite_gradient']}"]
  lines += [f"  gradient norm of {name}: {_exact(value)}"
            for name, value in report["gradient_norms"]]
  examples = report["examples"]
  if "indices" in examples:
    lines.append(f"  examples (training-set indices): "
                 f"{', '.join(map(str, examples['indices']))}")
  else:
    start, end = examples["stream_positions"]
    lines.append(f"  examples: positions {start} to {end - 1} of the shuffled stream")
  return "\n".join(lines)


def dump_step(trainer, train_data, *, step: int, outputs, path: str):
  """Writes step `step`'s batch (as stored, before Task.preprocess), its example
  indices and its all-reduced gradients (dense) to an .npz file."""
  batches = train_data.host_batches(
      trainer.order, num_replicas=trainer.num_replicas,
      start_step=(step - 1) * trainer.accum_steps, count=trainer.accum_steps)
  arrays = {}
  for name, part in (("features", 0), ("labels", 1)):
    nest = tf.nest.map_structure(lambda *t: np.concatenate([x.numpy() for x in t]),
                                 *[batch[part] for batch in batches])
    if isinstance(nest, dict):
      arrays.update({f"{name}/{key}": value for key, value in nest.items()})
    else:
      arrays.update({f"{name}/{i}": value
                     for i, value in enumerate(tf.nest.flatten(nest))}
                    if isinstance(nest, (tuple, list)) else {name: nest})
  examples = train_data.step_examples(
      trainer.order, first_step=(step - 1) * trainer.accum_steps,
      steps=trainer.accum_steps)
  if "indices" in examples:
    arrays["example_indices"] = np.array(examples["indices"], np.int64)
  for name, gradient in zip(variable_names(trainer), outputs["gradients"]):
    arrays[f"gradient/{name}"] = np.asarray(gradient)
  with open(path, "wb") as f:
    np.savez(f, **arrays)


def replay_run(model_dir: str, step: int, *, dump: str = None,
               cpu_devices: int = None) -> dict:
  """`python -m trainer.replay`: replays step `step` of the run in `model_dir`.

  The run's files are only read. A multi-worker run is replayed in this one
  process with the same global batch.

  Args:
    model_dir: the run directory.
    step: the step to replay (>= 1, at most the run's last).
    dump: an .npz path for the step's batch, example indices and gradients.
    cpu_devices: replicas to replay on (default: the run's --cpu_devices).

  Returns:
    The step's report (as in divergence.json).

  Raises:
    TrainerError: not a run, a step it never trained, no checkpoint before it, or
      per-worker input of several workers.
  """
  from trainer.training.open_run import open_run  # It builds on the trainer.
  results = run_dir.read_json(os.path.join(model_dir, run_dir.RESULTS_FILE))
  results = results if isinstance(results, dict) else {}
  steps = checkpoint_steps(os.path.join(model_dir, CHECKPOINT_SUBDIR))
  last = max([*steps, results.get("global_step") or 0])
  if steps and step > last:
    raise ModelDirError(f"--step={step}: the run in {model_dir} trained to step "
                        f"{last}; replay a step from 1 to {last}")
  changes = {"summaries": False, "strategy": "mirrored"}
  if isinstance(results.get("global_batch_size"), int):  # The run's batches, on
    changes.update(global_batch_size=results["global_batch_size"],  # any replicas.
                   per_replica_batch_size=None)
  if cpu_devices:
    changes["cpu_devices"] = cpu_devices
  built = open_run(model_dir, mode="train", **changes)
  trainer = built.trainer
  if built.train_data.per_pipeline and results.get("num_workers", 1) > 1:
    # Each worker read its own files: one process would read another batch.
    raise ModelDirError(
        f"--model_dir={model_dir}: its {results['num_workers']} workers each read "
        "their own files (per-worker input); one process cannot replay their "
        "steps: rerun the cluster from the checkpoint before the step instead")
  # The rate the run trained with after its last --on_nan=rollback (steps before
  # that rollback's checkpoint were trained at a higher one and discarded).
  _, multiplier = rollbacks.saved(model_dir)
  try:
    report, outputs = replay_to(trainer, built.train_data, built.checkpoints,
                                model_dir=model_dir, step=step,
                                stop_at_nonfinite=False,
                                rollback_multiplier=multiplier)
    if dump:
      dump_step(trainer, built.train_data, step=step, outputs=outputs, path=dump)
  finally:
    built.checkpoints.close()
  return report
