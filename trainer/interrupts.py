"""SIGTERM/SIGINT as a request to stop cleanly, whenever it arrives.

The CLI installs the handlers before anything else, for the life of the process,
so a signal during set-up, training, the final evaluation or the export only sets
the request: the run stops at the next safe point (after a loop call, or between
those phases), saves, writes results.json with status "interrupted" and exits 4.
Repeated signals change nothing (no KeyboardInterrupt, no exit 130), also while
the process shuts down (`ignore_from_now`).
"""

import contextlib
import signal
import threading

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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
    for sig in _SIGNALS:
      signal.signal(sig, _REQUEST._handle)
    _installed_for_process = _active = True


def refresh():
  """Registers the handlers again if they are in force: TensorFlow's start-up (the
  collective runtime of MultiWorkerMirroredStrategy) may replace them at the C
  level while Python still reports ours."""
  if _active and threading.current_thread() is threading.main_thread():
    for sig in _SIGNALS:
      signal.signal(sig, _REQUEST._handle)


@contextlib.contextmanager
def stop_on_signals():
  """Yields the process's StopRequest, its handlers installed for the duration.

  Handlers that `install` set for the whole process stay after the block; a
  Python caller's own handlers are restored (and a request made before the
  block, under them, does not count).
  """
  global _active
  if (_installed_for_process or
      threading.current_thread() is not threading.main_thread()):
    yield _REQUEST
    return
  _REQUEST.signal_name = None
  previous = {s: signal.signal(s, _REQUEST._handle) for s in _SIGNALS}
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
    for sig in _SIGNALS:
      signal.signal(sig, signal.SIG_IGN)
