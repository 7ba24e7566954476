"""--on_nan: a non-finite loss or gradient stops the run with a replayable report
(exit 3), or rolls back to the last checkpoint at half the learning rate."""

from typing import Callable

from trainer.actions.base import Action, LoopCall
from trainer.errors import DivergedError, ModelDirError, RunStatus
from trainer.outputs import rollbacks
from trainer.outputs.run_dir import DIVERGENCE_FILE

MAX_ROLLBACKS = 3
ROLLED_BACK = "rolled_back"  # The outcome after a rollback: restart the input.


class NanPolicy(Action):
  """--on_nan: stop (DivergedError), or roll back and halve the learning rate.

  Each rollback halves the rate the previous one left (0.5, 0.25, 0.125 of the
  flag's), at most MAX_ROLLBACKS times in the run. Both numbers live in
  MODEL_DIR/rollbacks.json, written at each rollback, so a restart keeps them
  (the checkpoint restored by a rollback predates it).
  """

  def __init__(self, *, on_nan: str, trainer, checkpoints, results, console,
               model_dir: str, find_divergence: Callable[..., dict]):
    """Reads the rollbacks so far.

    Args:
      on_nan: "stop" or "rollback".
      trainer: what trains.
      checkpoints: the run's Checkpoints.
      results: the run's results.json.
      console: where the rollback and divergence lines go.
      model_dir: the run directory.
      find_divergence: `find_divergence(until=step)` replays the steps after
        the last checkpoint up to `step` and returns the report of the first
        non-finite one (or of that step, with "finite" true and a note, when
        the replay stays finite), which the chief wrote to DIVERGENCE_FILE
        (training/divergence.py; every worker calls it, since the replayed
        steps are collective).
    """
    self._on_nan = on_nan
    self._trainer = trainer
    self._checkpoints = checkpoints
    self._results = results
    self._console = console
    self._model_dir = model_dir
    self._find_divergence = find_divergence
    self.rollbacks, self.multiplier = rollbacks.saved(model_dir)

  def apply_learning_rate(self):
    """Sets the optimizer's rate to the flag's times the rollbacks' multiplier
    and the factor --reduce_lr_patience reached (in the run record)."""
    trainer = self._trainer
    if trainer.base_learning_rate is not None:
      trainer.set_peak_rate(self.learning_rate)

  @property
  def learning_rate(self) -> float:
    """The peak rate as the rollbacks and plateaus left it (the flag's, else)."""
    return (self._trainer.base_learning_rate * self.multiplier *
            self._checkpoints.record.lr_plateau_factor)

  def __call__(self, call: LoopCall):
    if call.all_finite:
      return None
    if self._on_nan == "rollback" and self.rollbacks < MAX_ROLLBACKS:
      return self._roll_back(call)
    report = self._find_divergence(until=call.step)
    self._results.data["divergence"] = DIVERGENCE_FILE
    self._results.finish(RunStatus.DIVERGED, step=call.step)
    where = (f"step {report['step']}" if not report["finite"] else
             f"a step of {report['checkpoint_step'] + 1} to {call.step}")
    layer = report["first_nonfinite_gradient"]
    raise DivergedError(
        f"non-finite loss or gradients at {where} (loss {report['loss']}, gradient "
        f"norm {report['gradient_norm']}"
        + (f", first non-finite gradient {layer}" if layer else "")
        + f"); the last good checkpoint is kept. {DIVERGENCE_FILE} "
        f"says more; replay it with: {report['replay']}. Lower --learning_rate or "
        "use --on_nan=rollback")

  def _roll_back(self, call: LoopCall):
    trainer = self._trainer
    restored = self._checkpoints.restore()
    if restored is None:
      raise ModelDirError("--on_nan=rollback: no checkpoint to roll back to")
    self.rollbacks += 1
    self.multiplier *= 0.5
    if trainer.cluster.is_chief:
      rollbacks.save(self._model_dir, rollbacks=self.rollbacks,
                     multiplier=self.multiplier, step=restored)
    if trainer.base_learning_rate is None:
      rate = "the task's learning-rate schedule is left as it is"
    else:
      self.apply_learning_rate()
      rate = f"learning rate halved to {self.learning_rate:g}"
    self._console.say(f"non-finite loss at step {call.step}: rolled back to step "
                      f"{restored} (rollback {self.rollbacks} of {MAX_ROLLBACKS}), "
                      f"{rate}")
    return ROLLED_BACK
