"""Sweeps on Optuna: TPE, pruning, several sweep processes on one study, a killed
sweep, and the study's bookkeeping (planning, claiming) without TensorFlow."""

import io
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, cli_env, read_results, read_scalars
from test_sweep import read_csv, sweep, sweep_record
from trainer.errors import ConfigError
from trainer.sweeps import cli, gate, ownership, pruning, runner, search, spec, study
from trainer.sweeps.trial_run import TrialRun

SHORT = ["--", "--dataset=digits", "--model=mlp", "--train_steps=30",
         "--steps_per_loop=10", "--checkpoint_every=10", "--eval_every=10",
         "--mode=train_and_eval"]


def _queue(root, *, planned, trials=4, seed=0, sampler="random", goal="max",
           pruner="none"):
  params = [spec.parse_random("learning_rate=loguniform:1e-4:1e-1")]
  return study.StudyQueue(root=str(root), storage=None, study_name="s", goal=goal,
                          sampler=sampler, pruner=pruner, seed=seed, params=params,
                          planned=planned, trials=trials, eval_every=10,
                          train_steps=30)


def optuna_trials(root):
  """The FrozenTrials of a sweep's study in its default storage."""
  return search.load_optuna().load_study(
      study_name="sweep", storage=f"sqlite:///{root}/study.db").get_trials()


def test_two_processes_claim_every_planned_trial_exactly_once(tmp_path):
  # Planned values are run as planned, digit for digit (never rounded again).
  planned = [(f"t{i}", {"learning_rate": 0.0123456789 * (i + 1)}) for i in range(5)]
  first, second = _queue(tmp_path, planned=planned), _queue(tmp_path, planned=planned)
  first.prepare(done=lambda name: False)
  second.prepare(done=lambda name: False)  # Already planned: nothing enqueued twice.
  claimed = []
  for queue in (first, second, second, first, second, first):
    got = queue.claim()
    if got:
      claimed.append(got)
  assert sorted(name for _, name, _ in claimed) == ["t0", "t1", "t2", "t3", "t4"]
  assert {name: values for _, name, values in claimed} == dict(planned)


def test_a_study_planned_otherwise_is_refused(tmp_path):
  _queue(tmp_path, planned=None, sampler="tpe").prepare(done=lambda name: False)
  with pytest.raises(ConfigError, match=r"--study=s: it was planned with other sweep "
                     r"options \(seed was 0, now 1\); use the same"):
    _queue(tmp_path, planned=None, sampler="tpe", seed=1).prepare(
        done=lambda name: False)


def test_a_study_with_the_other_goal_is_refused(tmp_path):
  _queue(tmp_path, planned=None, sampler="tpe").prepare(done=lambda name: False)
  with pytest.raises(ConfigError, match=r"--goal=min: --study=s in this storage "
                     r"maximizes its metric"):
    _queue(tmp_path, planned=None, sampler="tpe", goal="min")


def test_an_interrupted_trial_waits_for_the_rerun(tmp_path):
  queue = _queue(tmp_path, planned=[("t0", {"learning_rate": 0.01})])
  queue.prepare(done=lambda name: False)
  trial, name, _ = queue.claim()
  queue.finish(trial, status="interrupted", attempts=1, error="", elapsed=1.0)
  assert queue.claim() is None  # Not at once: the interrupted sweep must end.
  rerun = _queue(tmp_path, planned=[("t0", {"learning_rate": 0.01})])
  assert rerun.prepare(done=lambda name: False) == 0
  again, again_name, _ = rerun.claim()
  assert again_name == name and again.user_attrs["attempts"] == 1
  assert [r.status for r in rerun.records()] == ["running"]


def test_a_trial_taken_over_by_another_process_is_left_to_it(tmp_path):
  planned = [("t0", {"learning_rate": 0.01})]
  first = _queue(tmp_path, planned=planned)
  first.prepare(done=lambda name: False)
  trial, _, _ = first.claim()
  # Another machine's sweep finds no heartbeat and takes the trial over.
  trial.set_user_attr("owner", {"host": "elsewhere", "pid": 1})
  trial.set_user_attr("heartbeat", time.time() - ownership.STALE_SECONDS - 1)
  second = _queue(tmp_path, planned=planned)
  second.prepare(done=lambda name: False)
  copy, _, _ = second.claim()
  assert not first.set_attrs(trial, heartbeat=time.time())
  first.finish(trial, status="completed", value=0.5, attempts=1, error="",
               elapsed=1.0)  # No error, and the copy is untouched.
  second.finish(copy, status="completed", value=0.9, attempts=1, error="",
                elapsed=1.0)
  (record,) = second.records()
  assert record.status == "completed" and record.number == copy.number
  assert second.study.best_value == 0.9


def test_tpe_proposals_differ_between_sweep_processes(tmp_path):
  first = _queue(tmp_path, planned=None, sampler="tpe")
  second = _queue(tmp_path, planned=None, sampler="tpe")
  first.prepare(done=lambda name: False)
  values = [queue.claim()[2]["learning_rate"] for queue in (first, second, second)]
  assert len(set(values)) == 3, values
  # And they are the dry run's proposals, slot by slot.
  proposed = search.tpe_proposals(first._params, trials=4, seed=0)
  assert [v["learning_rate"] for _, v in proposed[:3]] == values


def test_a_storage_in_the_root_is_created_with_it(tmp_path):
  root = tmp_path / "new" / "sweep"
  assert search.in_root(f"journal:{root}/study.journal", str(root))
  assert not search.in_root(f"sqlite:///{tmp_path}/other.db", str(root))
  assert not search.in_root("postgresql://localhost/db", str(root))
  search.open_storage(f"journal:{root}/study.journal", str(root))
  assert root.is_dir()


@pytest.mark.slow  # A sweep of several trials.
def test_tpe_sweep_runs_its_seeded_proposals(tmp_path):
  root = str(tmp_path / "tpe")
  args = ["--sampler=tpe", "--trials=2", "--seed=5", "--metric=eval/accuracy",
          "--random=learning_rate=loguniform:1e-3:1e-1"]
  proposed = sweep("--root=/nonexistent", "--dry_run", *args, *SHORT)
  names = [line for line in proposed.stdout.splitlines()[:-1]
           if not line.startswith(" ")]
  assert len(names) == 2 and names[0].startswith("0-learning_rate=")
  other = sweep("--root=/nonexistent", "--dry_run", *args[:2], "--seed=6", *args[3:],
                *SHORT)
  assert other.stdout.splitlines()[0] != names[0]
  result = sweep(f"--root={root}", *args, *SHORT)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  rows = read_csv(root)
  assert sorted(r["trial"] for r in rows) == sorted(names)  # Same seed, same trials.
  assert {r["status"] for r in rows} == {"completed"}
  assert os.path.isfile(os.path.join(root, "study.db"))


@pytest.mark.slow  # A sweep of several trials.
def test_asha_prunes_trials_that_cannot_learn(tmp_path):
  root = str(tmp_path / "asha")
  # The first trial learns; the next two (rates too small to learn) are behind it
  # at the first rung (step 100) and are stopped there. Loop calls are automatic,
  # i.e. they run from one evaluation to the next: a trial that went on after its
  # evaluation until the verdict came stopped one evaluation late (step 200).
  asha = ["--grid=learning_rate=0.01,1e-7,2e-7", "--pruner=asha", "--",
          "--dataset=digits", "--model=mlp", "--train_steps=300", "--eval_every=100",
          "--checkpoint_every=100", "--mode=train_and_eval"]
  result = sweep(f"--root={root}", *asha)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  record = sweep_record(root)
  assert record["learning_rate=0.01"]["status"] == "completed"
  rows = {r["trial"]: r for r in read_csv(root)}
  trials = {t.user_attrs["name"]: t for t in optuna_trials(root)}
  assert len(trials) == 3
  for name in ("learning_rate=1e-07", "learning_rate=2e-07"):
    assert record[name]["status"] == "pruned", record[name]
    # Stopped at the evaluation the pruner judged, with its checkpoint.
    results = read_results(os.path.join(root, name))
    assert results["status"] == "pruned" and results["global_step"] == 100
    assert results["eval"]["step"] == 100
    with open(os.path.join(root, "logs", name + ".log")) as f:
      assert "pruned by the sweep at step 100" in f.read()
    # The table and Optuna show the value the pruner judged, at its step.
    trial = trials[name]
    assert trial.state.name == "PRUNED" and list(trial.intermediate_values) == [100]
    assert rows[name]["status"] == "pruned" and rows[name]["step"] == "100"
    # (results.csv rounds to 4 significant digits.)
    assert float(rows[name]["eval/accuracy"]) == pytest.approx(trial.value, rel=1e-3)
    assert trial.value == trial.intermediate_values[100]
  done = trials["learning_rate=0.01"]
  assert done.state.name == "COMPLETE" and sorted(done.intermediate_values) == [
      100, 200, 300]
  assert float(rows["learning_rate=0.01"]["eval/accuracy"]) == pytest.approx(
      done.value, rel=1e-3)
  # A rerun does not resume pruned trials as if they were interrupted.
  again = sweep(f"--root={root}", *asha)
  assert again.returncode == 0 and "3 of 3 trials already completed" in again.stdout
  # TensorBoard's HParams table: a sweep/pruned column, 1 where it pruned.
  for name, pruned in (("learning_rate=0.01", 0.0), ("learning_rate=1e-07", 1.0)):
    (point,) = read_scalars(os.path.join(root, name, "sweep"))["pruned"]
    assert point[1] == pruned


@pytest.mark.slow  # A sweep of several trials.
def test_two_sweep_processes_share_one_study(tmp_path):
  root = str(tmp_path / "shared")
  # TPE: each process seeds its proposals by trial slot, so none is proposed twice;
  # the journal file is in the root, which neither process has created yet.
  args = [sys.executable, os.path.join(REPO, "scripts", "sweep.py"), f"--root={root}",
          f"--storage=journal:{root}/study.journal", "--study=s1", "--trials=4",
          "--sampler=tpe", "--random=learning_rate=loguniform:1e-3:1e-1",
          "--metric=train/loss",
          "--", "--dataset=digits", "--model=mlp", "--train_steps=20"]
  processes = [subprocess.Popen(args, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for _ in range(2)]
  outputs = [p.communicate(timeout=300)[0] for p in processes]
  assert [p.returncode for p in processes] == [0, 0], outputs
  trials = sorted(n for n in os.listdir(root) if n[0].isdigit())
  assert len(trials) == 4
  for name in trials:  # Each trial ran once, in one of the two processes.
    with open(os.path.join(root, "logs", name + ".log")) as f:
      assert f.read().count("# attempt ") == 1
  record = sweep_record(root)
  assert len(record) == 4 and {t["status"] for t in record.values()} == {"completed"}
  assert len({t["values"]["learning_rate"] for t in record.values()}) == 4
  assert len(read_csv(root)) == 4
  ran = [len(re.findall(r"^sweep .*study s1, 4 trials", out, re.M)) for out in outputs]
  assert ran == [1, 1]


def _start_sweep(args, log, *, after=0, line=r"^step \d+/"):
  """Starts a sweep; returns it once its trial's log shows a `line` (a progress
  line by default) past the first `after` characters."""
  process = subprocess.Popen(args, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline and not (
      os.path.exists(log) and re.search(line, open(log).read()[after:], re.M)):
    time.sleep(0.2)
  return process


@pytest.mark.slow  # A sweep of several trials.
def test_an_interrupted_or_killed_sweep_loses_nothing(tmp_path):
  root = str(tmp_path / "sweep")
  # With a pruner (that never prunes a lone trial): its evaluations are reported.
  args = [sys.executable, os.path.join(REPO, "scripts", "sweep.py"), f"--root={root}",
          "--grid=learning_rate=0.01", "--pruner=median", "--", "--dataset=digits",
          "--model=mlp", "--train_steps=1500", "--checkpoint_every=100",
          "--steps_per_loop=10", "--mode=train_and_eval", "--eval_every=100"]
  log = os.path.join(root, "logs", "learning_rate=0.01.log")
  # SIGINT: the trial saves a checkpoint, the sweep exits 4 and says how to go on.
  process = _start_sweep(args, log)
  try:
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=120)[0]
  finally:
    process.kill()
  assert process.returncode == 4, output[-2000:]
  assert sweep_record(root)["learning_rate=0.01"]["status"] == "interrupted"
  assert "rerun the same command to resume" in output
  # SIGKILL of the rerun: its orphaned trial gets a SIGTERM from the kernel
  # (PR_SET_PDEATHSIG), saves and exits; the study still says "running".
  seen = len(open(log).read())
  process = _start_sweep(args, log, after=seen)
  process.kill()
  process.wait(timeout=30)
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline and "SIGTERM" not in open(log).read()[seen:]:
    time.sleep(0.2)
  # The rerun may find the model_dir still locked by that trial: it waits for it.
  # Its trial starts cold: the pruning gate's other way in.
  cold = args[:5] + ["--no-fork_server"] + args[5:]
  result = subprocess.run(cold, cwd=REPO, env=cli_env(), capture_output=True,
                          text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stdout[-2000:]
  with open(log) as f:
    text = f.read()
  assert len(re.findall(r"resuming at step [1-9]", text)) == 2
  record = sweep_record(root)
  assert list(record) == ["learning_rate=0.01"]  # The same trial, never a new one.
  assert record["learning_rate=0.01"]["status"] == "completed"
  assert record["learning_rate=0.01"]["attempts"] == 3
  assert read_results(os.path.join(root, "learning_rate=0.01"))["global_step"] == 1500
  # In Optuna too: the planned trial once (resumed twice as itself, no failed one
  # per stop beside it), with every evaluation of its three attempts.
  (trial,) = optuna_trials(root)
  assert trial.state.name == "COMPLETE" and trial.user_attrs["attempts"] == 3
  logged = {int(step) for step in re.findall(r"^eval at step (\d+):", text, re.M)}
  assert set(trial.intermediate_values) == logged == set(range(100, 1501, 100))


class _PruneEverything:
  """A study whose pruner stops a trial at every evaluation it is asked about."""

  def __init__(self):
    self.attrs = {}

  def report(self, trial, step, value):
    del trial, step, value
    return True  # The trial's newest evaluation.

  def should_prune(self, trial):
    del trial
    return True

  def set_attrs(self, trial, **attrs):
    del trial
    self.attrs.update(attrs)
    return True


class _Process:
  def __init__(self):
    self.signals = []

  def poll(self):
    return None

  def send_signal(self, sig):
    self.signals.append(sig)


def _sweep(root, queue):
  return runner.Sweep(root=str(root), queue=queue, make_run=None, parallel=1,
                      retries=0, table=lambda runs: "", out=io.StringIO(),
                      ranking={"metric": "eval/accuracy", "goal": "max"},
                      prune_metric="eval/accuracy")


def _logged_run(root, name, lines, *, train_steps=30):
  log = root / f"{name}.log"
  log.write_text("".join(line + "\n" for line in lines))
  run = TrialRun(trial=spec.Trial(name=name, values={}), command=[],
                 model_dir=str(root / name), log_path=str(log),
                 train_steps=train_steps)
  run.process = _Process()
  return run


def _eval_line(step, accuracy, loss=1.0):
  return f"eval at step {step}: loss {loss:.4f}  accuracy {accuracy:.4f}  (8 examples)"


def test_the_pruner_judges_the_evaluation_just_reported_never_the_last(tmp_path):
  queue = _PruneEverything()
  pruning_ = pruning.Pruning(queue=queue, metric="eval/accuracy",
                             say=lambda message: None)
  last = _logged_run(tmp_path, "last", [
      "step 30/30  loss 1.0000  accuracy 0.5000  1,000 examples/s  ETA 0:00:00",
      _eval_line(30, 0.5)])
  pruning_.read_log(last)
  # At --train_steps there is nothing left to save: never pruned there.
  assert last.verdicts == {30: False} and not last.pruning
  assert last.process.signals == [] and not queue.attrs
  early = _logged_run(tmp_path, "early", [_eval_line(10, 0.25, loss=2.0)])
  pruning_.read_log(early)
  assert early.verdicts == {10: True} and early.pruning
  judged = {"step": 10, "eval/loss": 2.0, "eval/accuracy": 0.25}
  assert early.pruned_at == judged and queue.attrs == {"pruned_at": judged}
  assert early.process.signals == [signal.SIGTERM]  # Also where it has no gate.


def test_a_taken_over_trial_is_itself_with_the_evaluations_its_log_shows(tmp_path):
  planned = [("t0", {"learning_rate": 0.01})]
  first = _queue(tmp_path, planned=planned, pruner="median")
  first.prepare(done=lambda name: False)
  trial, _, _ = first.claim()
  assert first.report(trial, 10, 0.5)
  # Its sweep (on another machine) stops beating; its trial evaluated once more
  # while it saved, and nobody read that line.
  trial.set_user_attr("owner", {"host": "elsewhere", "pid": 1})
  trial.set_user_attr("heartbeat", time.time() - ownership.STALE_SECONDS - 1)
  (tmp_path / "logs").mkdir()
  log = tmp_path / "logs" / "t0.log"
  log.write_text("# attempt 1: python -m trainer.main\n" + _eval_line(10, 0.5) + "\n" +
                 _eval_line(20, 0.6) + "\n")

  def make_run(name, values):
    return TrialRun(trial=spec.Trial(name=name, values=values), command=[],
                    model_dir=str(tmp_path / name), log_path=str(log), train_steps=30)

  second = _queue(tmp_path, planned=planned, pruner="median")
  second.prepare(done=lambda name: False)
  sweep_ = _sweep(tmp_path, second)
  sweep_._make_run = make_run
  run = sweep_._claim()
  assert run.optuna_trial.number == trial.number
  (frozen,) = second.study.get_trials()
  assert frozen.state.name == "RUNNING" and frozen.intermediate_values == {
      10: 0.5, 20: 0.6}
  assert not first.set_attrs(trial, heartbeat=time.time())  # It knows it lost it.
  # The pruner stops it at step 20; that sweep dies before the trial has ended.
  assert second.set_attrs(run.optuna_trial, pruned_at={
      "step": 20, "eval/loss": 1.0, "eval/accuracy": 0.6})
  run.optuna_trial.set_user_attr("owner", {"host": "elsewhere", "pid": 1})
  run.optuna_trial.set_user_attr("heartbeat", 0.0)
  third = _queue(tmp_path, planned=planned, pruner="median")
  third.prepare(done=lambda name: False)
  sweep_ = _sweep(tmp_path, third)
  sweep_._make_run = make_run
  assert sweep_._claim() is None
  (frozen,) = third.study.get_trials()
  assert frozen.state.name == "PRUNED" and frozen.value == 0.6
  (pruned,) = sweep_.runs()
  assert pruned.status == "pruned" and pruned.metrics["eval/accuracy"] == 0.6


_GATED_TRIAL = """
import sys
import trainer
from trainer import interrupts
from trainer.sweeps.gate import PruningGate
with interrupts.stop_on_signals() as stop:
  gate = PruningGate.open(sys.argv[1], last_step=40)
  assert gate is not None
  for step in (10, 15, 20, 30, 40):
    evaluated = step % 10 == 0
    if evaluated:  # As the trainer's Evaluate action prints it (not flushed).
      print(f"eval at step {step}: loss 1.0000  accuracy 0.5000  (8 examples)")
    gate(trainer.ActionContext(
        step=step, metrics={"loss": 1.0},
        eval_metrics={"loss": 1.0, "accuracy": 0.5} if evaluated else None,
        model=None, model_dir="", is_chief=True, summaries=None))
    print(f"after {step}: " + ("stop requested" if stop else "going on"))
"""


def _asked(gate_, child):
  """The steps a gated trial asks about, once it asks (or ends)."""
  deadline = time.monotonic() + 60
  while child.poll() is None and time.monotonic() < deadline:
    if select.select([gate_], [], [], 1.0)[0]:
      return gate_.asked()
  return []


def test_a_gated_trial_waits_at_each_evaluation_and_stops_there_if_pruned(tmp_path):
  """The gate as the trial's action, over real FIFOs, its SIGTERM taken by the
  trainer's handler as a stop request (tests/test_sweep_gate.py has the rest)."""
  gate_ = gate.Gate()
  log = tmp_path / "trial.log"
  env = cli_env()
  env.pop("PYTHONUNBUFFERED")  # The gate flushes the evaluation's line itself.
  with open(log, "w") as out:
    child = subprocess.Popen([sys.executable, "-c", _GATED_TRIAL, gate_.prefix],
                             stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
  try:
    assert _asked(gate_, child) == [10]
    # Its FIFOs, open at both ends, are gone from the file system.
    assert not os.path.exists(os.path.dirname(gate_.prefix))
    # Held at its evaluation until answered: the eval line is its last yet.
    assert log.read_text().splitlines()[-1].startswith("eval at step 10:")
    gate_.answer(10, prune=False)
    assert _asked(gate_, child) == [20]  # Not at 15: no evaluation there.
    gate_.answer(20, prune=True)
    assert _asked(gate_, child) == [30]
    gate_.close()  # The sweep is gone: the trial goes on.
    assert child.wait(timeout=60) == 0, log.read_text()
  finally:
    child.kill()
  assert log.read_text().splitlines() == [
      "eval at step 10: loss 1.0000  accuracy 0.5000  (8 examples)",
      "after 10: going on",
      "after 15: going on",
      "eval at step 20: loss 1.0000  accuracy 0.5000  (8 examples)",
      "pruned by the sweep at step 20: stopping at this evaluation",
      # Before the trainer's next action (its checkpoint and SignalStop).
      "after 20: stop requested",
      "eval at step 30: loss 1.0000  accuracy 0.5000  (8 examples)",
      "after 30: stop requested",
      "eval at step 40: loss 1.0000  accuracy 0.5000  (8 examples)",
      "after 40: stop requested"]


@pytest.mark.parametrize("args, message", [
    (["--grid=learning_rate=0.1", "--sampler=bayes"],
     "argument --sampler: invalid choice: 'bayes'"),
    (["--grid=learning_rate=0.1", "--pruner=early"],
     "argument --pruner: invalid choice: 'early'"),
    (["--grid=learning_rate=0.1", "--pruner=asha", "--", "--mode=train_and_eval"],
     "--pruner=asha: the trials have no evaluations to rank before the end; add -- "
     "--mode=train_and_eval --eval_every=N"),
    (["--grid=learning_rate=0.1", "--pruner=median", "--metric=train/loss"],
     "--pruner=median: ranks trials by their evaluations; --metric=train/loss is "
     "not one"),
    (["--random=learning_rate=uniform:0.1:0.2", "--sampler=grid"],
     "--sampler=grid: --random needs --sampler=random or tpe"),
    (["--grid=learning_rate=0.1", "--metric=train/loss",
      "--storage=sqlite:////nonexistent/dir/s.db"],
     "--storage=sqlite:////nonexistent/dir/s.db: cannot open it"),
])
def test_bad_sweep_options_are_one_line(tmp_path, capsys, args, message):
  root = tmp_path / "sweep"
  try:
    code = cli.main([f"--root={root}", *args])
  except SystemExit as e:  # argparse's own errors (an unknown choice).
    code = e.code
  assert code == 2
  err = capsys.readouterr().err
  assert message in err and err.count("\n") == 1, err
  assert not root.exists()


def test_large_seeds_seed_tpe_too():
  params = [spec.parse_random("learning_rate=loguniform:1e-4:1e-1")]
  first = search.tpe_proposals(params, trials=2, seed=20240601)
  assert first == search.tpe_proposals(params, trials=2, seed=20240601)
  assert len({values["learning_rate"] for _, values in first}) == 2


def test_a_study_planned_by_an_earlier_version_still_resumes(tmp_path):
  """Plans once recorded fewer options; those it has must match, no more."""
  queue = _queue(tmp_path, planned=None, sampler="tpe")
  queue.prepare(done=lambda name: False)
  plan = queue.study.user_attrs["plan"]
  queue.study.set_user_attr("plan", {key: plan[key] for key in
                                     ("sampler", "seed", "trials", "params")})
  assert _queue(tmp_path, planned=None, sampler="tpe").prepare(
      done=lambda name: False) == 0
  with pytest.raises(ConfigError, match="seed was 0, now 1"):
    _queue(tmp_path, planned=None, sampler="tpe", seed=1).prepare(
        done=lambda name: False)
