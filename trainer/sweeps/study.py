"""A sweep's trials as an Optuna study that one or many sweep processes share.

The study lives in `--storage` (default: an SQLite file in the sweep root; a
PostgreSQL/MySQL URL or a journal file on shared storage for many machines). The
first process plans it: it enqueues exactly the sweep's trials, with their values
for grid and random search, empty for TPE (whose sampler proposes each one when it
is claimed; trainer/sweeps/study_plan.py). Every process then claims waiting
trials one at a time under a lock file in the root, so no trial runs twice and
the total is exact.

A trial is a `python -m trainer.main` run in ROOT/<name>, and one Optuna trial
while it is unfinished: one that was interrupted (stays RUNNING with status
"interrupted" and no owner) or orphaned by a killed sweep (RUNNING, its owner's
process gone: trainer/sweeps/ownership.py) is put back in the queue as itself
(WAITING again) by the next `prepare`, so it keeps its number and the
evaluations it reported, and the study shows each planned trial once. The
process that claims it reports the evaluations its log shows and the study lacks
(those its killed sweep had not read yet; trainer/sweeps/pruning.py). Only a
finished trial that must run again (failed or diverged, or completed with its
results deleted: Optuna cannot reopen a finished trial) is replaced by a copy
with the same name, values and attempt count; the copy trains in the same
directory and so resumes from its checkpoints. The table shows each name's
newest trial.

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
import os
import time
from typing import Optional

from trainer.sweeps.ownership import Owner
from trainer.sweeps.search import (distribution, load_optuna, make_sampler,
                                   open_storage, round_value, slot_seed)
from trainer.sweeps.spec import trial_name
from trainer.sweeps.study_plan import StudyPlan

LOCK_FILE = ".study.lock"


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
  pruned_at: Optional[dict] = None  # The evaluation the pruner stopped it at.


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
      ConfigError: the storage cannot be opened, or the study there optimizes
        its metric the other way (`prepare` checks the other options).
    """
    self._params = params
    self._plan = StudyPlan(sampler=sampler, pruner=pruner, seed=seed, goal=goal,
                           metric=metric, params=params, planned=planned,
                           trials=trials, eval_every=eval_every,
                           train_steps=train_steps, trial_flags=trial_flags)
    self._lock_path = os.path.join(root, LOCK_FILE)
    self._owner = Owner()
    self._distributions = {p.name: distribution(p) for p in params}
    # The study's own storage object (RDB storages get Optuna's cache), so that
    # what this queue writes to it directly the study sees too.
    self._storage = load_optuna().storages.get_storage(open_storage(storage, root))
    with self._locked():
      self.study = self._plan.open_study(self._storage, study_name)
    self._study_id = self._storage.get_study_id_from_name(study_name)

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
    return self._plan.trials

  def prepare(self, *, done) -> int:
    """Plans the study if nobody has, and queues again the trials that must run
    again: unfinished and not running in a live process (interrupted, or without
    a heartbeat from another machine), which go back as themselves; failed or
    diverged, or finished but with their results gone, which are copied.

    Args:
      done: `done(name) -> bool`, whether a trial's directory holds a finished run.

    Returns:
      How many trials were already finished.

    Raises:
      ConfigError: the study was planned by another sweep (other options).
    """
    state = load_optuna().trial.TrialState
    with self._locked():
      self._plan.ensure_planned(self.study)
      finished = 0
      for trial in self._newest().values():
        status = trial.user_attrs.get("status", "pending")
        if trial.state == state.WAITING:
          continue
        if trial.state == state.RUNNING:
          if self._owner.orphaned(trial):  # Interrupted, or its sweep was killed.
            self._resume(trial)
        elif status == "pruned" or (status == "completed" and
                                    done(trial.user_attrs["name"])):
          finished += 1
        else:  # Failed, diverged, or completed with its results gone.
          self._requeue(trial, "pending" if status == "completed" else status)
      return finished

  def _trial_id(self, trial) -> int:
    """The storage's id of a trial (Trial or FrozenTrial) of this study."""
    return self._storage.get_trial_id_from_study_id_trial_number(self._study_id,
                                                                 trial.number)

  def frozen(self, trial):
    """The trial as the storage holds it now (a FrozenTrial)."""
    return self._storage.get_trial(self._trial_id(trial))

  def _resume(self, trial):
    """Puts an unfinished trial back in the queue as itself: WAITING again, with
    its number, values, attempts and reported evaluations (Optuna lets a
    storage take a RUNNING trial back to WAITING, never a finished one)."""
    trial_id = self._trial_id(trial)
    self._storage.set_trial_user_attr(trial_id, "status", "interrupted")
    self._storage.set_trial_user_attr(trial_id, "owner", None)
    self._storage.set_trial_state_values(trial_id,
                                         state=load_optuna().trial.TrialState.WAITING)

  def _requeue(self, trial, status: str):
    """Replaces a finished trial by a copy in the queue (same name, values,
    attempts): Optuna cannot reopen it."""
    attrs = dict(trial.user_attrs, status=status)
    for key in ("owner", "heartbeat", "pruned_at"):
      attrs.pop(key, None)
    # Its evaluations are reported to the copy from the trial's log when it is
    # claimed (trainer/sweeps/runner.py).
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
      if self._plan.sampler == "tpe":  # `ask` takes the oldest waiting trial.
        slot = min(waiting, key=lambda t: t.number).user_attrs.get("slot", 0)
        self.study.sampler = make_sampler("tpe", slot_seed(self._plan.seed, slot))
      trial = self.study.ask(self._distributions)
      # Marked ours before the lock is let go: `prepare` of another process
      # must not take a trial without an owner for an orphan.
      trial.set_user_attr("owner", self._owner.record)
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

  def _owns(self, trial) -> bool:
    """Whether a claimed trial is still this process's (ownership.Owner.owns)."""
    return self._owner.owns(self.frozen(trial))

  def set_attrs(self, trial, **attrs) -> bool:
    """Records attrs of a claimed trial; False when it is no longer this process's
    (another sweep process took it over for an orphan)."""
    with self._locked():  # Not between another process's check and takeover.
      if not self._owns(trial):
        return False
      for key, value in attrs.items():
        trial.set_user_attr(key, value)
    return True

  def report(self, trial, step: int, value: float) -> bool:
    """Reports an evaluation (once: a step the study has is left as it is).

    Returns:
      Whether the step is now the trial's newest evaluation in the study, the one
      `should_prune` judges; False for a trial that is no longer this process's.
    """
    frozen = self.frozen(trial)
    if not self._owner.owns(frozen):
      return False
    steps = frozen.intermediate_values
    if step not in steps:
      trial.report(value, step)
    return step >= max(steps, default=step)

  @staticmethod
  def should_prune(trial) -> bool:
    """The pruner's verdict on the trial's newest reported evaluation."""
    return trial.should_prune()

  def finish(self, trial, *, status: str, value=None, attempts: int, error: str,
             elapsed: float):
    """Records how a claimed trial ended. One that must run again (interrupted,
    failed) is queued again by the next `prepare`, i.e. when the sweep is rerun,
    not at once: an interrupted sweep or a --max_time budget must end.

    Args:
      trial: the claimed trial.
      status: completed, pruned, interrupted, pending (never started), failed or
        diverged.
      value: --metric's final value, for a completed trial.
      attempts: how many times it was started.
      error: the failure's line.
      elapsed: seconds it ran, over every attempt.
    """
    state = load_optuna().trial.TrialState
    with self._locked():
      if not self._owns(trial):
        return  # Taken over meanwhile: the other process records it.
      for key, attr in dict(status=status, attempts=attempts, error=error,
                              elapsed=round(elapsed, 1)).items():
        trial.set_user_attr(key, attr)
      if status == "completed" and value is not None:
        self.study.tell(trial, value, skip_if_finished=True)
      elif status == "pruned":
        # Optuna's value of a pruned trial: its newest evaluation, the one pruned.
        self.study.tell(trial, state=state.PRUNED, skip_if_finished=True)
      elif status in ("interrupted", "pending"):
        # Unfinished: it stays RUNNING, without an owner, for `prepare` to queue
        # again as itself (a finished trial could only be copied).
        trial.set_user_attr("owner", None)
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
          elapsed=attrs.get("elapsed", 0.0), number=trial.number,
          pruned_at=attrs.get("pruned_at")))
    return records

