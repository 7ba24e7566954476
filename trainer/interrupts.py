"""SIGTERM/SIGINT (and --requeue_signal) as a request to stop cleanly, whenever
it arrives.

The CLI installs the handlers before anything else, for the life of the process,
so a signal during set-up, training, the final evaluation or the export only sets
the request: the run stops at the next safe point (after a loop call, or between
those phases), saves, writes results.json with status "interrupted" and exits 4.
Repeated signals change nothing (no KeyboardInterrupt, no exit 130), also while
the process shuts down (`ignore_from_now`). The requeue signal (SIGUSR1 unless
--requeue_signal says otherwise: SLURM's warning before a job's time limit) stops
the run the same way; then the chief requeues the job (distribute/requeue.py).
"""

import contextlib
import signal
import threading
from typing import Optional

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_REQUEUE_SIGNAL = "USR1"
_requeue = getattr(signal, "SIG" + DEFAULT_REQUEUE_SIGNAL, None)  # Not on Windows.


def _handled() -> tuple:
  return _SIGNALS + ((_requeue,) if _requeue is not None else ())


def requeue_signal_name() -> Optional[str]:
  """The name of the signal that requeues the job ("SIGUSR1"), or None."""
  return None if _requeue is None else _requeue.name


class StopRequest:
  """Set by a signal handler; read by the run at its safe points."""

  def __init__(self):
    self.signal_name = None

  def __bool__(self):
    return self.signal_name is not None

  def _handle(self, signum, frame):
    del frame
    self.signal_name = self.signal_name or signal.Signals(signum).name


_REQUEST = StopRequest()
_installed_for_process = False
_active = False  # Our handlers are in force (installed, or inside stop_on_signals).


def install():
  """Makes SIGTERM and SIGINT set the process's stop request from now on."""
  global _installed_for_process, _active
  if threading.current_thread() is threading.main_thread():
    for sig in _handled():
      signal.signal(sig, _REQUEST._handle)
    _installed_for_process = _active = True


def refresh():
  """Registers the handlers again if they are in force: TensorFlow's start-up (the
  collective runtime of MultiWorkerMirroredStrategy) may replace them at the C
  level while Python still reports ours."""
  if _active and threading.current_thread() is threading.main_thread():
    for sig in _handled():
      signal.signal(sig, _REQUEST._handle)


def use_requeue_signal(name: str):
  """Makes `name` ("USR1", or "none") the signal that stops the run for a
  requeue, from now on; a signal that was it gets its default action back."""
  global _requeue
  wanted = None if name == "none" else getattr(signal, "SIG" + name, None)
  if wanted == _requeue:
    return
  in_force = _active and threading.current_thread() is threading.main_thread()
  if in_force and _requeue is not None:
    signal.signal(_requeue, signal.SIG_DFL)
  _requeue = wanted
  if in_force and wanted is not None:
    signal.signal(wanted, _REQUEST._handle)


@contextlib.contextmanager
def stop_on_signals(requeue_signal: str = DEFAULT_REQUEUE_SIGNAL):
  """Yields the process's StopRequest, its handlers installed for the duration.

  Handlers that `install` set for the whole process stay after the block; a
  Python caller's own handlers are restored (and a request made before the
  block, under them, does not count).

  Args:
    requeue_signal: --requeue_signal ("USR1", or "none").
  """
  global _active
  if (_installed_for_process or
      threading.current_thread() is not threading.main_thread()):
    use_requeue_signal(requeue_signal)
    yield _REQUEST
    return
  use_requeue_signal(requeue_signal)
  _REQUEST.signal_name = None
  previous = {s: signal.signal(s, _REQUEST._handle) for s in _handled()}
  _active = True
  try:
    yield _REQUEST
  finally:
    _active = False
    for sig, old in previous.items():
      signal.signal(sig, old)


def ignore_from_now():
  """Ignores SIGTERM and SIGINT from now on: the run is over (its checkpoint is
  saved), and Python's shutdown restores the default handlers, under which a
  signal during TensorFlow's teardown would kill the process (exit 143 or 130)
  instead of its exit code."""
  if threading.current_thread() is threading.main_thread():
    for sig in _handled():
      signal.signal(sig, signal.SIG_IGN)
