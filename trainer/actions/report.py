"""Records each loop call: results.json's numbers and the progress line (the
call's), and TensorBoard's train scalars (loss, metrics, learning rate, gradient
norm, throughput, the replica ledger) at every --summary_every steps, from the
rows the train loop recorded inside the call (TrainLoop's "history"): a curve
gets about 100 points per run without a loop call ending for each."""

import numpy as np

from trainer.actions.base import Action, LoopCall

# TensorBoard's Custom Scalars tab: the charts that compare lines.
LAYOUT = {
    "ledger": {"replica_batches: one line per replica, on top of each other":
               [r"^replica_batches/replica_\d+$"]},
    "loss": {"loss: train and eval": [r"^loss$"]},
}


class Report(Action):
  """Writes a call's metrics to results.json and the progress line, and its
  history rows to TensorBoard."""

  def __init__(self, *, trainer, results, summaries, console, clip_norm: float):
    self._trainer = trainer
    self._results = results
    self._summaries = summaries
    self._console = console
    self._clip_norm = clip_norm
    # (step the previous call ended at, {sum column: minus its sums after its last
    # row}): the next call's first point takes in those steps too.
    self._carry = (None, {})

  def __call__(self, call: LoopCall):
    trainer = self._trainer
    if call.index == 1:
      self._summaries.layout("train", LAYOUT)
    self._results.record_train_call(step=call.step, steps=call.num_steps,
                                    metrics=call.metrics)
    examples_per_second = (call.num_steps * trainer.global_batch_size *
                           trainer.accum_steps / call.seconds)
    # The first call of a process traced the loop: its time is compilation's.
    self._console.report(call.step, call.metrics,
                         examples_per_second=examples_per_second,
                         compiled_seconds=call.seconds if call.index == 1 else None)
    if self._summaries.enabled:
      self._write_points(call)

  def _write_points(self, call: LoopCall):
    """A point per history row; a matrix metric (a confusion matrix) and the
    streaming metrics' call results at the call's last step."""
    trainer = self._trainer
    columns = trainer.history_columns
    outputs = call.outputs
    replicas = trainer.train_ledger.total_batches - outputs["ledger_batches"]
    start = call.step - call.num_steps
    previous = dict.fromkeys(columns, 0.0)
    previous.update(step=start)
    if self._carry[0] == start:  # Not after a rollback, nor in a new process.
      previous.update(self._carry[1])
    # Rates are the call's: a timestamp op in the loop would break
    # --deterministic, and the steps of one call run at one pace. The first call
    # of a process traced the loop: its rate is compilation's, and left out.
    steps_per_second = None if call.index == 1 else call.num_steps / call.seconds
    # A matrix metric (rows hold only scalars) is the whole call's at each point.
    matrices = {name: np.asarray(outputs[name])
                for name in trainer.objective.streaming
                if name not in trainer.objective.scalar_streaming}
    for values in outputs["history"]:
      row = dict(zip(columns, values.tolist()))
      self._summaries.scalars("train", int(row["step"]),
                              self._point(previous, row, matrices, replicas,
                                          steps_per_second))
      previous = row
    sums = ("loss", "examples", "weight", "clipped", *trainer.metric_names)
    self._carry = (call.step, dict(step=previous["step"], **{
        name: previous[name] - float(outputs[name]) for name in sums}))
    at_end = {name: value for name, value in call.metrics.items()
              if isinstance(value, list) or name in trainer.objective.streaming}
    if at_end and previous["step"] != call.step:
      self._summaries.scalars("train", call.step, at_end)
    elif at_end:  # The row at the call's end wrote the running values.
      self._summaries.scalars("train", call.step, {
          name: value for name, value in at_end.items() if isinstance(value, list)})

  def _point(self, previous: dict, row: dict, matrices: dict, replicas_before,
             steps_per_second) -> dict:
    """The scalars of the steps from the previous row (or the call's start) to
    `row`: means over those steps, the ledger so far, and the call's rate (unless
    None)."""
    trainer = self._trainer
    steps = row["step"] - previous["step"]
    sums = {name: row[name] - previous[name]
            for name in ("loss", "weight", *trainer.metric_names)}
    means = {"loss": sums["loss"] / steps}
    means.update({name: sums[name] / sums["weight"] if sums["weight"] else 0.0
                  for name in trainer.metric_names})
    examples = row["examples"] - previous["examples"]
    # A streaming metric's point: its result over the call so far.
    streaming = dict(matrices, **{name: row[name]
                                  for name in trainer.objective.scalar_streaming})
    values = dict(trainer.objective.report(means, sums=sums, examples=int(examples),
                                           streaming=streaming),
                  learning_rate=row["learning_rate"],
                  gradient_norm=row["gradient_norm"])
    if steps_per_second is not None:
      values.update(steps_per_second=steps_per_second,
                    examples_per_second=examples / steps * steps_per_second)
    if self._clip_norm:
      values["clipped_fraction"] = (row["clipped"] - previous["clipped"]) / steps
    ledger = np.asarray(replicas_before) + [
        row[f"replica_{i}"] for i in range(trainer.train_ledger.num_replicas)]
    values.update({f"replica_batches/replica_{i}": float(n)
                   for i, n in enumerate(ledger)})
    return {name: value for name, value in values.items()
            if not isinstance(value, list)}
