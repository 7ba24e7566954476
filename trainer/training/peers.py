"""A worker's own failure, told to its peers at once; a peer's, told in one line.

Under `--strategy=multi_worker` a worker that fails on its own (a bad record in
its files, a task method that raises on it, a flag its environment refuses) would
leave the others waiting in their next collective until TensorFlow's coordination
service misses its heartbeats, or until the hang watchdog (--hang_timeout) stops
them. Instead, `failures_shared` reports such an error to the cluster's
coordination service before the worker exits: the others' collectives abort at
once, and each stops with one line naming the worker that failed and why (exit 7,
"a peer was lost"), keeping every checkpoint:

  error: worker 1 failed: Task.prepare raised ValueError: ...; this worker stopped
  with it, and the checkpoints written so far are kept. ...

Ends every worker meets at the same step (divergence, a ledger mismatch, a stop)
are not reported: each worker ends on its own, as without a cluster.
"""

import contextlib
import faulthandler
import threading

import tensorflow as tf

from trainer import internals
from trainer.errors import ExitCode, TrainerError, UserCodeError, one_line
from trainer.training.watchdog import PEER_ERRORS, peer_of

# The exits a worker can reach alone while the others wait for it. Every worker
# reaches the others at the same step (and the chief's export, UNEXPORTED, comes
# after the others are done). Some of these every worker may also meet at once
# (a flag all of them refuse): each then stops with its own line, or, if a
# peer's report comes first, with the peer's line naming the same error.
OWN_FAILURES = (ExitCode.INTERNAL, ExitCode.BAD_INPUT, ExitCode.LOCKED,
                ExitCode.NO_SPACE)
# How TensorFlow says which worker's report aborted a collective, and which
# workers stopped sending heartbeats.
_REPORTED = "Error reported from "
_UNHEALTHY = "unhealthy (stopped sending heartbeats)"
# The report is an RPC to the coordination service without a deadline (a chief
# that is gone fails it at once; one that is stopped never answers): a worker
# waits about this long, then goes on to its own exit (or, where TensorFlow
# holds the interpreter's lock meanwhile, exits 1 with its threads' stacks).
REPORT_SECONDS = 5.0


class PeerFailedError(TrainerError):
  """Another worker of the cluster failed (or was lost); this one stopped too."""
  exit_code = ExitCode.HUNG


def _tf_error(error):
  """The TensorFlow error behind `error` (itself, or a user method's cause)."""
  if isinstance(error, UserCodeError):
    error = error.__cause__
  return error if isinstance(error, PEER_ERRORS + (tf.errors.AbortedError,)) else None


def peer_failure(error):
  """What a peer's failure that aborted this worker's collective says ("worker 1
  failed: ..."), or None when `error` is not one."""
  cause = _tf_error(error)
  if cause is None:
    return None
  message = str(cause)
  if _UNHEALTHY in message:  # Its own process ended without a report.
    lost = peer_of(message.split(_UNHEALTHY, 1)[1]) or "a peer"
    return f"{lost} stopped sending heartbeats (it crashed, was killed or was lost)"
  if _REPORTED in message:
    reported = message.split(_REPORTED, 1)[1]
    failed = peer_of(reported) or "a peer"
    return f"{failed} failed: {one_line(reported.split(': ', 1)[-1])}"
  return None


def tell_peers(error):
  """Reports `error` to the cluster's coordination service, if this process is a
  worker of one; best effort (the service may be gone), and bounded by
  REPORT_SECONDS."""
  ctx = internals.eager_context()
  if not ctx.coordination_service:
    return
  what = one_line(error)
  if not isinstance(error, TrainerError):  # A bug's message may not name it.
    what = f"{type(error).__name__}: {what}"

  def report():
    try:
      ctx.report_error_to_cluster(tf.errors.ABORTED, what)
    except Exception:  # noqa: BLE001 (the exit that follows says what went wrong)
      pass

  reporter = threading.Thread(target=report, name="tell-peers", daemon=True)
  # The report holds the interpreter's lock while it waits, which join's timeout
  # cannot undo: past the bound, faulthandler (no lock needed) dumps the stacks
  # and exits 1.
  faulthandler.dump_traceback_later(REPORT_SECONDS + 1.0, exit=True)
  try:
    reporter.start()
    reporter.join(REPORT_SECONDS)
  finally:
    faulthandler.cancel_dump_traceback_later()


def reported(error) -> bool:
  """Whether `failures_shared` tells the peers of `error`: a failure this worker
  can meet alone (exit 1, 2, 5, 9), not a collective's own error (a peer's, or
  one it cannot tell apart from a peer's) and not an end every worker meets at
  the same step."""
  if _tf_error(error) is not None:
    return False
  return not isinstance(error, TrainerError) or error.exit_code in OWN_FAILURES


@contextlib.contextmanager
def failures_shared():
  """Reports this worker's own failures in the block to its peers, and turns a
  peer's failure into a one-line PeerFailedError.

  Raises:
    PeerFailedError: a collective in the block aborted because a peer failed.
  """
  try:
    yield
  except Exception as e:
    peer = peer_failure(e)
    if peer is not None:
      raise PeerFailedError(
          f"{peer}; this worker stopped with it, and the checkpoints written so "
          "far are kept. Mend that worker and rerun the same command on every "
          "worker") from e
    if reported(e):
      tell_peers(e)
    raise
