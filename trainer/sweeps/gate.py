"""The pruning gate: a trial waits at each evaluation until its sweep has given the
study's pruner that evaluation, and stops right there when the pruner says so.

Why a gate: a trial stops at the end of the loop call it is running when it gets
a SIGTERM (checkpoint, exit 4). Without the gate the sweep read an evaluation
from the trial's log after the trial had printed it, and by then the trial was
in its next loop call, which (with the automatic --steps_per_loop, or one of
--eval_every steps) runs to the next evaluation: a pruned trial stopped one
evaluation late, or trained to its end, and pruning saved nothing.

The trial's side is an action (trainer/actions/user.py), `PruningGate`, which
the trial's process adds to the trainer's (`trainer.main.run(actions=[gate])`).
Actions run after the loop call's evaluation and before its checkpoint and its
SignalStop (trainer/actions/__init__.py lists the order). At an evaluation
(`context.eval_metrics`) that is not the run's last, the gate flushes the
trial's output, so the evaluation's line is in the log the sweep reads, asks the
sweep and waits for the verdict. On "prune" it raises SIGTERM in its own
process: the trainer's handler (trainer/interrupts.py) takes it as a stop
request, and the same loop call's SignalStop saves the checkpoint of the judged
step and stops the trial (exit 4). No further loop call runs.

The run's last evaluation is never asked about: nothing is left to save there
(the sweep never prunes it either, and still reports it to the study from the
log). The gate knows the last step from the trial's --train_steps as the
trainer parsed it (flagfiles included).

A trial whose sweep is gone (end of file) or silent for GATE_WAIT_SECONDS goes
on; the sweep's SIGTERM (or PR_SET_PDEATHSIG's) still stops it at its next loop
call. Trials are gated only when the sweep has a pruner.

Protocol: two FIFOs per trial, in a private temporary directory. The trial
writes "STEP\\n" to PREFIX.ask at an evaluation of that step; the sweep answers
"STEP go\\n" or "STEP prune\\n" on PREFIX.go. The trial removes the FIFOs and
their directory once it has opened them (the open ends work on), so a SIGKILLed
sweep leaves nothing behind.

Example (the sweep's side; trainer/sweeps/pruning.py does this):

  gate = Gate()  # Before the trial starts; pass it gate.prefix.
  ...
  for step in gate.asked():  # Once the trial's log has been read.
    gate.answer(step, prune=False)
  gate.close()

The trial's side (the fork server's child does this), or
`python -m trainer.sweeps.gate PREFIX TRAINER_ARGS`:

  gate = PruningGate.open(prefix)  # None when the sweep is gone.
  trainer.main.run(actions=[gate] if gate else [])
"""

import contextlib
import os
import select
import signal
import sys
import tempfile
import time
from typing import Optional

GATE_WAIT_SECONDS = 60.0  # Then the trial goes on (within its --hang_timeout).


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
    """Tells the trial the verdict on its evaluation at `step`."""
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


def _flags_train_steps() -> int:
  """The trial's --train_steps, as the trainer parsed its command line."""
  from absl import flags
  return flags.FLAGS.train_steps


class PruningGate:
  """The trial's end of its gate: an action that waits at each evaluation for the
  sweep's verdict and stops the trial there on "prune" (see the module
  docstring)."""

  def __init__(self, *, ask: int, go: int, last_step: Optional[int] = None):
    """Creates the gate on open file descriptors (`open` opens them).

    Args:
      ask: where the trial asks (PREFIX.ask, opened for writing).
      go: where the sweep answers (PREFIX.go, opened for reading, non-blocking).
      last_step: the run's last step, whose evaluation is never asked about;
        None: the trial's --train_steps, read from its parsed flags when first
        needed (the trainer has parsed them by then).
    """
    self._ask = ask
    self._go = go
    self._last_step = last_step
    self._pending = b""  # Answers read but not yet matched to a question.

  @classmethod
  def open(cls, prefix: str, *,
           last_step: Optional[int] = None) -> Optional["PruningGate"]:
    """Opens the trial's ends of the FIFOs at `prefix`, before the trainer runs.

    Args:
      prefix: the sweep's Gate.prefix.
      last_step: as in the constructor.

    Returns:
      The gate, or None when the sweep's ends are gone (its process died): then
      the trial runs ungated.
    """
    try:
      ask = os.open(prefix + ".ask", os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: nobody reads it; ENOENT: the sweep removed it.
      return None
    try:
      go = os.open(prefix + ".go", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
      os.close(ask)
      return None
    _remove(prefix)  # Open at both ends: the names are no longer needed.
    return cls(ask=ask, go=go, last_step=last_step)

  def __call__(self, context) -> None:
    """After a loop call: waits for the verdict on its evaluation, if it had one.

    Args:
      context: the loop call's trainer.ActionContext.
    """
    if context.eval_metrics is None or self._ask is None:
      return
    if self._last_step is None:
      self._last_step = _flags_train_steps()
    if context.step >= self._last_step:
      return  # The last evaluation: never pruned, nothing to wait for.
    # The evaluation's line in the log before the sweep is asked to read it.
    for stream in (sys.stdout, sys.stderr):
      stream.flush()
    if self._wait(context.step) == "prune":
      self._prune(context.step)

  def _wait(self, step: int) -> Optional[str]:
    """Asks about `step`; the verdict ("go" or "prune"), or None when there is
    none: the sweep is gone or silent for GATE_WAIT_SECONDS."""
    try:
      os.write(self._ask, f"{step}\n".encode())
    except OSError:  # The sweep is gone.
      self.close()
      return None
    deadline = time.monotonic() + GATE_WAIT_SECONDS
    while True:
      while b"\n" in self._pending:
        line, self._pending = self._pending.split(b"\n", 1)
        words = line.decode(errors="replace").split()
        if len(words) == 2 and words[0] == str(step):  # Else an older answer's.
          return words[1]
      remaining = deadline - time.monotonic()
      if remaining <= 0 or not select.select([self._go], [], [], remaining)[0]:
        return None  # No answer: go on (the sweep may still send a SIGTERM).
      try:
        data = os.read(self._go, 4096)
      except BlockingIOError:
        continue
      if not data:  # The sweep is gone: go on.
        self.close()
        return None
      self._pending += data

  @staticmethod
  def _prune(step: int):
    print(f"pruned by the sweep at step {step}: stopping at this evaluation",
          flush=True)
    # The trainer's handler takes it as a stop request, set before this action
    # returns (raised in the main thread): the SignalStop of this loop call
    # saves the checkpoint of this step and the trial exits 4.
    signal.raise_signal(signal.SIGTERM)

  def close(self):
    """Closes the trial's ends; the trial goes on ungated."""
    for fd in (self._ask, self._go):
      if fd is not None:
        with contextlib.suppress(OSError):
          os.close(fd)
    self._ask = self._go = None


def main():
  """`python -m trainer.sweeps.gate PREFIX TRAINER_ARGS`: a cold trial, gated;
  otherwise `python -m trainer.main TRAINER_ARGS`."""
  from trainer import interrupts
  interrupts.install()  # First, as trainer.main does: a signal is a clean stop.
  prefix, argv = sys.argv[1], sys.argv[2:]
  gate = PruningGate.open(prefix)
  from trainer import main as trainer_main
  sys.argv = [trainer_main.__file__, *argv]  # As `python -m trainer.main`.
  trainer_main.run(actions=[gate] if gate else [])


if __name__ == "__main__":
  main()
