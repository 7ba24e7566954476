"""Warm trial processes: a server that imports TensorFlow once and forks each trial.

A short trial spends most of its time starting: Python, TensorFlow and Keras
imports are about half of it (see docs/sweeps.md). The fork server
is a process of the sweep that does those imports once, then forks one child per
trial; the child is a fresh `python -m trainer.main` run in all but the imports.
It runs the same argv as the cold command, so a trial's results do not depend on
how it was started (tests/test_sweep.py checks that).

What stays out of the server, because a forked child must set it up itself:
TensorFlow's runtime (no device is listed, no eager context exists, no thread
pool is made: the child splits the CPU into logical devices and sets its thread
counts as a cold process would), flags (absl parses the child's argv) and signal
handlers (the child installs the trainer's).

Protocol, one line each way: the sweep writes a JSON request {"argv": [...],
"log": PATH} (and "err": PATH for stderr apart and "python_path", as the tests'
run_cli wants, and "gate": PREFIX for a pruned sweep's trials); the
server answers "started PID" once the child is forked, and
"exited PID CODE" (Popen's returncode: negative for a signal) when it ends. The
server ignores SIGINT (a terminal's Ctrl-C reaches the trials and the sweep, which
stop them cleanly); on SIGTERM (e.g. to the whole process group) it passes it on
to its trials. Once its stdin closes or a SIGTERM came, it starts no more trials,
and it ends when its trials have, having reported each exit. A trial gets SIGTERM
when the server dies, and the server when the sweep dies (PR_SET_PDEATHSIG), as a
cold trial does when the sweep dies.

Example:

  server = ForkServer.start(env=dict(os.environ))  # None if it cannot start.
  process = server.spawn(["--model_dir=runs/s/t0", ...], log_path="t0.log")
  while process.poll() is None:
    time.sleep(0.25)
  server.close()
"""

import ctypes
import importlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Optional

from trainer.errors import ExitCode

_READY = "ready"
_START_SECONDS = 120.0  # The server's imports, on a slow or busy machine.
_REPLY_SECONDS = 30.0
_PR_SET_PDEATHSIG = 1
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class WarmProcess:
  """A trial forked by the server, with the parts of `subprocess.Popen` a sweep
  uses: pid, poll(), returncode, send_signal()."""

  def __init__(self, pid: int, server: "ForkServer"):
    self.pid = pid
    self._server = server
    self.returncode = None

  def poll(self) -> Optional[int]:
    if self.returncode is None:
      self.returncode = self._server.exit_code(self.pid)
    return self.returncode

  def send_signal(self, sig):
    if self.poll() is None:  # Not after it ended: its pid may be another's.
      try:
        os.kill(self.pid, sig)
      except ProcessLookupError:
        pass

  def kill(self):
    self.send_signal(signal.SIGKILL)

  def wait(self, timeout: Optional[float] = None) -> int:
    """Waits for the trial's end; its returncode.

    Raises:
      subprocess.TimeoutExpired: it still runs after `timeout` seconds.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.poll() is None:
      if deadline is not None and time.monotonic() > deadline:
        raise subprocess.TimeoutExpired(f"trial {self.pid}", timeout)
      time.sleep(0.02)
    return self.returncode


class ForkServer:
  """The sweep's side of the fork server (see the module docstring)."""

  def __init__(self, process: subprocess.Popen):
    self._process = process
    self._replies = queue.Queue()  # "started PID" lines, and errors.
    # pid -> returncode. No lock: a dict's get and set are atomic, and `poll` runs
    # in the sweep's signal handler, which must not wait for the reader thread.
    self._exits = {}
    self._reader = threading.Thread(target=self._read, name="fork-server-reader",
                                    daemon=True)
    self._reader.start()

  @classmethod
  def start(cls, *, env: dict, preexec_fn=None,
            cwd: Optional[str] = None) -> Optional["ForkServer"]:
    """Starts a server and waits for its imports; None (and a reason printed on
    stderr) if it cannot start, e.g. no fork on this platform.

    Args:
      env: the trials' environment.
      preexec_fn: run in the server's process before exec (PR_SET_PDEATHSIG).
      cwd: the trials' working directory (default: this process's).
    """
    if not hasattr(os, "fork"):
      return None
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer.sweeps.forkserver"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, env=env, text=True, bufsize=1,
        preexec_fn=preexec_fn, cwd=cwd)
    server = cls(process)
    reply = server._reply(_START_SECONDS)
    if reply == _READY:
      return server
    server.close()
    print(f"sweep: the fork server did not start ({reply}); trials start cold",
          file=sys.stderr, flush=True)
    return None

  def _read(self):
    """Sorts the server's lines: exits into the table, the rest to `_reply`."""
    try:
      for line in self._process.stdout:
        words = line.split()
        if len(words) == 3 and words[0] == "exited":
          self._exits[int(words[1])] = int(words[2])
        else:
          if len(words) == 2 and words[0] == "started":
            # Pids are reused: an earlier trial's exit under this pid is not
            # this one's. Dropped here, before its own "exited" line is read.
            self._exits.pop(int(words[1]), None)
          self._replies.put(line.strip())
    finally:
      self._replies.put("the fork server ended")

  def _reply(self, timeout: float) -> str:
    try:
      return self._replies.get(timeout=timeout)
    except queue.Empty:
      return f"no answer in {timeout:.0f}s"

  def exit_code(self, pid: int) -> Optional[int]:
    """A forked trial's returncode, or None while it runs."""
    code = self._exits.get(pid)
    if code is not None or self._reader.is_alive():
      return code  # While the reader runs, every exit the server saw is coming.
    # The server was killed (it reports every exit otherwise): its trials got a
    # SIGTERM; one that still runs is saving. Its exit code is lost with it.
    try:
      os.kill(pid, 0)
      return None
    except ProcessLookupError:
      return -signal.SIGTERM
    except PermissionError:
      return None

  def spawn(self, argv: list, *, log_path: str, err_path: Optional[str] = None,
            python_path: Optional[str] = None,
            gate: Optional[str] = None,
            env: Optional[dict] = None) -> WarmProcess:
    """Forks a trial: `python -m trainer.main *argv`, its output appended to
    log_path (stderr to err_path, if given), with PYTHONPATH=python_path if given
    (for a task module in another directory), its evaluations gated at the FIFOs
    of `gate` if given (trainer/sweeps/gate.py), and the variables of `env` set
    in its environment (a worker's TF_CONFIG: TensorFlow reads nothing of it
    before the trial makes its strategy).

    Raises:
      OSError: the server is gone or did not answer.
    """
    request = {"argv": argv, "log": log_path}
    if err_path:
      request["err"] = err_path
    if python_path:
      request["python_path"] = python_path
    if gate:
      request["gate"] = gate
    if env:
      request["env"] = dict(env)
    try:
      self._process.stdin.write(json.dumps(request) + "\n")
      self._process.stdin.flush()
    except (BrokenPipeError, ValueError) as e:
      raise OSError(f"the fork server is gone ({e})") from None
    reply = self._reply(_REPLY_SECONDS)
    if not reply.startswith("started "):
      # It may yet fork the trial, which nobody would track (and a cold start of
      # the same trial would find its model_dir locked): end the server, whose
      # trials then save and stop.
      self._process.send_signal(signal.SIGTERM)
      self.stop_starting()
      raise OSError(f"the fork server did not start the trial ({reply}); it is "
                    "stopped, its trials save and exit")
    return WarmProcess(int(reply.split()[1]), self)

  def stop_starting(self):
    """Lets the server start no more trials; those it runs go on, and their exits
    are still reported."""
    try:
      if self._process.stdin:
        self._process.stdin.close()
    except OSError:
      pass

  def close(self):
    """Ends the server once its trials have ended (after 10 s, at once: then
    those still running get SIGTERM, save and exit)."""
    self.stop_starting()
    try:
      self._process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      self._process.kill()
      self._process.wait()
    self._reader.join(timeout=10)


# The server's side: runs as `python -m trainer.sweeps.forkserver`.


# What every trial imports: TensorFlow and Keras (most of a cold start), the
# trainer, and the built-in data sets' loader.
_WARM_MODULES = ("tensorflow", "keras", "trainer.main", "trainer.training.run",
                 "trainer.tasks.classification", "trainer.tasks.regression",
                 "sklearn.datasets")


def _warm_up():
  """Imports what every trial imports, and nothing that starts TensorFlow's
  runtime (no device listed, no context: each child sets those up)."""
  from trainer import tf_loader
  tf_loader.load_tensorflow(probe_devices=False)
  for name in _WARM_MODULES:
    importlib.import_module(name)


def die_with_parent_function():
  """A function that makes the calling process get SIGTERM when its parent dies
  (prctl PR_SET_PDEATHSIG), for a child to call before exec or after fork. prctl
  is looked up here, in the parent: a child forked from a process with threads
  should not load libraries. None where there is no prctl (not Linux)."""
  try:
    prctl = ctypes.CDLL(None, use_errno=True).prctl
  except (OSError, AttributeError):
    return None
  return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _child(request: dict, die_with_parent, server_pid: int):
  """In the forked child: becomes `python -m trainer.main ARGV`; never returns."""
  code = 1
  try:
    # First the trainer's handlers: SIGINT/SIGTERM from now on is a clean stop
    # request (exit 4), as in a cold trainer from its first line.
    from trainer import interrupts
    interrupts.install()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # Blocked in fork.
    if die_with_parent is not None:
      die_with_parent()
    if os.getppid() != server_pid:  # The server died before prctl took effect.
      os._exit(int(ExitCode.INTERRUPTED))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, key in ((1, "log"), (2, "err" if "err" in request else "log")):
      log = os.open(request[key], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
      os.dup2(log, fd)
      os.close(log)
    os.close(null)
    os.environ.update(request.get("env", {}))
    if request.get("python_path"):  # As Python reads PYTHONPATH at start.
      os.environ["PYTHONPATH"] = request["python_path"]
      sys.path[1:1] = request["python_path"].split(os.pathsep)
    actions = []
    if request.get("gate"):  # Pruned at an evaluation: stops there (gate.py).
      from trainer.sweeps.gate import PruningGate
      gate = PruningGate.open(request["gate"])
      actions = [gate] if gate else []
    from trainer import main, tf_loader
    # The device probe the server left out, with its native lines held back: else
    # a flag validator of TensorFlow's makes it, and CUDA's lines reach the log.
    tf_loader.load_tensorflow()
    sys.argv = [main.__file__, *request["argv"]]  # As `python -m trainer.main`.
    main.run(actions=actions)
    code = 0
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if isinstance(e.code, str):  # As Python prints it on the way out.
      print(e.code, file=sys.stderr)
  except BaseException:  # noqa: BLE001
    traceback.print_exc()
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # noqa: BLE001
        pass
    os._exit(code)


def serve():
  """Reads requests on stdin, forks trials, reports starts and exits on stdout."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  children = set()
  terminated = []

  def pass_sigterm_on(signum, frame):
    del frame
    terminated.append(signum)
    for pid in list(children):
      try:
        os.kill(pid, signal.SIGTERM)
      except ProcessLookupError:
        pass

  signal.signal(signal.SIGTERM, pass_sigterm_on)
  out = sys.stdout.fileno()
  _warm_up()
  die_with_parent = die_with_parent_function()
  os.write(out, (_READY + "\n").encode())
  pending = b""
  stdin_open = True
  server_pid = os.getpid()
  while (stdin_open and not terminated) or children:
    if not stdin_open or terminated:
      time.sleep(0.1)
    elif select.select([0], [], [], 0.1)[0]:
      data = os.read(0, 65536)
      if not data:
        stdin_open = False  # The sweep is done: end once the trials have.
      pending += data
      while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        try:
          request = json.loads(line)
          request["argv"], request["log"]
        except (ValueError, KeyError, TypeError) as e:
          os.write(out, f"error: a bad request ({e})\n".encode())
          continue
        if terminated:  # Its SIGTERM was passed on already: start nothing new.
          os.write(out, b"error: the fork server is stopping\n")
          continue
        # Held until the child has the trainer's handlers (the server's would
        # signal the child's siblings).
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        pid = os.fork()
        if pid == 0:
          _child(request, die_with_parent, server_pid)
        children.add(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        os.write(out, f"started {pid}\n".encode())
    for pid in list(children):
      done, status = os.waitpid(pid, os.WNOHANG)
      if done:
        children.discard(pid)
        os.write(out, f"exited {pid} {os.waitstatus_to_exitcode(status)}\n".encode())


if __name__ == "__main__":
  serve()
