"""The pruning gate's trial side, an action (trainer/sweeps/gate.py): it asks its
sweep at each evaluation but the run's last, waits for the verdict, and on
"prune" says so and raises SIGTERM, which the same loop call's SignalStop turns
into a stop at that step. Here in-process, with a fake ActionContext and a fake
sweep end (pipes instead of FIFOs), and the SIGTERM recorded, not raised;
tests/test_study.py runs it over real FIFOs with the trainer's signal handler,
and its pruning sweeps run it inside real trials."""

import os
import signal
import time

import pytest

import trainer
from trainer.sweeps import gate

LAST_STEP = 40


class _FakeSweep:
  """The sweep's end of one trial's gate, its answers written ahead."""

  def __init__(self):
    self._asks, ask = os.pipe()
    go, self._answers = os.pipe()
    os.set_blocking(self._asks, False)
    os.set_blocking(go, False)
    # The trial's ends, as PruningGate.open opens them at a real gate's FIFOs.
    self.gate = gate.PruningGate(ask=ask, go=go, last_step=LAST_STEP)

  def answer(self, text: str):
    os.write(self._answers, text.encode())

  def asked(self) -> list:
    try:
      data = os.read(self._asks, 4096)
    except BlockingIOError:
      return []
    return [int(line) for line in data.decode().split()]

  def hang_up(self):
    """Closes its answers' end only: the trial waiting there reads end of file."""
    os.close(self._answers)
    self._answers = None

  def close(self):
    """The sweep is gone (its process died): its ends close."""
    for fd in (self._asks, self._answers):
      if fd is not None:
        os.close(fd)
    self._asks = self._answers = None


def _context(step: int, *, evaluated: bool = True):
  return trainer.ActionContext(
      step=step, metrics={"loss": 1.0},
      eval_metrics={"loss": 1.0, "accuracy": 0.5} if evaluated else None,
      model=None, model_dir="/nonexistent", is_chief=True, summaries=None)


@pytest.fixture
def sweep_end():
  end = _FakeSweep()
  yield end
  end.gate.close()
  end.close()


@pytest.fixture
def raised(monkeypatch):
  """The signals the gate raises in its process (recorded here instead)."""
  signals = []
  monkeypatch.setattr(signal, "raise_signal", signals.append)
  return signals


def test_it_asks_at_evaluations_but_the_last_and_goes_on_when_told(sweep_end,
                                                                   raised, capsys):
  sweep_end.answer("10 go\n")
  sweep_end.gate(_context(10))
  assert sweep_end.asked() == [10]
  sweep_end.gate(_context(15, evaluated=False))  # No evaluation: nothing to ask.
  sweep_end.gate(_context(LAST_STEP))  # The last one is never pruned.
  assert sweep_end.asked() == [] and raised == []
  assert capsys.readouterr().out == ""


def test_a_prune_verdict_stops_the_trial_at_that_evaluation(sweep_end, raised,
                                                            capsys):
  sweep_end.answer("10 go\n20 prune\n")  # An earlier evaluation's answer first.
  sweep_end.gate(_context(20))
  assert sweep_end.asked() == [20]
  assert raised == [signal.SIGTERM]
  assert capsys.readouterr().out == ("pruned by the sweep at step 20: stopping at "
                                     "this evaluation\n")


def test_a_silent_sweep_lets_the_trial_go_on(sweep_end, raised, monkeypatch):
  monkeypatch.setattr(gate, "GATE_WAIT_SECONDS", 0.2)
  start = time.monotonic()
  sweep_end.gate(_context(10))
  assert 0.2 <= time.monotonic() - start < 5
  # A verdict that comes too late is not taken for the next evaluation's.
  sweep_end.answer("10 prune\n")
  sweep_end.gate(_context(20))
  assert sweep_end.asked() == [10, 20] and raised == []


@pytest.mark.parametrize("after_asking", [False, True])
def test_a_gone_sweep_lets_the_trial_go_on_ungated(sweep_end, raised, after_asking):
  if after_asking:  # The trial asks, then reads end of file instead of a verdict.
    sweep_end.hang_up()
  else:  # Gone before the trial asks: the question cannot be written.
    sweep_end.close()
  start = time.monotonic()
  for step in (10, 20, 30):
    sweep_end.gate(_context(step))
  assert time.monotonic() - start < gate.GATE_WAIT_SECONDS / 2 and raised == []
  if after_asking:
    assert sweep_end.asked() == [10]  # Then it asked no more.
