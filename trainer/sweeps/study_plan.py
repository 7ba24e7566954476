"""A sweep study's plan: how its study searches (sampler, pruner, direction), the
trials it enqueues once, and the options every sweep process of the study must
agree on (trainer/sweeps/study.py holds the study).

The first process to open a study enqueues its trials: exactly the sweep's, with
their values for grid and random search, empty for TPE (whose sampler proposes
each one when it is claimed), and records the options in the study. Every later
process checks its own against them.

Example:

  plan = StudyPlan(sampler="tpe", pruner="asha", seed=0, goal="max",
                   metric="eval/accuracy", params=params, planned=None,
                   trials=24, eval_every=100, train_steps=1000)
  study = plan.open_study(storage, "sweep")  # Under the root's lock.
  plan.ensure_planned(study)                 # Likewise.
"""

import dataclasses
import json

from trainer.errors import ConfigError
from trainer.sweeps.search import load_optuna, make_pruner, make_sampler


class StudyPlan:
  """What the first sweep process of a study plans, and every later one checks."""

  def __init__(self, *, sampler: str, pruner: str, seed: int, goal: str,
               metric: str, params: list, planned, trials: int, eval_every: int,
               train_steps: int, trial_flags: tuple = ()):
    """Creates the plan.

    Args:
      sampler: one of search.SAMPLERS.
      pruner: one of search.PRUNERS.
      seed: --seed.
      goal: "max" or "min" of --metric.
      metric: --metric (the value each trial is told to the study with).
      params: the swept Params.
      planned: [(name, values)] of grid and random search; None for TPE.
      trials: how many trials TPE proposes.
      eval_every: the trials' --eval_every (the pruner's rungs).
      train_steps: the trials' --train_steps.
      trial_flags: what every trial's command line holds besides the swept flags
        (the base flagfile's lines and the trainer flags after --).
    """
    self.sampler = sampler
    self.seed = seed
    self.trials = len(planned) if planned is not None else trials
    self._planned = planned
    self._pruner = pruner
    self._goal = goal
    self._eval_every = eval_every
    self._train_steps = train_steps
    # What every process of the study must agree on; checked by `ensure_planned`.
    self.options = {"sampler": sampler, "seed": seed, "trials": self.trials,
                    "params": [dataclasses.asdict(p) for p in params],
                    "metric": metric, "goal": goal, "pruner": pruner,
                    "eval_every": eval_every, "train_steps": train_steps,
                    "trial_flags": list(trial_flags)}

  def _direction(self) -> str:
    return "maximize" if self._goal == "max" else "minimize"

  def open_study(self, storage, study_name: str):
    """The study `study_name` in `storage`: created, or opened as it is there.
    Call it under the root's lock (two processes may create it at once).

    Raises:
      ConfigError: the study there optimizes in the other direction.
    """
    optuna = load_optuna()
    try:
      study = optuna.create_study(
          storage=storage, study_name=study_name,
          sampler=make_sampler(self.sampler, self.seed),
          pruner=make_pruner(self._pruner, eval_every=self._eval_every,
                             train_steps=self._train_steps),
          direction=self._direction(), load_if_exists=True)
    except ValueError as e:  # E.g. the study exists with the other direction.
      raise ConfigError(f"--study={study_name}: {e}") from None
    if study.direction != optuna.study.StudyDirection[self._direction().upper()]:
      raise ConfigError(f"--goal={self._goal}: --study={study_name} in this storage "
                        f"{study.direction.name.lower()}s its metric; use "
                        "the same --goal, or another --study")
    return study

  def ensure_planned(self, study):
    """Enqueues the plan's trials in a study nobody has planned yet; checks the
    plan of one that was. Call it under the root's lock.

    Raises:
      ConfigError: the study was planned by another sweep (other options).
    """
    attrs = study.user_attrs
    if "plan" not in attrs:
      self._enqueue(study)
      return
    differ = _differences(attrs["plan"], json.loads(json.dumps(self.options)))
    if differ:
      raise ConfigError(
          f"--study={study.study_name}: it was planned with other sweep "
          f"options ({differ}); use the same, or another --study or --root")

  def _enqueue(self, study):
    width = len(str(self.trials - 1))
    for slot in range(self.trials):
      if self._planned is None:
        study.enqueue_trial({}, user_attrs={"slot": slot, "width": width,
                                            "status": "pending"})
      else:
        name, values = self._planned[slot]
        study.enqueue_trial(values, user_attrs={
            "slot": slot, "name": name, "values": values, "status": "pending"})
    study.set_user_attr("plan", self.options)


def _differences(planned: dict, ours: dict) -> str:
  """The sweep options in which `ours` differs from the study's plan ("" when
  none). Options a plan of an earlier version did not record are not compared,
  so its sweep can still be resumed."""
  return "; ".join(f"{key} was {planned[key]!r}, now {ours.get(key)!r}"
                   for key in sorted(planned) if planned[key] != ours.get(key))
