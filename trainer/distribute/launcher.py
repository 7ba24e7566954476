"""A local multi-worker cluster: N `trainer.main` processes on 127.0.0.1.

Rehearses `--strategy=multi_worker` on one machine: each worker gets free ports and
the TF_CONFIG a cluster manager (Kubernetes' TF operator, say) would give it, its
output is streamed with a `[worker i]` prefix, and the launcher returns the chief's
exit code. A worker that dies makes the others useless (their collectives would
wait for it forever), so the launcher stops them and says who died and how.

Used by `scripts/launch_workers.py`; `launch` is the Python API.
"""

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

from trainer import argparsing

HOST = "127.0.0.1"
_POLL_SECONDS = 0.1


def free_ports(count: int) -> list:
  """`count` distinct TCP ports on 127.0.0.1 that were free a moment ago."""
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind((HOST, 0))
      sockets.append(s)  # Held open until all are chosen, so they differ.
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def tf_config(ports: list, index: int, *, evaluator_port=None,
              task_type: str = "worker") -> str:
  """The TF_CONFIG of worker `index` (or, task_type "evaluator", of the
  evaluator) in a cluster of workers on `ports`, and an evaluator on
  `evaluator_port` if given."""
  cluster = {"worker": [f"{HOST}:{p}" for p in ports]}
  if evaluator_port is not None:
    cluster["evaluator"] = [f"{HOST}:{evaluator_port}"]
  return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


_HUNG = 7  # trainer's ExitCode.HUNG (not imported: the launcher loads no TF).
_INTERRUPTED = 4  # ExitCode.INTERRUPTED: stopped by a signal, with a checkpoint.


def describe_exit(returncode: int) -> str:
  """'exit code 3' or 'killed by SIGKILL', for a Popen return code."""
  if returncode < 0:
    try:
      return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
      return f"killed by signal {-returncode}"
  if returncode == _HUNG:
    return (f"exit code {_HUNG} (a hang, or a peer lost or failed; its hang-*.txt "
            "or last line says where)")
  return f"exit code {returncode}"


def process_state(pid: int):
  """The kernel's one-letter state of a process ("T" when stopped), or None."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0]
  except (OSError, IndexError):
    return None


def shell_code(returncode: int) -> int:
  """A Popen return code as a shell would report it (128 + signal when killed)."""
  return 128 - returncode if returncode < 0 else returncode


class _Worker:
  """One worker process, the thread that streams its output and the one that
  reports its exit (to `exits`, in the order the workers end)."""

  def __init__(self, index, command, env, out, out_lock, exits: queue.Queue, *,
               label=None):
    self.index = index
    self.name = label or ("chief (worker 0)" if index == 0 else f"worker {index}")
    self._prefix = f"[{label or f'worker {index}'}]"
    self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1)
    self._thread = threading.Thread(target=self._stream, args=(out, out_lock),
                                    daemon=True)
    self._thread.start()
    # wait() returns as the kernel reaps the process, so the queue holds the
    # workers in the order they died, however close together.
    threading.Thread(target=lambda: (self.process.wait(), exits.put(self)),
                     daemon=True).start()

  def _stream(self, out, out_lock):
    for line in self.process.stdout:
      with out_lock:
        out.write(f"{self._prefix} {line}")
        out.flush()

  def signal(self, signum):
    if self.process.poll() is None:
      self.process.send_signal(signum)

  def finish_streaming(self):
    self._thread.join(timeout=5)


def launch(trainer_args: list, *, num_workers: int, grace_seconds: float = 10.0,
           out=None, program=(sys.executable, "-m", "trainer.main"),
           evaluator: bool = False, strategy_flag: bool = True) -> int:
  """Runs `python -m trainer.main TRAINER_ARGS --strategy=multi_worker` N times
  (or another program: a Keras program's trainer.fit reads TF_CONFIG itself).

  Args:
    trainer_args: trainer flags, the same for every worker (e.g. --flagfile=...,
      --model_dir=...).
    num_workers: how many worker processes; worker 0 is the chief.
    grace_seconds: after a worker dies, how long the others get to exit on SIGTERM
      before they are killed.
    out: where worker output and launcher messages go (default stdout).
    program: the command each worker runs before the flags (tests give another).
    evaluator: also start an evaluator (TF_CONFIG task type "evaluator", which
      runs --mode=continuous_eval), beside the workers: it ends on its own once
      training finished and its last checkpoint is evaluated; it is stopped
      when training fails. Its failure fails nothing of training's.
    strategy_flag: add --strategy=multi_worker to the command (False: a
      program that is not trainer.main's command line).

  Returns:
    The chief's exit code when every worker ends on its own; otherwise the exit
    code of the first worker that failed (128 + signal if it was killed), which
    the launcher names.
  """
  out = out or sys.stdout
  out_lock = threading.Lock()

  def say(message):
    with out_lock:
      out.write(f"launch_workers: {message}\n")
      out.flush()

  *ports, evaluator_port = free_ports(num_workers + 1)
  evaluator_port = evaluator_port if evaluator else None
  command = [*program, *trainer_args]
  if strategy_flag:
    command.append("--strategy=multi_worker")  # Last: it overrides a flagfile's.
  say(f"{num_workers} workers on {', '.join(f'{HOST}:{p}' for p in ports)}"
      + (f", an evaluator on {HOST}:{evaluator_port}" if evaluator else ""))
  workers, exits = [], queue.Queue()
  for index in range(num_workers):
    env = dict(os.environ, TF_CONFIG=tf_config(ports, index,
                                                 evaluator_port=evaluator_port),
               PYTHONUNBUFFERED="1")
    workers.append(_Worker(index, command, env, out, out_lock, exits))
    say(f"started {workers[-1].name} (pid {workers[-1].process.pid})")
  sidecar = None
  if evaluator:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CONFIG=tf_config(
        ports, 0, evaluator_port=evaluator_port, task_type="evaluator"))
    sidecar = _Worker(-1, command, env, out, out_lock, queue.Queue(),
                      label="evaluator")
    say(f"started the evaluator (pid {sidecar.process.pid})")
  interrupt = _Interrupt(workers + ([sidecar] if sidecar else []), say)
  previous = {s: signal.signal(s, interrupt.forward)
              for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    failed = _wait(workers, exits, interrupt, grace_seconds, say)
    if sidecar is not None:
      _wait_for_evaluator(sidecar, training_ok=not failed and
                          workers[0].process.returncode == 0, say=say)
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)
    for worker in workers + ([sidecar] if sidecar else []):
      worker.signal(signal.SIGKILL)
      worker.process.wait()
      worker.finish_streaming()
  code = (failed or workers[0]).process.returncode
  return shell_code(code)


def _wait_for_evaluator(sidecar, *, training_ok: bool, say):
  """Lets the evaluator finish the run's last checkpoints (it ends on its own
  once the run's results.json says it finished), or stops it (SIGTERM) when
  training did not finish; says how it ended."""
  if not training_ok:
    sidecar.signal(signal.SIGTERM)
  returncode = sidecar.process.wait()
  if returncode:
    say(f"the evaluator (pid {sidecar.process.pid}) ended with "
        f"{describe_exit(returncode)}")


class _Interrupt:
  """SIGINT/SIGTERM to the launcher, passed to every worker (a second one kills)."""

  def __init__(self, workers, say):
    self._workers, self._say = workers, say
    self.since = None  # When the launcher was first asked to stop.

  def forward(self, signum, frame):
    del frame
    if self.since is not None:  # A second signal: do not wait for a clean stop.
      for worker in self._workers:
        worker.signal(signal.SIGKILL)
    self.since = self.since or time.monotonic()
    self._say(f"{signal.Signals(signum).name}: asking every worker to save and stop")
    for worker in self._workers:
      worker.signal(signal.SIGTERM)


def _wait(workers, exits: queue.Queue, interrupt: _Interrupt, grace_seconds: float,
          say):
  """Waits for every worker to end; when one fails (not after an interrupt),
  names the first to die and stops the others. Returns that worker, or None."""
  ended = set()
  while len(ended) < len(workers):
    try:
      worker = exits.get(timeout=_POLL_SECONDS)
    except queue.Empty:
      # Workers agree on a step to stop at and exit together; give them time.
      if interrupt.since and time.monotonic() - interrupt.since > grace_seconds + 60:
        _kill_running(workers, say, "did not stop after the interrupt")
      continue
    ended.add(worker)
    if interrupt.since is None and worker.process.returncode == _INTERRUPTED:
      # A stop requested by a worker's own signal (a preempted machine): every
      # worker agreed on its step in the stop vote and saved; they end too.
      say(f"{worker.name} (pid {worker.process.pid}) stopped at the step the "
          f"workers agreed on (exit {_INTERRUPTED}, a signal to a worker); waiting "
          "for the others")
      interrupt.since = time.monotonic()
      continue
    if interrupt.since is None and worker.process.returncode != 0:
      failed = _first_to_die(worker, workers, ended, exits)
      say(f"{failed.name} (pid {failed.process.pid}) failed: "
          f"{describe_exit(failed.process.returncode)}; stopping the other workers")
      _kill_stopped(workers, say)
      _stop(workers, grace_seconds, say)
      return failed
  return None


def _first_to_die(failed, workers, ended: set, exits: queue.Queue):
  """The worker whose death the others' follow from.

  A worker that exits 7 lost a peer: the peer died first, though its exit may be
  seen later. Every other worker already dead (a zombie, or reaped) is reported
  in `exits` at once, so those are waited for (and added to `ended`); of the
  dead, one that did not exit 7 is the cause.
  """
  if failed.process.returncode != _HUNG:
    return failed
  dead = [w for w in workers if w not in ended and (
      w.process.returncode is not None or
      process_state(w.process.pid) in ("Z", None))]
  while dead:
    worker = exits.get()  # A dead worker's exit is reported without delay.
    ended.add(worker)
    if worker in dead:
      dead.remove(worker)
    if worker.process.returncode not in (0, _HUNG):
      return worker
  return failed


def _stop(workers, grace_seconds, say):
  for worker in workers:
    worker.signal(signal.SIGTERM)
  deadline = time.monotonic() + grace_seconds
  while time.monotonic() < deadline and any(w.process.poll() is None for w in workers):
    time.sleep(_POLL_SECONDS)
  _kill_running(workers, say, f"did not stop within {grace_seconds:g}s")


def _kill_stopped(workers, say):
  """Names and kills the workers that are stopped (SIGSTOP, a debugger): they
  cannot take part in a collective, so the others hung waiting for them."""
  for worker in workers:
    stopped = process_state(worker.process.pid) in ("T", "t")
    if worker.process.poll() is None and stopped:
      say(f"{worker.name} (pid {worker.process.pid}) is stopped (process state T): "
          "it is the worker the others hung waiting for; killing it")
      worker.signal(signal.SIGKILL)


def _kill_running(workers, say, why):
  for worker in workers:
    if worker.process.poll() is None:
      say(f"{worker.name} {why}; killing it")
      worker.signal(signal.SIGKILL)


def main(argv=None) -> int:
  """`python scripts/launch_workers.py --num_workers=N -- TRAINER_FLAGS...`, or
  `-- COMMAND...` (e.g. `python my_program.py`: a Keras program's trainer.fit)."""
  parser = argparsing.ArgumentParser(
      prog="launch_workers.py",
      description="Run a local MultiWorkerMirroredStrategy cluster of trainer "
                  "processes on 127.0.0.1. Flags after -- go to every worker.")
  parser.add_argument("--num_workers", type=int, default=2,
                      help="worker processes to start (default 2); worker 0 is chief")
  parser.add_argument("--grace_seconds", type=float, default=10.0,
                      help="after a worker dies, seconds the others get to stop "
                           "before they are killed (default 10)")
  parser.add_argument("--evaluator", action="store_true",
                      help="also start an evaluator beside the workers "
                           "(--mode=continuous_eval through TF_CONFIG)")
  parser.add_argument("trainer_args", nargs=argparsing.argparse.REMAINDER,
                      help="-- then the trainer flags, e.g. --model_dir=runs/mw, "
                           "or a command, e.g. python my_program.py (a Keras "
                           "program's trainer.fit), run as it is")
  args = parser.parse_args(argv)
  trainer_args = args.trainer_args
  if trainer_args[:1] == ["--"]:
    trainer_args = trainer_args[1:]
  if args.num_workers < 1:
    parser.exit(2, f"launch_workers.py: error: --num_workers={args.num_workers}: "
                   "must be at least 1\n")
  if args.grace_seconds < 0:
    parser.exit(2, f"launch_workers.py: error: --grace_seconds={args.grace_seconds:g}"
                   ": must be >= 0\n")
  if trainer_args and not trainer_args[0].startswith("-"):  # A command.
    if args.evaluator:
      parser.exit(2, "launch_workers.py: error: --evaluator: only with trainer "
                     "flags (python -m trainer.main's), not a command\n")
    return launch([], num_workers=args.num_workers, program=trainer_args,
                  grace_seconds=args.grace_seconds, strategy_flag=False)
  return launch(trainer_args, num_workers=args.num_workers,
                grace_seconds=args.grace_seconds, evaluator=args.evaluator)
