"""SIGTERM/SIGINT as a request to stop after the current loop call."""

import contextlib
import signal
import threading


class StopRequest:
  """Set by a signal handler; read by the training loop between loop calls."""

  def __init__(self):
    self.signal_name = None

  def __bool__(self):
    return self.signal_name is not None


@contextlib.contextmanager
def stop_on_signals():
  """Yields a StopRequest that SIGTERM and SIGINT set (in the main thread only)."""
  request = StopRequest()
  if threading.current_thread() is not threading.main_thread():
    yield request
    return

  def handler(signum, frame):
    del frame
    request.signal_name = signal.Signals(signum).name

  previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield request
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)
