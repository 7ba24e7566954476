"""The pruning gate: a trial waits at each evaluation until its sweep has given the
study's pruner that evaluation, and stops right there when the pruner says so.

Why a gate: a trial stops at the end of the loop call it is running when it gets
a SIGTERM (checkpoint, exit 4). Without the gate the sweep read an evaluation
from the trial's log after the trial had printed it, and by then the trial was
in its next loop call, which (with the automatic --steps_per_loop, or one of
--eval_every steps) runs to the next evaluation: a pruned trial stopped one
evaluation late, or trained to its end, and pruning saved nothing.

With the gate, a trial's stdout is held at its evaluation lines: after writing
one (and flushing it to the log) the trial asks the sweep and waits for the
answer before it goes on. The trainer prints the line among the actions of the
loop call that ended at that step, before that call's checkpoint and stop vote,
so a "prune" answer, raised as SIGTERM in the trial itself, stops the trial at
the evaluated step: no further loop call runs. The trainer is not changed: the
gate watches the progress lines the sweep parses (trainer/outputs/progress.py).

A trial whose sweep is gone (end of file) or silent for GATE_WAIT_SECONDS goes
on; the sweep's SIGTERM (or PR_SET_PDEATHSIG's) still stops it at its next loop
call. Trials are gated only when the sweep has a pruner.

Protocol: two FIFOs per trial, in a private temporary directory. The trial
writes "STEP\\n" to PREFIX.ask after an evaluation line of that step; the sweep
answers "STEP go\\n" or "STEP prune\\n" on PREFIX.go. The trial removes the
FIFOs and their directory once it has opened them (the open ends work on), so a
SIGKILLed sweep leaves nothing behind.

Example (the sweep's side; trainer/sweeps/runner.py does this):

  gate = Gate()  # Before the trial starts; pass it gate.prefix.
  ...
  for step in gate.asked():  # Once the trial's log has been read.
    gate.answer(step, prune=False)
  gate.close()

The trial's side: `install(prefix)` before `trainer.main.run()` (the fork
server's child does it), or `python -m trainer.sweeps.gate PREFIX TRAINER_ARGS`.
"""

import contextlib
import os
import select
import signal
import sys
import tempfile
import time

from trainer.outputs import progress

GATE_WAIT_SECONDS = 60.0  # Then the trial goes on (within its --hang_timeout).


def _eval_step(line: str):
  """The step of an evaluation's progress line, else None."""
  values = progress.parse_line(line)
  if any(name.startswith("eval/") for name in values):
    return values["step"]
  return None


class Gate:
  """The sweep's end of one trial's gate."""

  def __init__(self):
    """Makes the trial's FIFOs and opens the sweep's ends.

    Both are opened read-write, so neither open waits for the trial, the sweep
    never reads an end of file from a trial that has not opened its end yet,
    and the trial reads one (goes on) once the sweep is gone.

    Raises:
      OSError: no FIFO can be made here.
    """
    self.prefix = os.path.join(tempfile.mkdtemp(prefix="sweep-gate-"), "gate")
    os.mkfifo(self.prefix + ".ask", 0o600)
    os.mkfifo(self.prefix + ".go", 0o600)
    self._ask = os.open(self.prefix + ".ask", os.O_RDWR | os.O_NONBLOCK)
    self._go = os.open(self.prefix + ".go", os.O_RDWR | os.O_NONBLOCK)
    self._pending = b""

  def fileno(self) -> int:
    """Readable when the trial asks (for select)."""
    return self._ask

  def asked(self) -> list:
    """The steps the trial has asked about since the last call."""
    try:
      while True:
        data = os.read(self._ask, 4096)
        if not data:
          break
        self._pending += data
    except BlockingIOError:
      pass
    *lines, rest = self._pending.split(b"\n")
    self._pending = rest
    return [int(line) for line in lines if line.strip().isdigit()]

  def answer(self, step: int, *, prune: bool):
    try:
      os.write(self._go, f"{step} {'prune' if prune else 'go'}\n".encode())
    except OSError:  # Full (the trial reads no more): it goes on without it.
      pass

  def close(self):
    for fd in (self._ask, self._go):
      os.close(fd)
    _remove(self.prefix)  # If the trial never opened them.


def _remove(prefix: str):
  """Removes a gate's FIFOs and their directory (already gone: nothing)."""
  with contextlib.suppress(OSError):
    for suffix in (".ask", ".go"):
      os.unlink(prefix + suffix)
    os.rmdir(os.path.dirname(prefix))


class _GatedStream:
  """The trial's stdout: writes through, and waits at each evaluation line for
  the sweep's answer (see the module docstring)."""

  def __init__(self, stream, ask: int, go: int):
    self._stream = stream
    self._ask = ask
    self._go = go
    self._line = ""  # The line being written (print writes it in parts).
    self._pending = b""

  def write(self, text):
    written = self._stream.write(text)
    if "\n" not in text:
      self._line += text
      return written
    *lines, self._line = (self._line + text).split("\n")
    for line in lines:
      step = _eval_step(line)
      if step is not None and self._ask is not None:
        self._stream.flush()  # In the log before the sweep is asked to read it.
        self._wait(step)
    return written

  def __getattr__(self, name):
    return getattr(self._stream, name)

  def _wait(self, step: int):
    try:
      os.write(self._ask, f"{step}\n".encode())
    except OSError:  # The sweep is gone.
      self._close()
      return
    deadline = time.monotonic() + GATE_WAIT_SECONDS
    while True:
      while b"\n" in self._pending:
        line, self._pending = self._pending.split(b"\n", 1)
        words = line.decode(errors="replace").split()
        if len(words) == 2 and words[0] == str(step):
          if words[1] == "prune":
            self._prune(step)
          return
      remaining = deadline - time.monotonic()
      if remaining <= 0 or not select.select([self._go], [], [], remaining)[0]:
        return  # No answer: go on (the sweep may still send a SIGTERM).
      try:
        data = os.read(self._go, 4096)
      except BlockingIOError:
        continue
      if not data:  # The sweep is gone: go on.
        self._close()
        return
      self._pending += data

  def _prune(self, step: int):
    self._stream.write(f"pruned by the sweep at step {step}: stopping at this "
                       "evaluation\n")
    self._stream.flush()
    # The trainer's handler (trainer/interrupts.py) takes it as a stop request:
    # this loop call's stop vote saves a checkpoint and the trial exits 4. Raised
    # here, in the main thread, it is set before the trainer goes on.
    signal.raise_signal(signal.SIGTERM)

  def _close(self):
    for fd in (self._ask, self._go):
      try:
        os.close(fd)
      except OSError:
        pass
    self._ask = self._go = None


def install(prefix: str) -> bool:
  """In the trial, before the trainer runs: gates sys.stdout at `prefix`'s FIFOs.

  Returns:
    False when the sweep's ends are gone (its process died): then the trial runs
    ungated.
  """
  try:
    ask = os.open(prefix + ".ask", os.O_WRONLY | os.O_NONBLOCK)
  except OSError:  # ENXIO: nobody reads it; ENOENT: the sweep removed it.
    return False
  try:
    go = os.open(prefix + ".go", os.O_RDONLY | os.O_NONBLOCK)
  except OSError:
    os.close(ask)
    return False
  _remove(prefix)  # Open at both ends: the names are no longer needed.
  sys.stdout = _GatedStream(sys.stdout, ask, go)
  return True


def main():
  """`python -m trainer.sweeps.gate PREFIX TRAINER_ARGS`: a cold trial, gated;
  otherwise `python -m trainer.main TRAINER_ARGS`."""
  from trainer import interrupts
  interrupts.install()  # First, as trainer.main does: a signal is a clean stop.
  prefix, argv = sys.argv[1], sys.argv[2:]
  install(prefix)
  from trainer import main as trainer_main
  sys.argv = [trainer_main.__file__, *argv]  # As `python -m trainer.main`.
  trainer_main.run()


if __name__ == "__main__":
  main()
