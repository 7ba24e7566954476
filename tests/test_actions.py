"""Each action on a fake loop call, with no training: its schedule (next_stop), what
it records, and when it asks to stop; and the controller's vote and stops."""

import dataclasses
import types

import numpy as np
import pytest

import trainer
from trainer.actions.base import LoopCall, Stop
from trainer.actions.checkpoint import Checkpoint
from trainer.actions.evaluate import Evaluate
from trainer.actions.ledger import LedgerCheck
from trainer.actions.limits import SignalStop, TimeLimit
from trainer.actions.profiler import Profiler
from trainer.actions.report import Report
from trainer.actions.user import ActionContext, UserAction, action_name
from trainer.errors import ReplicaBatchError, RunStatus, UserCodeError
from trainer.outputs.results import improves
from trainer.training.controller import Controller
from trainer.training.ledger import ReplicaLedger
from trainer.training.record import RunRecord


def _call(step, num_steps=5, **outputs):
  base = dict(ledger_batches=np.full(2, float(num_steps)),
              ledger_examples=np.full(2, num_steps * 4.0), clipped=0,
              gradient_norm=1.5, learning_rate=0.1, all_finite=True)
  return LoopCall(index=1, step=step, num_steps=num_steps, seconds=0.5,
                  outputs=dict(base, **outputs), metrics={"loss": 0.25})


class _Recorder:
  """Stands in for Summaries, Results, Console and Checkpoints: records calls."""

  def __init__(self):
    self.calls = []
    self.record = RunRecord()

  def __getattr__(self, name):
    return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


def _fake_trainer(**changes):
  ledger = ReplicaLedger.__new__(ReplicaLedger)  # Host side only: no variables.
  ledger.name, ledger.num_replicas = "train", 2
  ledger.total_batches, ledger.total_examples = np.zeros(2, np.int64), np.zeros(
      2, np.int64)
  fields = dict(train_ledger=ledger, accum_steps=1, per_replica_batch_size=4,
                global_batch_size=8, step=10, stop_vote=lambda code: code)
  fields.update(changes)
  return types.SimpleNamespace(**fields)


def test_the_ledger_check_adds_up_and_names_a_short_replica():
  trainer_ = _fake_trainer()
  LedgerCheck(trainer_)(_call(5))
  assert trainer_.train_ledger.total_batches.tolist() == [5, 5]
  with pytest.raises(ReplicaBatchError, match="replica 1 received 4 batches"):
    LedgerCheck(trainer_)(_call(10, ledger_batches=np.array([5.0, 4.0])))


def test_report_writes_a_point_per_history_row_and_the_calls_line():
  columns = ("step", "loss", "examples", "weight", "replica_0", "replica_1",
             "learning_rate", "gradient_norm", "clipped")
  objective = types.SimpleNamespace(
      streaming={}, scalar_streaming=(),
      report=lambda means, **unused: dict(means))
  trainer_ = _fake_trainer(history_columns=columns, metric_names=(),
                           objective=objective)
  trainer_.train_ledger.total_batches[:] = 5  # LedgerCheck counted this call.
  summaries, results, console = _Recorder(), _Recorder(), _Recorder()
  summaries.enabled = True
  report = Report(trainer=trainer_, results=results, summaries=summaries,
                  console=console, clip_norm=0.0)
  # A call of steps 1 to 5 with rows at steps 2 and 4: running sums.
  history = np.array([[2, 3.0, 16, 16, 2, 2, 0.1, 1.5, 0],
                      [4, 5.0, 32, 32, 4, 4, 0.1, 1.2, 0]])
  report(_call(5, history=history, loss=6.0, examples=40.0, weight=40.0))
  layout, first, second = summaries.calls
  assert layout[0] == "layout" and "ledger" in layout[1][1]  # The first call's.
  (_, (split, step, values), _) = first
  assert (split, step) == ("train", 2)
  assert values["loss"] == 1.5  # (3.0 - 0) / 2 steps.
  assert values["replica_batches/replica_1"] == 2
  # The first call traced the loop: its time is compilation's, not a rate.
  assert "examples_per_second" not in values
  (_, (_, step, values), _) = second
  assert step == 4 and values["loss"] == 1.0 and values["gradient_norm"] == 1.2
  assert "clipped_fraction" not in values
  # The call's line: its first call traced, so it says it compiled.
  [(name, args, kwargs)] = console.calls
  assert (name, args[0], kwargs["compiled_seconds"]) == ("report", 5, 0.5)
  assert results.calls[0][0] == "record_train_call"
  # A later call's points have its rate (5 steps in 0.5 s), and its first point
  # takes in step 5, which came after the previous call's last row (loss 1.0, 8
  # examples): steps 5 to 10.
  summaries.calls.clear()
  history = np.array([[10, 4.0, 40, 40, 5, 5, 0.1, 1.0, 0]])
  report(dataclasses.replace(_call(10, history=history, loss=4.0, examples=40.0,
                                   weight=40.0), index=2))
  [(_, (_, step, values), _)] = summaries.calls
  assert step == 10 and values["steps_per_second"] == 10.0
  assert values["loss"] == pytest.approx(5.0 / 6)
  assert values["examples_per_second"] == pytest.approx(48 / 6 * 10.0)


def test_checkpoint_saves_on_its_schedule_and_at_the_end():
  checkpoints, summaries = _Recorder(), _Recorder()
  action = Checkpoint(checkpoints=checkpoints, summaries=summaries, every=10,
                      train_steps=25)
  assert [action.next_stop(s) for s in (0, 9, 10, 24)] == [10, 10, 20, 30]
  for step in (5, 10, 15, 25):
    action(_call(step))
  assert [c[0] for c in checkpoints.calls] == ["save", "save"]  # 10 and 25.
  assert [c[0] for c in summaries.calls] == ["flush", "flush"]


def test_evaluate_runs_on_its_schedule_keeps_the_best_and_stops_early():
  metrics = iter([{"loss": 1.0, "examples": 9}, {"loss": 0.5, "examples": 9},
                  {"loss": 0.6, "examples": 9}, {"loss": 0.7, "examples": 9}])
  trainer_ = _fake_trainer(evaluate=lambda data: next(metrics))
  best = []

  def record_eval(step, m, seconds):  # Results': whether --best_metric improved.
    assert seconds >= 0
    improved = not best or m["loss"] < min(best)
    best.append(m["loss"])
    return improved

  checkpoints, results = _Recorder(), types.SimpleNamespace(record_eval=record_eval)
  evaluate = Evaluate(trainer=trainer_, eval_data=None, checkpoints=checkpoints,
                      results=results, summaries=_Recorder(), console=_Recorder(),
                      best_metric=("eval/loss", "min"), every=10, train_steps=100,
                      enabled=True, patience=2, min_delta=0.0)
  assert evaluate.next_stop(0) == 10 and evaluate.next_stop(10) == 20
  assert evaluate(_call(5)) is None and evaluate.metrics_at(5) is None
  outcomes = []
  for step in (10, 20, 30, 40):
    trainer_.step = step
    outcomes.append(evaluate(_call(step)))
  assert evaluate.metrics_at(40) == {"loss": 0.7, "examples": 9}
  assert evaluate.metrics_at(30) is None  # Only the latest evaluation's step.
  # Steps 10 (the first) and 20 (0.5) improved; 30 and 40 did not.
  assert [c[0] for c in checkpoints.calls] == ["save_best", "save_best"]
  assert outcomes[:3] == [None, None, None]
  assert isinstance(outcomes[3], Stop) and outcomes[3].status == "early_stopped"
  assert "2 evaluations without eval/loss improving" in outcomes[3].message
  disabled = Evaluate(trainer=trainer_, eval_data=None, checkpoints=checkpoints,
                      results=results, summaries=None, console=None,
                      best_metric=("eval/loss", "min"), every=10, train_steps=100,
                      enabled=False, patience=0, min_delta=0.0)
  assert disabled.next_stop(0) is None and disabled(_call(10)) is None


def test_the_best_evaluation_is_never_a_nan_and_a_nan_best_is_beaten():
  """One rule for in-process evaluation (Results.record_eval) and the evaluator
  (continuous_eval): a NaN first evaluation used to become the best, and no later
  one could beat it (every comparison with NaN is false)."""
  assert improves(0.5, None, "min") and improves(0.5, None, "max")
  assert improves(0.3, 0.4, "min") and not improves(0.5, 0.4, "min")
  assert improves(0.5, 0.4, "max") and not improves(0.3, 0.4, "max")
  assert not improves(0.4, 0.4, "min") and not improves(0.4, 0.4, "max")
  assert not improves(float("nan"), None, "min")
  assert not improves(float("nan"), 0.4, "max") and not improves(None, 0.4, "max")
  assert improves(0.9, float("nan"), "min") and improves(0.1, float("nan"), "max")
  assert improves(3, 4, "min")  # Integer metrics (a count) too.


def test_signals_and_the_time_limit_ask_to_stop():
  class Request:
    def __init__(self, signal_name):
      self.signal_name = signal_name

    def __bool__(self):
      return self.signal_name is not None

  assert SignalStop(Request(None))(_call(5)) is None
  stop = SignalStop(Request("SIGTERM"))(_call(5))
  assert stop.status == RunStatus.INTERRUPTED and stop.message.startswith(
      "SIGTERM: saved a checkpoint at step 5")
  assert TimeLimit(max_time=None, budget=None)(_call(5)) is None
  assert TimeLimit(max_time="1h", budget=3600.0)(_call(5)) is None
  over = TimeLimit(max_time="0.001s", budget=-1.0)(_call(5))
  assert over.status == RunStatus.TIME_LIMIT


def test_the_profiler_ends_loop_calls_around_its_window():
  profiler = Profiler(window=(5, 8), model_dir="/nowhere", is_chief=True,
                      results=None, console=None)
  assert [profiler.next_stop(s) for s in (0, 4, 5, 8)] == [4, 8, 8, None]
  assert Profiler(window=(), model_dir="/nowhere", is_chief=True, results=None,
                  console=None).next_stop(0) is None


def _context(call):
  return ActionContext(step=call.step, metrics=call.metrics, eval_metrics=None,
                       model=None, model_dir="/run", is_chief=True, summaries=None)


def test_a_user_action_sees_the_call_and_may_stop_training():
  seen = []

  def stop_at_ten(context):
    seen.append((context.step, context.metrics["loss"]))
    return trainer.STOP if context.step >= 10 else None

  action = UserAction(stop_at_ten, context=_context)
  assert action.name == "stop_at_ten" and action.next_stop(0) is None
  assert action(_call(5)) is None
  stop = action(_call(10))
  assert stop.status == RunStatus.STOPPED and "stop_at_ten returned trainer.STOP " \
                                                "at step 10" in stop.message
  assert seen == [(5, 0.25), (10, 0.25)]


def test_every_runs_an_action_at_multiples_and_ends_loop_calls_there():
  seen = []
  action = UserAction(trainer.every(4, lambda c: seen.append(c.step)),
                      context=_context)
  assert action.next_stop(0) == 4 and action.next_stop(4) == 8
  for step in (3, 4, 6, 8):
    action(_call(step))
  assert seen == [4, 8]
  with pytest.raises(ValueError, match=r"every\(steps=0\)"):
    trainer.every(0, print)


def test_a_user_action_that_raises_is_named():
  def broken(context):
    raise KeyError("accuracy")

  with pytest.raises(UserCodeError, match=r"action broken raised KeyError: "
                     r"'accuracy'") as e:
    UserAction(broken, context=_context)(_call(5))
  assert isinstance(e.value.__cause__, KeyError)

  class Callable:
    def __call__(self, context):
      return None

  assert action_name(Callable()) == "Callable"
  assert action_name(trainer.every(3, broken)) == "broken"


def test_the_controller_ends_calls_at_the_soonest_stop_and_votes_on_stopping():
  class Asks:
    def __init__(self, stop_at, request=None):
      self.stop_at, self.request, self.seen = stop_at, request, []

    def next_stop(self, step):
      return self.stop_at if step < self.stop_at else None

    def __call__(self, call):
      self.seen.append(call.step)
      return self.request if call.step >= self.stop_at else None

  votes, stops = [], []
  trainer_ = _fake_trainer(
      loop_vote=lambda code, steps: votes.append((code, steps)) or (code, 7))
  early = Asks(7)
  late = Asks(12, Stop(RunStatus.TIME_LIMIT, "out of time"))
  user = Asks(12, Stop(RunStatus.STOPPED, "stopped by the user"))
  controller = Controller(trainer=trainer_, train_data=None,
                          actions=[early, late, user], train_steps=100,
                          steps_per_loop=50, watchdog=None, on_stop=stops.append)
  assert controller.next_stop(0) == 7 and controller.next_stop(7) == 12
  assert controller.next_stop(12) == 100
  call = _call(12)
  controller._watchdog = types.SimpleNamespace(guard=lambda *a, **k: _Null())
  status, steps_per_loop = controller._run_actions(call, 50)
  # The most urgent request wins, in the vote and in what is said.
  assert status == RunStatus.TIME_LIMIT and stops == ["out of time"]
  assert votes == [(3, 50)]  # STOP_PRIORITY's TIME_LIMIT, + 1; this worker's K.
  assert steps_per_loop == 7  # The loop length the workers agreed on.
  assert early.seen == late.seen == user.seen == [12]  # Every action ran.


class _Null:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False
