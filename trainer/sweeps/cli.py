"""`python scripts/sweep.py --root=R --grid=... --random=... [-- TRAINER FLAGS]`.

Checks the whole spec (every planned trial's command line, parsed exactly as the
trainer would parse it; for TPE, its first proposals) before anything is written,
then opens the sweep's Optuna study, runs the trials it claims, and reports.
"""

import contextlib
import dataclasses
import os
import re
import shlex
import sys
from typing import Optional

from trainer import argparsing
from trainer import config as config_lib
from trainer.outputs import run_dir
from trainer.errors import ConfigError, ExitCode, TrainerError
from trainer.sweeps import report, search, spec, study
from trainer.tasks.base import METRIC_NAME
from trainer.sweeps.runner import LOG_DIR, Sweep
from trainer.sweeps.trial_run import TrialRun


def _parser():
  parser = argparsing.ArgumentParser(
      prog="sweep.py", description="Grid or random search over trainer flags; each "
      "trial is a `python -m trainer.main` run in ROOT/<trial>. Flags after -- go to "
      "every trial.")
  parser.add_argument("--root", required=True, help="sweep directory")
  parser.add_argument("--base_flagfile",
                      help="trainer flagfile every trial starts from")
  parser.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                      help="try each value of a trainer flag (repeatable)")
  parser.add_argument("--random", action="append", default=[], metavar="NAME=DIST",
                      help="sample a flag: uniform:LO:HI, loguniform:LO:HI, "
                           "int:LO:HI or choice:A,B (repeatable)")
  parser.add_argument("--spec", action="append", default=[], metavar="FILE",
                      help="a .sweep file: one sweep option per line, e.g. "
                           "flags/sweeps/lr_batch.sweep")
  parser.add_argument("--trials", type=int, default=10,
                      help="random samples or TPE proposals (default 10)")
  parser.add_argument("--seed", type=int, default=0,
                      help="seed of the random samples and of TPE")
  parser.add_argument("--sampler", choices=search.SAMPLERS,
                      help="grid (every --grid point), random (--trials samples of "
                           "--random, each with every grid point) or tpe (Optuna's "
                           "model-based search over both, --trials proposals); "
                           "default: random with --random, else grid")
  parser.add_argument("--pruner", choices=search.PRUNERS, default="none",
                      help="stop trials that are behind at an evaluation: median, "
                           "asha (successive halving), hyperband; rungs are the "
                           "trials' --eval_every steps (default none)")
  parser.add_argument("--storage",
                      help="the Optuna study's storage, shared by every sweep process "
                           "that joins it: sqlite:///FILE, postgresql://..., "
                           "mysql://... or journal:FILE (default: ROOT/study.db)")
  parser.add_argument("--study", default="sweep",
                      help="the study's name in --storage (default sweep)")
  parser.add_argument("--parallel", type=int, default=1, help="trials at once")
  parser.add_argument("--threads_per_trial", type=int, default=0,
                      help="TensorFlow threads per trial (default: CPUs / --parallel)")
  parser.add_argument("--fork_server", action=argparsing.argparse.BooleanOptionalAction,
                      default=True,
                      help="start trials warm: fork each from a process that has "
                           "imported TensorFlow once, instead of a new Python "
                           "(default on; --no-fork_server starts each cold)")
  parser.add_argument("--retries", type=int, default=1,
                      help="extra attempts for a failed trial (default 1)")
  parser.add_argument("--metric",
                      help="what ranks the trials: eval/NAME, train/NAME (NAME the "
                           "loss or a task metric) or examples_per_second (default: "
                           "the task's, e.g. eval/accuracy)")
  parser.add_argument("--goal", choices=("max", "min"),
                      help="default: the task's for its metrics, min for losses")
  parser.add_argument("--dry_run", action="store_true",
                      help="print the trials and their commands; run nothing")
  parser.add_argument("trainer_args", nargs=argparsing.argparse.REMAINDER,
                      help="-- then trainer flags for every trial")
  return parser


_SPEC_OPTIONS = ("--grid=", "--random=", "--trials=", "--seed=", "--metric=",
                 "--goal=", "--base_flagfile=", "--sampler=", "--pruner=")


def _spec_lines(path):
  """The sweep options of a .sweep file, each checked to be one a file may set."""
  lines = spec.read_spec_file(path)
  if any(line.startswith(("--spec", "--root")) for line in lines):
    raise ConfigError(f"--spec={path}: a .sweep file cannot set --spec or --root")
  for line in lines:
    if not line.startswith(_SPEC_OPTIONS):
      raise ConfigError(f"--spec={path}: {line!r} is not a sweep option (use "
                        f"{', '.join(_SPEC_OPTIONS)})")
  return lines


def _parse(argv):
  """Parses argv with the options of its .sweep files (--spec) put first."""
  parser = _parser()
  args = parser.parse_args(argv)
  lines = [line for path in args.spec for line in _spec_lines(path)]
  if lines:
    # Every file's options, then the command line: its single-valued options
    # override the files', and --grid/--random add to theirs.
    args = parser.parse_args(lines + argv)
  if args.trainer_args[:1] == ["--"]:
    args.trainer_args = args.trainer_args[1:]
  return args


_METRIC = re.compile(
    rf"^((train|eval)/{METRIC_NAME.pattern[1:-1]}|examples_per_second)$")


def _check_metric(args, base_args):
  """Fills in the default --metric and --goal from the trials' task.

  Raises:
    ConfigError: a malformed --metric, or base flags that do not parse.
  """
  from trainer import tasks
  try:
    base = config_lib.from_argv(base_args)
  except ConfigError as e:
    raise ConfigError(f"the trials' flags: {e}") from None
  task_class = tasks.load_task_class(base.task)
  args.metric = args.metric or task_class.best_metric
  if not _METRIC.match(args.metric):
    raise ConfigError(f"--metric={args.metric}: use eval/NAME, train/NAME or "
                      "examples_per_second")
  args.goal = args.goal or tasks.metric_goal(task_class, args.metric)
  return task_class


def _check(args):
  for name in ("parallel", "trials", "threads_per_trial", "retries"):
    low = 0 if name in ("threads_per_trial", "retries") else 1
    if getattr(args, name) < low:
      raise ConfigError(f"--{name}={getattr(args, name)}: must be >= {low}")
  if args.base_flagfile and not os.path.isfile(args.base_flagfile):
    raise ConfigError(f"--base_flagfile={args.base_flagfile}: no such file")
  args.threads_per_trial = (args.threads_per_trial or
                            max(1, (os.cpu_count() or 1) // args.parallel))


@dataclasses.dataclass
class Plan:
  """What the sweep will run: its params, its planned trials and their commands."""
  params: list
  planned: Optional[list]  # [(name, values)] of grid and random; None for TPE.
  make_run: object  # make_run(name, values) -> TrialRun
  eval_every: int
  train_steps: int
  trial_flags: tuple  # What every trial runs with besides the swept flags.


def build_plan(args) -> Plan:
  """The sweep's trials, each planned trial's flags checked like the CLI's.

  Raises:
    ConfigError: naming the bad option, or the trial and flag that is invalid.
  """
  _check(args)
  base = [f"--flagfile={args.base_flagfile}"] if args.base_flagfile else []
  task_class = _check_metric(args, [*base, *args.trainer_args])
  params = ([spec.parse_grid(g, task_class) for g in args.grid] +
            [spec.parse_random(r, task_class) for r in args.random])
  args.sampler = args.sampler or ("random" if args.random else "grid")
  if args.sampler == "grid" and args.random:
    raise ConfigError("--sampler=grid: --random needs --sampler=random or tpe")
  threads = args.threads_per_trial
  hparams = ",".join(p.name for p in params)

  def trainer_args(name, values):
    return [*base, f"--intra_op_threads={threads}", f"--inter_op_threads={threads}",
            *args.trainer_args, *spec.Trial(name=name, values=values).flags(),
            f"--model_dir={os.path.join(args.root, name)}", f"--hparams={hparams}"]

  def make_run(name, values):
    # train_steps: the trials' --train_steps, set below once their flags parse.
    return TrialRun(trial=spec.Trial(name=name, values=values),
                    command=[sys.executable, "-m", "trainer.main",
                             *trainer_args(name, values)],
                    model_dir=os.path.join(args.root, name),
                    log_path=os.path.join(args.root, LOG_DIR, name + ".log"),
                    train_steps=int(values.get("train_steps", train_steps)))

  if args.sampler == "tpe":
    spec.check_params(params)
    planned = None
    checked = search.tpe_proposals(params, trials=args.trials, seed=args.seed)
  else:
    trials = spec.expand(params, trials=args.trials, seed=args.seed)
    planned = checked = [(t.name, t.values) for t in trials]
  config = None
  for name, values in checked:
    try:
      config = config_lib.from_argv(trainer_args(name, values))
    except ConfigError as e:
      raise ConfigError(f"trial {name}: {e}") from None
    # The default mode evaluates a task with eval data (one without: no metric).
    if args.metric.startswith("eval/") and config.mode in ("train", "eval"):
      raise ConfigError(f"--metric={args.metric}: trial {name} runs --mode="
                        f"{config.mode}, which does not evaluate; add -- "
                        "--mode=train_and_eval or pick --metric=train/loss")
  _check_pruner(args, config)
  train_steps = config.train_steps  # A trial's own, unless it sweeps it.
  return Plan(params=params, planned=planned, make_run=make_run,
              eval_every=config.eval_every or config.train_steps,
              train_steps=config.train_steps,
              trial_flags=(*_flagfile_lines(args.base_flagfile), *args.trainer_args))


def _flagfile_lines(path) -> list:
  """The flags of --base_flagfile (its content: the path may differ by machine)."""
  if not path:
    return []
  with open(path) as f:
    return [line.strip() for line in f
            if line.strip() and not line.lstrip().startswith("#")]


def _check_pruner(args, config):
  """A pruner ranks trials by their evaluations before the end.

  Raises:
    ConfigError: --metric is not an evaluation, or the trials do not evaluate
      every --eval_every steps.
  """
  if args.pruner == "none":
    return
  if not args.metric.startswith("eval/"):
    raise ConfigError(f"--pruner={args.pruner}: ranks trials by their evaluations; "
                      f"--metric={args.metric} is not one (use eval/NAME)")
  if not config.eval_every or config.eval_every >= config.train_steps:
    raise ConfigError(f"--pruner={args.pruner}: the trials have no evaluations to "
                      "rank before the end; add -- --mode=train_and_eval "
                      "--eval_every=N (N < --train_steps)")


def _print_dry_run(args, plan):
  """The trials and their commands; for TPE, its first (data-free) proposals."""
  if plan.planned is None:
    trials = search.tpe_proposals(plan.params, trials=args.trials, seed=args.seed)
    end = (f"{args.trials} trials: the first {len(trials)} proposals of TPE; it "
           "adapts the others to their results (dry run: nothing was started)")
  else:
    trials = plan.planned
    end = f"{len(trials)} trials (dry run: nothing was started)"
  for name, values in trials:
    print(f"{name}\n  python {shlex.join(plan.make_run(name, values).command[1:])}")
  print(end)


def _replace_hparams_config(root, params, metrics):
  """Writes ROOT's HParams config, replacing the one written before (by an earlier
  invocation, or at the start of this one before the trials' metrics were known)."""
  for name in os.listdir(root):
    if name.startswith("events.out.tfevents."):
      # Only sweeps write events at ROOT; another process of it may remove it too.
      with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(root, name))
  report.write_hparams_config(root, params, metrics)


def main(argv=None) -> int:
  """Runs the sweep; returns the exit code (see Sweep.run; 2 for a bad spec)."""
  argv = sys.argv[1:] if argv is None else argv
  try:
    args = _parse(argv)
    plan = build_plan(args)
  except ConfigError as e:
    print(f"sweep.py: error: {e}", file=sys.stderr)
    return int(ExitCode.BAD_INPUT)
  if args.dry_run:
    _print_dry_run(args, plan)
    return 0
  params = plan.params
  try:
    if args.storage and not search.in_root(args.storage, args.root):
      search.open_storage(args.storage, args.root)  # A bad URL: nothing written.
    run_dir.ensure_writable(args.root)
    queue = study.StudyQueue(
        root=args.root, storage=args.storage, study_name=args.study, goal=args.goal,
        sampler=args.sampler, pruner=args.pruner, seed=args.seed, params=params,
        planned=plan.planned, trials=args.trials, eval_every=plan.eval_every,
        train_steps=plan.train_steps, metric=args.metric,
        trial_flags=plan.trial_flags)
    first = dict.fromkeys([args.metric, "eval/loss", "train/loss"] + (
        [report.PRUNED_METRIC] if args.pruner != "none" else []))
    _replace_hparams_config(args.root, params, list(first))
    names = [p.name for p in params]
    print(f"sweep {args.root}: study {args.study}, {queue.total} trials "
          f"({args.sampler}{'' if args.pruner == 'none' else ', ' + args.pruner}), "
          f"{args.parallel} at a time here, {args.threads_per_trial} TensorFlow "
          "threads each", flush=True)
    sweep = Sweep(root=args.root, queue=queue, make_run=plan.make_run,
                  parallel=args.parallel, retries=args.retries,
                  table=lambda rs: report.live_table(rs, names),
                  ranking={"metric": args.metric, "goal": args.goal},
                  prune_metric=args.metric if args.pruner != "none" else None,
                  fork_server=args.fork_server)
    code = sweep.run()
    runs = sweep.runs()
    _replace_hparams_config(args.root, params, report.metric_names(runs, first))
    report.write_results(args.root, runs, names, metric=args.metric, goal=args.goal)
  except TrainerError as e:
    print(f"sweep.py: error: {e}", file=sys.stderr)
    return int(e.exit_code)
  if sweep.bad_metric:
    print(f"sweep.py: error: {sweep.bad_metric}", file=sys.stderr)
    return code
  print(f"results: {os.path.join(args.root, report.RESULTS_CSV)}, "
        f"{os.path.join(args.root, report.RESULTS_MD)}")
  print(report.best_summary(runs, metric=args.metric, goal=args.goal))
  if code == int(ExitCode.INTERRUPTED):
    print("interrupted: rerun the same command to resume the unfinished trials")
  return code
