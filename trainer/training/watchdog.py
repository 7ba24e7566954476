"""The hang watchdog: every loop call, evaluation and checkpoint gets a deadline.

A distributed run can hang silently: a collective waits forever for a peer that
is stopped, swapped out or deadlocked. `HangWatchdog.guard` arms a deadline
around each phase; a background thread fires when one passes. Firing writes every
thread's Python stack and the last completed step to MODEL_DIR/hang-<worker>.txt
and stderr, lets the run mark results.json "hung", and ends the process with exit
code 7 (`os._exit`: the main thread is stuck, so no cleanup can be waited for).

A collective that fails because a peer is gone or stopped (the coordination
service missed its heartbeats) is reported the same way, right away, naming the
peer when TensorFlow does. Collectives have no timeout of their own
(distribute/devices.py says why): this deadline is theirs.

Example:

  watchdog = HangWatchdog(limit=None, directory="runs/r", worker="worker-0",
                          on_hang=lambda step: None)
  with watchdog:
    with watchdog.guard("loop call", step=0):
      ...  # Bounded by --hang_timeout (default: max(10 min, 20 x median call)).
    watchdog.completed(10)
"""

import collections
import contextlib
import os
import re
import statistics
import sys
import threading
import time
import traceback

import tensorflow as tf

from trainer.config import HANG_TIMEOUT_FLOOR_SECONDS
from trainer.errors import ExitCode, one_line

DEFAULT_CALL_MULTIPLE = 20  # --hang_timeout unset: 20 median loop calls or more.
_CALLS_KEPT = 200  # The median of the recent loop calls sets the default limit.
_STDERR_SECONDS = 10.0  # The hang report's stderr write may take this long.
LOOP_CALL = "loop call"
# What TensorFlow raises in a collective whose peer is gone or too slow.
PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)


def hang_file(directory: str, worker: str) -> str:
  return os.path.join(directory, f"hang-{worker}.txt")


def default_limit(call_seconds: list) -> float:
  """--hang_timeout's default: the larger of 10 minutes and 20 median calls."""
  median = statistics.median(call_seconds) if call_seconds else 0.0
  return max(HANG_TIMEOUT_FLOOR_SECONDS, DEFAULT_CALL_MULTIPLE * median)


def thread_stacks() -> str:
  """Every Python thread's current stack, main thread first."""
  names = {t.ident: t.name for t in threading.enumerate()}
  frames = sorted(sys._current_frames().items(),
                  key=lambda item: item[0] != threading.main_thread().ident)
  return "\n".join(f"Thread {names.get(ident, ident)}:\n" +
                   "".join(traceback.format_stack(frame))
                   for ident, frame in frames)


def peer_of(message: str):
  """The first task a TensorFlow collective error names (/job:worker/replica:0/
  task:1, or as the coordination service writes it /job:worker/task:1 -> "worker
  1"), or None."""
  match = re.search(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)", message)
  return f"{match.group(1)} {match.group(2)}" if match else None


def _gist(message: str) -> str:
  """The line of a TensorFlow error that says what happened (not "Graph
  execution error:" or a node's traceback)."""
  lines = [line.strip() for line in message.splitlines() if line.strip()]
  telling = [line for line in lines if "unhealthy" in line or
             "timed out" in line.lower() or "Error reported from" in line]
  return one_line((telling or lines[-1:] or ["no message"])[0])


def _at(phase: str, step) -> str:
  return phase if step is None else f"{phase} at step {step}"


class HangWatchdog:
  """Deadlines around the phases of a run; on a hang, a report and exit 7."""

  def __init__(self, *, limit, directory: str, worker: str = "worker-0",
               on_hang=None, out=None):
    """Creates the watchdog (start it with `with watchdog:`).

    Args:
      limit: seconds a phase may take (--hang_timeout), or None for the default
        (see `default_limit`).
      directory: where hang-<worker>.txt goes (the model_dir; made if need be).
      worker: this process's name in the cluster, e.g. "worker-1" (`identify`
        sets it once the cluster is known).
      on_hang: `on_hang(last_completed_step)`, called before the exit (e.g. to
        write results.json); it must not wait for TensorFlow. Settable later
        as the attribute `on_hang`.
      out: where the report is printed (default stderr).
    """
    self._limit = limit
    self._directory = directory
    self._worker = worker
    self.on_hang = on_hang
    self._out = out or sys.stderr
    self._call_seconds = collections.deque(maxlen=_CALLS_KEPT)
    self._reported = threading.Lock()  # One report, from whichever thread is first.
    self._last_step = None
    self._armed = None  # (phase, step, started, deadline) while a phase runs.
    self._wake = threading.Condition()
    self._stopped = False
    self._thread = threading.Thread(target=self._watch, name="hang-watchdog",
                                    daemon=True)

  def start(self):
    """Starts watching (in a daemon thread)."""
    self._thread.start()

  def stop(self):
    """Stops watching; a phase still armed is no longer bounded."""
    with self._wake:
      self._stopped = True
      self._wake.notify()
    if self._thread.is_alive():
      self._thread.join()

  def __enter__(self):
    self.start()
    return self

  def __exit__(self, *exc):
    self.stop()

  def identify(self, worker: str):
    """Names this process in its hang report (`Cluster.worker`)."""
    self._worker = worker

  @property
  def limit(self) -> float:
    """Seconds the next phase may take."""
    return self._limit if self._limit is not None else default_limit(
        self._call_seconds)

  def completed(self, step: int):
    """Notes that the run has completed `step` (named in a hang report)."""
    self._last_step = step

  @property
  def last_completed_step(self):
    """The last step `completed` noted (None before the first)."""
    return self._last_step

  def progressed(self):
    """Gives the phase now armed a new deadline: it is making progress (e.g. a
    replay of many steps, each bounded like a loop call)."""
    with self._wake:
      if self._armed is not None:
        phase, step, started, _ = self._armed
        self._armed = (phase, step, started, time.monotonic() + self.limit)
        self._wake.notify()

  @contextlib.contextmanager
  def guard(self, phase: str, *, step: int, default_at_least: float = 0.0):
    """Bounds the block by `limit` seconds; a peer's collective error inside it is
    reported as a hang at once.

    Args:
      phase: what the block does, e.g. "loop call" (whose durations set the
        default limit), "evaluation", "checkpoint", "set-up".
      step: the global step the phase starts at (None: before the trainer
        has one).
      default_at_least: without --hang_timeout, the phase may take at least
        this long (a set-up runs the user's own Task.prepare).
    """
    started = time.monotonic()
    limit = self.limit if self._limit is not None else max(self.limit,
                                                          default_at_least)
    with self._wake:
      self._armed = (phase, step, started, started + limit)
      self._wake.notify()
    try:
      yield
    except PEER_ERRORS as e:
      peer = peer_of(str(e))
      self.report(f"{_at(phase, step)} failed in a collective"
                  + (f" waiting for {peer}" if peer else "")
                  + f" ({type(e).__name__}: {_gist(str(e))})")
    finally:
      with self._wake:
        self._armed = None
    if phase == LOOP_CALL:
      self._call_seconds.append(time.monotonic() - started)

  def _watch(self):
    with self._wake:
      while not self._stopped:
        armed = self._armed
        if armed is None:
          self._wake.wait()
          continue
        remaining = armed[3] - time.monotonic()
        if remaining > 0:
          self._wake.wait(remaining)
          continue
        phase, step, started, _ = armed
        break
      else:
        return
    self.report(f"{_at(phase, step)} made no progress for "
                f"{time.monotonic() - started:.0f}s (--hang_timeout "
                f"{armed[3] - started:g}s)")

  def report(self, why: str):
    """Writes the hang report (file, results via on_hang, then stderr) and exits 7.

    The file and results.json come first: stderr may be a pipe nobody reads. A
    second report (the watchdog thread and a collective error at once) waits for
    the first one's exit.
    """
    self._reported.acquire()  # Never released: the process ends below.
    with self._wake:
      self._armed = None  # Disarmed: the watchdog thread does not report again.
    done = ("before the first step" if self._last_step is None else
            f"last completed step {self._last_step}")
    headline = (f"hang on {self._worker}: {why}; {done}. Rerun the same command "
                "to resume from the last checkpoint")
    path = hang_file(self._directory, self._worker)
    try:
      stacks = thread_stacks()
      where = path
      try:
        os.makedirs(self._directory, exist_ok=True)
        with open(path, "w") as f:
          f.write(f"{headline}\n\n{stacks}")
      except OSError as e:
        where = f"not written: {e}"
      try:
        if self.on_hang is not None:
          self.on_hang(self._last_step)
      finally:
        # A full pipe nobody reads would block the write: exit 7 regardless.
        timer = threading.Timer(_STDERR_SECONDS, os._exit, [int(ExitCode.HUNG)])
        timer.daemon = True
        timer.start()
        self._out.write(f"error: {headline} (stacks: {where})\n{stacks}")
        self._out.flush()
    finally:
      os._exit(int(ExitCode.HUNG))
