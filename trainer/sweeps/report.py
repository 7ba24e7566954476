"""What a sweep shows: the live table, results.csv/.md, the best trial, HParams
config."""

import csv
import io
import math
import os
import shlex

from trainer import tf_loader
from trainer.outputs import run_dir
from trainer.sweeps.spec import Param, flag_text

SPEED = "examples_per_second"
RESULTS_CSV = "results.csv"
RESULTS_MD = "results.md"


def _number(value) -> str:
  if value is None:
    return ""
  if isinstance(value, float):
    if not math.isfinite(value):
      return str(value)
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
  return str(value)


def ranked(runs: list, *, metric: str, goal: str) -> list:
  """Runs ordered best first by `metric`; those without it last, by name."""
  scored = [r for r in runs if isinstance(r.metrics.get(metric), (int, float))
            and math.isfinite(r.metrics[metric]) and r.status == "completed"]
  rest = sorted((r for r in runs if r not in scored), key=lambda r: r.name)
  return sorted(scored, key=lambda r: r.metrics[metric],
                reverse=goal == "max") + rest


def metric_names(runs: list, first=()) -> list:
  """The metrics any run reported: `first`, then eval/*, train/* (loss first in
  each), then examples_per_second."""
  seen = {name for run in runs for name in run.metrics if "/" in name}
  ordered = list(first)
  for split in ("eval", "train"):
    names = sorted((n for n in seen if n.startswith(split + "/")),
                   key=lambda n: (n != f"{split}/loss", n))
    ordered += [n for n in names if n not in ordered]
  if any(SPEED in run.metrics for run in runs) and SPEED not in ordered:
    ordered.append(SPEED)
  return ordered


def rows(runs: list, names: list) -> tuple:
  """(header, rows of strings) shared by the CSV, the Markdown and the live table.

  Args:
    runs: TrialRuns, in the order to show.
    names: the swept flags, one column each.
  """
  metrics = metric_names(runs)
  header = ["trial", "status", *names, "step", *metrics,
            "attempts", "elapsed_s", "error"]
  body = []
  for run in runs:
    body.append([run.name, run.status,
                 *[flag_text(run.trial.values.get(n, "")) for n in names],
                 _number(run.metrics.get("step")),
                 *[_number(run.metrics.get(m)) for m in metrics],
                 str(run.attempts), f"{run.elapsed:.1f}", run.error])
  return header, body


def trial_line(run, *, metric: str) -> str:
  """One line on a trial that ended: `t3 completed: eval/accuracy 0.9356 at step
  300 (learning_rate=0.01, task.hidden=64) in 12.3 s`."""
  values = ", ".join(f"{name}={flag_text(value)}"
                     for name, value in run.trial.values.items())
  measured = (f": {metric} {_number(run.metrics[metric])}"
              if metric in run.metrics else "")
  step = run.metrics.get("step")
  return (f"{run.name} {run.status}{measured}"
          + (f" at step {step}" if step is not None else "")
          + (f" ({values})" if values else "") + f" in {run.elapsed:.1f} s"
          + (f": {run.error}" if run.error else ""))


def live_table(runs: list, names: list) -> str:
  """A fixed-width table of every trial (status, step, latest metrics, elapsed)."""
  header, body = rows(runs, names)
  keep = [i for i, h in enumerate(header) if h not in ("error", "attempts", SPEED)]
  table = [[r[i] for i in keep] for r in [header] + body]
  widths = [max(len(row[i]) for row in table) for i in range(len(keep))]
  lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
           for row in table]
  counts = {}
  for run in runs:
    counts[run.status] = counts.get(run.status, 0) + 1
  summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
  return "\n".join(lines + [f"({summary})"])


def write_results(root: str, runs: list, names: list, *, metric: str, goal: str):
  """Writes ROOT/results.csv and ROOT/results.md, best trial first."""
  header, body = rows(ranked(runs, metric=metric, goal=goal), names)
  buffer = io.StringIO()
  writer = csv.writer(buffer, lineterminator="\n")
  writer.writerow(header)
  writer.writerows(body)
  run_dir.write_atomic(os.path.join(root, RESULTS_CSV), buffer.getvalue())
  lines = [f"Sorted by {metric} ({goal}).", "",
           "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |"
            for row in body]
  run_dir.write_atomic(os.path.join(root, RESULTS_MD), "\n".join(lines) + "\n")


def best_summary(runs: list, *, metric: str, goal: str) -> str:
  """'best: NAME (metric = v)' and the command that reproduces it, or why none."""
  best = ranked(runs, metric=metric, goal=goal)
  if not best or best[0].status != "completed" or metric not in best[0].metrics:
    return f"no completed trial reported {metric}"
  run = best[0]
  return (f"best: {run.name} ({metric} = {_number(run.metrics[metric])})\n"
          f"  python {shlex.join(run.command[1:])}")


def write_hparams_config(root: str, params: list, metrics: list):
  """Writes the HParams experiment (swept flags, domains, metrics) at ROOT.

  Args:
    root: the sweep root.
    params: the swept Params.
    metrics: "split/name" metrics; each is the tag `name` in the trials' `split`
      subdirectory.
  """
  tf = tf_loader.load_tensorflow()
  from tensorboard.plugins.hparams import api as hp
  hparams = [hp.HParam(p.name, _domain(hp, p)) for p in params]
  metrics = [hp.Metric(m.split("/", 1)[1], group=m.split("/", 1)[0], display_name=m)
             for m in metrics if "/" in m]
  writer = tf.summary.create_file_writer(root)
  with writer.as_default():
    hp.hparams_config(hparams=hparams, metrics=metrics)
  writer.close()


def _domain(hp, param: Param):
  if param.distribution in ("grid", "choice"):
    values = list(param.values)
    return hp.Discrete(values)
  if param.distribution == "int":
    return hp.IntInterval(int(param.low), int(param.high))
  return hp.RealInterval(float(param.low), float(param.high))


PRUNED_METRIC = "sweep/pruned"  # 1 for a pruned trial, 0 for one that ran to its end.
_SESSION_STATUS = {"completed": "STATUS_SUCCESS", "pruned": "STATUS_SUCCESS",
                   "failed": "STATUS_FAILURE", "diverged": "STATUS_FAILURE"}


def write_trial_status(model_dir: str, status: str, *, step):
  """Ends the trial's HParams session (STATUS_SUCCESS, or STATUS_FAILURE for a
  failed or diverged trial) and writes its sweep/pruned scalar (1 when the pruner
  stopped it at `step`, else 0), a column of TensorBoard's HParams table.
  HParams has no status for a pruned session."""
  if not os.path.isdir(model_dir) or status not in _SESSION_STATUS:
    return
  tf = tf_loader.load_tensorflow()
  from tensorboard.plugins.hparams import api_pb2, summary
  code = api_pb2.Status.Value(_SESSION_STATUS[status])
  writer = tf.summary.create_file_writer(model_dir)
  with writer.as_default():
    tf.summary.experimental.write_raw_pb(
        summary.session_end_pb(code).SerializeToString(), step=0)
  writer.close()
  group, tag = PRUNED_METRIC.split("/")
  writer = tf.summary.create_file_writer(os.path.join(model_dir, group))
  with writer.as_default():
    tf.summary.scalar(tag, float(status == "pruned"), step=step or 0)
  writer.close()
