"""Records each loop call: results.json's numbers, TensorBoard's train scalars
(loss, metrics, learning rate, gradient norm, throughput, the replica ledger) and
the progress line. --summary_every caps the steps between two records."""

from trainer.actions.base import Action, LoopCall, next_multiple

# TensorBoard's Custom Scalars tab: the charts that compare lines.
LAYOUT = {
    "ledger": {"replica_batches: one line per replica, on top of each other":
               [r"^replica_batches/replica_\d+$"]},
    "loss": {"loss: train and eval": [r"^loss$"]},
}


class Report(Action):
  """Writes the call's metrics to results.json, TensorBoard and the progress line."""

  def __init__(self, *, trainer, results, summaries, console, clip_norm: float,
               summary_every: int):
    self._trainer = trainer
    self._results = results
    self._summaries = summaries
    self._console = console
    self._clip_norm = clip_norm
    self._every = summary_every

  def next_stop(self, step):
    return next_multiple(step, self._every) if self._every else None

  def __call__(self, call: LoopCall):
    trainer = self._trainer
    if call.index == 1:
      self._summaries.layout("train", LAYOUT)
    self._results.record_train_call(step=call.step, steps=call.num_steps,
                                    metrics=call.metrics)
    examples_per_second = (call.num_steps * trainer.global_batch_size *
                           trainer.accum_steps / call.seconds)
    ledger = trainer.train_ledger.total_batches
    clipping = ({"clipped_fraction": call.outputs["clipped"] / call.num_steps}
                if self._clip_norm else {})
    self._summaries.scalars("train", call.step, {
        **call.metrics, "gradient_norm": call.outputs["gradient_norm"], **clipping,
        "learning_rate": call.outputs["learning_rate"],
        "examples_per_second": examples_per_second,
        "steps_per_second": call.num_steps / call.seconds,
        **{f"replica_batches/replica_{i}": n for i, n in enumerate(ledger)}})
    self._console.report(call.step, call.metrics,
                         examples_per_second=examples_per_second)
