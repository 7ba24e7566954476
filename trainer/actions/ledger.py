"""Checks the replica ledger after every loop call: each replica got exactly one
per-replica batch per (micro-)step, or the run stops naming it (exit 6)."""

from trainer.actions.base import Action, LoopCall


class LedgerCheck(Action):
  """Raises ReplicaBatchError unless every replica got one batch per step."""

  def __init__(self, trainer):
    self._trainer = trainer

  def __call__(self, call: LoopCall):
    trainer = self._trainer
    trainer.train_ledger.check(
        expected_batches=call.num_steps * trainer.accum_steps,
        per_replica_batch_size=trainer.per_replica_batch_size,
        counts=(call.outputs["ledger_batches"], call.outputs["ledger_examples"]))
