"""--reduce_lr_patience=P: Keras' ReduceLROnPlateau. At every P-th evaluation in
a row without --best_metric improving by --early_stopping_min_delta (the count
Evaluate keeps for early stopping), the peak learning rate is multiplied by
--reduce_lr_factor, never below --min_learning_rate. The factor so far lives in
the run record, so a resume (or a rollback) goes on at the rate its checkpoint
had."""

from trainer.actions.base import Action, LoopCall


class ReduceOnPlateau(Action):
  """Lowers the learning rate when evaluations stall."""

  def __init__(self, *, evaluate, checkpoints, checkpoint, nan_policy, console,
               patience: int, factor: float, min_rate: float, base_rate, metric: str):
    """Args:
      evaluate: the Evaluate action (which evaluation ran at a step).
      checkpoints: the run's Checkpoints (its record keeps the factor).
      checkpoint: the Checkpoint action, asked to save at a reduction's step, so
        a replay from a checkpoint trains at the rate the run did.
      nan_policy: the NanPolicy, which sets the rate (rollbacks halve it too).
      console: the run's output channel.
      patience: --reduce_lr_patience (0: off).
      factor: --reduce_lr_factor.
      min_rate: --min_learning_rate.
      base_rate: the optimizer's rate as built (None: the task's own schedule,
        which this leaves alone).
      metric: --best_metric, for the line it says.
    """
    self._evaluate = evaluate
    self._checkpoints = checkpoints
    self._checkpoint = checkpoint
    self._nan_policy = nan_policy
    self._console = console
    self._patience = patience if base_rate is not None else 0
    self._factor = factor
    self._min_rate = min_rate
    self._metric = metric

  def __call__(self, call: LoopCall):
    if not self._patience or self._evaluate.metrics_at(call.step) is None:
      return None
    record = self._checkpoints.record
    stalled = record.evals_without_improvement
    if not stalled or stalled % self._patience:
      return None
    before = self._nan_policy.learning_rate
    # The peak rate never goes below --min_learning_rate (whatever rollbacks left),
    # and a reduction never raises it (a rate already below the floor stays).
    lowest = record.lr_plateau_factor * self._min_rate / before if before else 0.0
    factor = min(record.lr_plateau_factor,
                 max(record.lr_plateau_factor * self._factor, lowest))
    if factor == record.lr_plateau_factor:
      return None  # At the floor: nothing changes, nothing to say.
    record.lr_plateau_factor = factor
    self._nan_policy.apply_learning_rate()
    self._checkpoint.request()
    self._console.say(f"{stalled} evaluations without {self._metric} improving: "
                      f"learning rate {before:g} -> "
                      f"{self._nan_policy.learning_rate:g} at step {call.step}")
    return None
