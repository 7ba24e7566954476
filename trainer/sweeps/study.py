"""A sweep's trials as an Optuna study that one or many sweep processes share.

The study lives in `--storage` (default: an SQLite file in the sweep root; a
PostgreSQL/MySQL URL or a journal file on shared storage for many machines). The
first process plans it: it enqueues exactly the sweep's trials, with their values
for grid and random search, empty for TPE (whose sampler proposes each one when it
is claimed). Every process then claims waiting trials one at a time under a lock
file in the root, so no trial runs twice and the total is exact.

A trial is a `python -m trainer.main` run in ROOT/<name>. Optuna cannot put a
trial back in the queue, so a trial that must run again (interrupted, failed,
orphaned by a killed sweep, its results deleted) is replaced: the old one is
marked failed and superseded, and a copy with the same name, values and attempt
count is enqueued; the copy trains in the same directory and so resumes from its
checkpoints. The table shows each name's newest trial.

Example:

  queue = StudyQueue(root="runs/s1", storage=None, study_name="sweep",
                     goal="max", sampler="tpe", pruner="asha", seed=0,
                     params=params, planned=None, trials=24, eval_every=100,
                     train_steps=1000)
  queue.prepare()
  claimed = queue.claim()  # (optuna trial, name, values) or None when done.
"""

import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import time

from trainer.errors import ConfigError
from trainer.sweeps.search import (distribution, load_optuna, make_pruner,
                                   make_sampler, open_storage, round_value,
                                   slot_seed)
from trainer.sweeps.spec import trial_name

LOCK_FILE = ".study.lock"
HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 120.0  # A trial of another machine without a heartbeat this long.


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


@dataclasses.dataclass
class Record:
  """What the sweep knows of one trial name (its newest Optuna trial)."""
  name: str
  values: dict
  status: str
  attempts: int = 0
  error: str = ""
  elapsed: float = 0.0
  number: int = -1


class StudyQueue:
  """The study of one sweep root: planned once, claimed by any sweep process."""

  def __init__(self, *, root: str, storage, study_name: str, goal: str, sampler: str,
               pruner: str, seed: int, params: list, planned, trials: int,
               eval_every: int, train_steps: int, metric: str = "",
               trial_flags: tuple = ()):
    """Opens (or creates) the study.

    Args:
      root: the sweep root (holds the lock file, and the default storage).
      storage: --storage, or None for ROOT/study.db.
      study_name: --study.
      goal: "max" or "min" of --metric.
      sampler: one of SAMPLERS.
      pruner: one of PRUNERS.
      seed: --seed.
      params: the swept Params.
      planned: [(name, values)] of grid and random search; None for TPE.
      trials: how many trials TPE proposes.
      eval_every: the trials' --eval_every (the pruner's rungs).
      train_steps: the trials' --train_steps.
      metric: --metric (the value each trial is told to the study with).
      trial_flags: what every trial's command line holds besides the swept flags
        (the base flagfile's lines and the trainer flags after --).

    Raises:
      ConfigError: the storage cannot be opened, or the study there was planned
        with other options.
    """
    optuna = load_optuna()
    self._root = root
    self._params = params
    self._planned = planned
    self._trials = len(planned) if planned is not None else trials
    self._sampler = sampler
    self._seed = seed
    # What every process of the study must agree on; checked by `prepare`.
    self._plan = {"sampler": sampler, "seed": seed, "trials": self._trials,
                  "params": [dataclasses.asdict(p) for p in params],
                  "metric": metric, "goal": goal, "pruner": pruner,
                  "eval_every": eval_every, "train_steps": train_steps,
                  "trial_flags": list(trial_flags)}
    self._lock_path = os.path.join(root, LOCK_FILE)
    self._owner = {"host": socket.gethostname(), "pid": os.getpid()}
    self._distributions = {p.name: distribution(p) for p in params}
    with self._locked():
      try:
        self.study = optuna.create_study(
            storage=open_storage(storage, root), study_name=study_name,
            sampler=make_sampler(sampler, seed),
            pruner=make_pruner(pruner, eval_every=eval_every, train_steps=train_steps),
            direction="maximize" if goal == "max" else "minimize",
            load_if_exists=True)
      except ValueError as e:  # E.g. the study exists with the other direction.
        raise ConfigError(f"--study={study_name}: {e}") from None
    if self.study.direction != optuna.study.StudyDirection[
        "MAXIMIZE" if goal == "max" else "MINIMIZE"]:
      raise ConfigError(f"--goal={goal}: --study={study_name} in this storage "
                        f"{self.study.direction.name.lower()}s its metric; use "
                        "the same --goal, or another --study")

  @contextlib.contextmanager
  def _locked(self):
    """Serialises planning and claiming between the sweep processes of a root."""
    with open(self._lock_path, "a") as f:
      fcntl.flock(f, fcntl.LOCK_EX)
      try:
        yield
      finally:
        fcntl.flock(f, fcntl.LOCK_UN)

  @property
  def total(self) -> int:
    return self._trials

  def prepare(self, *, done) -> int:
    """Plans the study if nobody has, and queues again the trials that must run
    again: not finished, not running in a live process (or without a heartbeat
    from another machine), or finished but with their results gone.

    Args:
      done: `done(name) -> bool`, whether a trial's directory holds a finished run.

    Returns:
      How many trials were already finished.

    Raises:
      ConfigError: the study was planned by another sweep (other options).
    """
    state = load_optuna().trial.TrialState
    with self._locked():
      attrs = self.study.user_attrs
      differ = "plan" in attrs and _differences(attrs["plan"],
                                                json.loads(json.dumps(self._plan)))
      if "plan" not in attrs:
        self._enqueue_plan()
      elif differ:
        raise ConfigError(
            f"--study={self.study.study_name}: it was planned with other sweep "
            f"options ({differ}); use the same, or another --study or --root")
      finished = 0
      for trial in self._newest().values():
        status = trial.user_attrs.get("status", "pending")
        if trial.state == state.WAITING:
          continue
        if trial.state == state.RUNNING:
          if self._orphaned(trial):  # Its sweep was killed: resume it.
            self._requeue(trial, "interrupted")
        elif status == "pruned" or (status == "completed" and
                                    done(trial.user_attrs["name"])):
          finished += 1
        else:  # Failed, diverged, or completed with its results gone.
          self._requeue(trial, "pending" if status == "completed" else status)
      return finished

  def _enqueue_plan(self):
    width = len(str(self._trials - 1))
    for slot in range(self._trials):
      if self._planned is None:
        self.study.enqueue_trial({}, user_attrs={"slot": slot, "width": width,
                                                 "status": "pending"})
      else:
        name, values = self._planned[slot]
        self.study.enqueue_trial(values, user_attrs={
            "slot": slot, "name": name, "values": values, "status": "pending"})
    self.study.set_user_attr("plan", self._plan)

  def _orphaned(self, trial) -> bool:
    """A running trial whose sweep process is gone."""
    owner = trial.user_attrs.get("owner") or {}
    if owner.get("host") == self._owner["host"]:
      return owner.get("pid") != self._owner["pid"] and not _pid_alive(owner["pid"])
    beat = trial.user_attrs.get("heartbeat", 0.0)
    return time.time() - beat > STALE_SECONDS

  def _requeue(self, trial, status: str):
    """Replaces a trial by a copy in the queue (same name, values, attempts)."""
    attrs = dict(trial.user_attrs, status=status)
    attrs.pop("owner", None)
    attrs.pop("heartbeat", None)
    if trial.state == load_optuna().trial.TrialState.RUNNING:
      self.study.tell(trial.number, state=load_optuna().trial.TrialState.FAIL,
                      skip_if_finished=True)
    params = {p: trial.params[p] for p in trial.params}
    self.study.enqueue_trial(params, user_attrs=attrs)

  def _newest(self) -> dict:
    """{name or slot: newest FrozenTrial} over the study."""
    newest = {}
    for trial in self.study.get_trials(deepcopy=False):
      key = trial.user_attrs.get("name") or f"#{trial.user_attrs.get('slot')}"
      if key not in newest or trial.number > newest[key].number:
        newest[key] = trial
    return newest

  def claim(self):
    """Takes the next waiting trial: (optuna Trial, name, values), or None."""
    state = load_optuna().trial.TrialState
    with self._locked():
      waiting = self.study.get_trials(deepcopy=False, states=(state.WAITING,))
      if not waiting:
        return None
      if self._sampler == "tpe":  # `ask` takes the oldest waiting trial.
        slot = min(waiting, key=lambda t: t.number).user_attrs.get("slot", 0)
        self.study.sampler = make_sampler("tpe", slot_seed(self._seed, slot))
      trial = self.study.ask(self._distributions)
      # Marked ours before the lock is let go: `prepare` of another process
      # must not take a trial without an owner for an orphan.
      trial.set_user_attr("owner", self._owner)
      trial.set_user_attr("heartbeat", time.time())
      trial.set_user_attr("status", "running")
      name, values = trial.user_attrs.get("name"), trial.user_attrs.get("values")
      if name is None:  # A TPE proposal: named by its slot and rounded values.
        values = {p.name: round_value(trial.params[p.name]) for p in self._params}
        slot, width = trial.user_attrs["slot"], trial.user_attrs["width"]
        name = trial_name(values, prefix=f"{slot:0{width}d}-")
        trial.set_user_attr("name", name)
        trial.set_user_attr("values", values)
    return trial, name, values

  @staticmethod
  def set_attrs(trial, **attrs) -> bool:
    """Records attrs of a claimed trial; False when it is no longer this process's
    (another sweep process took it over for an orphan and ended it)."""
    try:
      for key, value in attrs.items():
        trial.set_user_attr(key, value)
    except load_optuna().exceptions.UpdateFinishedTrialError:
      return False
    return True

  @staticmethod
  def report(trial, step: int, value: float) -> bool:
    """Reports an evaluation; returns whether the pruner stops the trial (never
    one another process took over: its heartbeat check stops that)."""
    try:
      trial.report(value, step)
    except load_optuna().exceptions.UpdateFinishedTrialError:
      return False
    return trial.should_prune()

  def finish(self, trial, *, status: str, value=None, attempts: int, error: str,
             elapsed: float):
    """Records how a claimed trial ended. One that must run again (interrupted,
    failed) is queued again by the next `prepare`, i.e. when the sweep is rerun,
    not at once: an interrupted sweep or a --max_time budget must end."""
    state = load_optuna().trial.TrialState
    if not self.set_attrs(trial, status=status, attempts=attempts, error=error,
                          elapsed=round(elapsed, 1)):
      return  # Taken over meanwhile: the copy's process records it.
    with self._locked():
      if status == "completed" and value is not None:
        self.study.tell(trial, value, skip_if_finished=True)
      elif status == "pruned":
        self.study.tell(trial, state=state.PRUNED, skip_if_finished=True)
      else:
        self.study.tell(trial, state=state.FAIL, skip_if_finished=True)

  def records(self) -> list:
    """Every trial name's newest record, in planned order."""
    records = []
    for trial in sorted(self._newest().values(),
                        key=lambda t: (t.user_attrs.get("slot", 0), t.number)):
      attrs = trial.user_attrs
      values = attrs.get("values") or {}
      records.append(Record(
          name=attrs.get("name") or f"(proposal {attrs.get('slot')})",
          values=values, status=attrs.get("status", "pending"),
          attempts=attrs.get("attempts", 0), error=attrs.get("error", ""),
          elapsed=attrs.get("elapsed", 0.0), number=trial.number))
    return records


def _differences(planned: dict, ours: dict) -> str:
  """The sweep options in which `ours` differs from the study's plan ("" when
  none). Options a plan of an earlier version did not record are not compared,
  so its sweep can still be resumed."""
  return "; ".join(f"{key} was {planned[key]!r}, now {ours.get(key)!r}"
                   for key in sorted(planned) if planned[key] != ours.get(key))
