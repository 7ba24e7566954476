"""When a run stops on a signal, every worker stops together, and with what status.

A signal (SIGTERM, SIGINT, the requeue signal) reaches each worker at its own
moment. Between the phases of a run every worker votes (one collective, under
the hang watchdog), so all of them stop after the same phase with the
checkpoint of the same step. The status says how to go on: "requeued" once the
chief has requeued the SLURM job (the requeue signal, --requeue_signal), else
"interrupted" (rerun the same command).

Example:

  policy = StopPolicy(trainer=trainer, watchdog=watchdog, stop_request=request,
                      cluster=cluster, console=console)
  if policy.stopping("during set-up"):
    return results.finish(policy.stop_status())
"""

import os

from trainer import interrupts
from trainer.distribute import requeue
from trainer.errors import RunStatus


class StopPolicy:
  """Votes, stops and the status of a stop by signal."""

  def __init__(self, *, trainer, watchdog, stop_request, cluster, console):
    """Args:
      trainer: the run's Trainer (its stop vote and step).
      watchdog: the HangWatchdog that bounds each vote.
      stop_request: this process's interrupts.StopRequest.
      cluster: this process's place in the run.
      console: where the lines go.
    """
    self._trainer, self._watchdog = trainer, watchdog
    self._request, self._cluster, self._console = stop_request, cluster, console

  @property
  def cluster(self):
    return self._cluster

  def vote(self, phase: str, stop: bool) -> bool:
    """Whether any worker votes to stop `phase` (every worker must call it)."""
    with self._watchdog.guard(phase, step=self._trainer.step):
      return bool(self._trainer.stop_vote(int(stop)))

  def stopping(self, during: str) -> bool:
    """Whether a signal came (before or) `during` a phase on any worker: then
    every worker stops, keeping the checkpoint of this step."""
    if not self.vote(f"the stop vote {during}", bool(self._request)):
      return False
    self._console.say(
        f"{self._request.signal_name or 'a stop request'} {during}: the checkpoint "
        f"of step {self._trainer.step} is kept; rerun the same command to finish")
    return True

  def stop_status(self, status: RunStatus = RunStatus.INTERRUPTED) -> RunStatus:
    """The status of a stop by signal: REQUEUED where the requeue signal stopped
    the run (`status` REQUEUED, as the workers agreed, or this process's own
    signal) and the chief requeued the SLURM job (the chief does it here); else
    INTERRUPTED."""
    if status != RunStatus.REQUEUED and (
        self._request.signal_name != interrupts.requeue_signal_name()):
      return RunStatus.INTERRUPTED
    if not self._cluster.is_chief:
      return RunStatus.REQUEUED  # The chief requeues the job.
    requeued, line = requeue.requeue_job(os.environ)
    self._console.say(f"{interrupts.requeue_signal_name()}: {line}" + (
        "" if requeued else "; rerun the same command to resume"))
    return RunStatus.REQUEUED if requeued else RunStatus.INTERRUPTED

  def save_and_say(self, checkpoint, message: str):
    """The controller's stop: the checkpoint of this step (bounded by the
    watchdog: a collective save), then `message`."""
    with self._watchdog.guard("checkpoint", step=self._trainer.step):
      checkpoint.save()
    self._console.say(message)
