"""A user's own actions, end to end: trainer.STOP, `every`, the task's actions in a
CLI run writing summaries, and user code that raises; and trainer.load."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_file_loader

import trainer

from conftest import REPO, TESTS, checkpoint_values, read_results, run_cli
from presets import FAST, train


def test_an_action_that_returns_stop_ends_training_where_it_says(model_dir):
  def stop_at_twenty(context):
    if context.step >= 20:
      return trainer.STOP
    return None

  results = train(*FAST, model_dir=model_dir, train_steps=100,
                  actions=[trainer.every(10, stop_at_twenty)])
  assert results["status"] == "stopped" and results["global_step"] == 20
  assert os.path.exists(os.path.join(model_dir, "checkpoints", "ckpt-20.index"))
  assert os.path.isdir(os.path.join(model_dir, "export"))
  before = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  again = train(*FAST, model_dir=model_dir, train_steps=100,
                actions=[trainer.every(10, stop_at_twenty)])
  assert again == results == read_results(model_dir)
  after = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  assert all(np.array_equal(before[k], after[k]) for k in before)


def test_actions_see_the_evaluation_of_their_step(model_dir):
  seen = []
  train(*FAST, model_dir=model_dir, train_steps=20, mode="train_and_eval",
        eval_every=10, actions=[lambda c: seen.append((c.step, c.eval_metrics))])
  evaluated = [(step, m["examples"]) for step, m in seen if m is not None]
  assert evaluated == [(10, 360), (20, 360)]
  assert all(m is None for step, m in seen if step % 10)


def _events(directory):
  """{tag: [(step, plugin)]} of every summary in a directory's event files."""
  found = {}
  for name in sorted(os.listdir(directory)):
    for event in event_file_loader.EventFileLoader(
        os.path.join(directory, name)).Load():
      for value in event.summary.value:
        found.setdefault(value.tag, []).append(
            (event.step, value.metadata.plugin_data.plugin_name))
  return found


def test_the_example_confusion_matrix_action_writes_to_tensorboard(model_dir):
  process = run_cli("--task=confusion_matrix:DigitsWithConfusion", "--task.every=10",
                    "--model=mlp", "--train_steps=20", "--steps_per_loop=20",
                    f"--model_dir={model_dir}",
                    python_path=os.path.join(REPO, "examples"))
  assert process.returncode == 0, process.stderr
  events = _events(os.path.join(model_dir, "train"))
  # every(10) ended the loop call at 10 though --steps_per_loop=20.
  assert events["confusion_matrix"] == [(10, "images"), (10, "text"), (20, "images"),
                                        (20, "text")]
  assert [step for step, _ in events["loss"]] == list(range(1, 21))  # Every step.


def test_an_action_that_raises_shows_its_traceback_and_keeps_the_checkpoints(
    model_dir):
  process = run_cli("--task=user_tasks:BrokenAction", "--train_steps=30",
                    "--steps_per_loop=5", "--checkpoint_every=5",
                    f"--model_dir={model_dir}", python_path=TESTS)
  assert process.returncode == 1
  lines = process.stderr.strip().splitlines()
  assert lines[0].startswith("Traceback") and "_fail_at_ten" in process.stderr
  assert lines[-1] == ("error: action _fail_at_ten raised KeyError: 'missing metric' "
                       "(the checkpoints written so far are kept)")
  assert "trainer/training" not in process.stderr  # The user's frames only.
  results = read_results(model_dir)
  assert results["status"] == "failed" and results["global_step"] == 10
  assert os.path.exists(os.path.join(model_dir, "checkpoints", "ckpt-5.index"))


def test_a_task_method_that_raises_is_named_and_writes_nothing(model_dir):
  process = run_cli("--task=user_tasks:BrokenPrepare", f"--model_dir={model_dir}",
                    python_path=TESTS)
  assert process.returncode == 1
  assert process.stderr.strip().splitlines()[-1] == (
      "error: Task.prepare raised RuntimeError: the vocabulary file is missing (the "
      "checkpoints written so far are kept)")
  assert 'raise RuntimeError("the vocabulary file is missing")' in process.stderr
  assert not os.path.exists(model_dir)


def test_load_gives_the_latest_or_the_best_weights(model_dir):
  results = train(*FAST, model_dir=model_dir, train_steps=30, mode="train_and_eval",
                  eval_every=10, best_metric="eval/loss", best_goal="max",
                  ema_decay=0.5)
  task, latest = trainer.load(model_dir)
  _, best = trainer.load(model_dir, best=True)
  x = task.source.x_test.astype(np.float32)
  for model, export in ((latest, "export"), (best, "export_best")):
    served = tf.saved_model.load(os.path.join(model_dir, export))
    expected = served.signatures["serving_default"](inputs=x)["logits"].numpy()
    got = model(task.preprocess(x), training=False).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
  assert results["best_eval"]["step"] < 30  # "Best" (the highest loss) is earlier.
  with pytest.raises(trainer.errors.ModelDirError, match="no flags.txt"):
    trainer.load(os.path.join(model_dir, "nothing"))
  # A garbled best checkpoint: the documented error, not TensorFlow's OpError.
  best_dir = os.path.join(model_dir, "checkpoints", "best")
  [index] = [n for n in os.listdir(best_dir) if n.endswith(".index")]
  with open(os.path.join(best_dir, index), "wb") as f:
    f.write(b"not a checkpoint index")
  with pytest.raises(trainer.errors.ModelDirError,
                     match="the best checkpoint cannot be read"):
    trainer.load(model_dir, best=True)
  trainer.load(model_dir)  # The latest still loads.


def test_an_action_raising_keyboard_interrupt_stops_as_sigint(model_dir):
  """It killed the process with -2 and a traceback, and no status."""
  process = run_cli("--task=user_tasks:InterruptingAction", "--train_steps=30",
                    "--steps_per_loop=5", f"--model_dir={model_dir}",
                    python_path=TESTS)
  assert process.returncode == 4, process.stderr[-2000:]
  assert ("action _interrupt_at_ten raised KeyboardInterrupt: saved a checkpoint at "
          "step 10; rerun the same command to resume") in process.stdout
  assert "Traceback" not in process.stderr
  results = read_results(model_dir)
  assert results["status"] == "interrupted" and results["global_step"] == 10
  assert os.path.exists(os.path.join(model_dir, "checkpoints", "ckpt-10.index"))


def test_an_action_calling_sys_exit_is_its_failure(model_dir):
  """sys.exit(0) at step 10 of 30 exited 0 with no status: a silent half-run."""
  process = run_cli("--task=user_tasks:ExitingAction", "--train_steps=30",
                    "--steps_per_loop=5", f"--model_dir={model_dir}",
                    python_path=TESTS)
  assert process.returncode == 1, process.stderr[-2000:]
  assert process.stderr.strip().splitlines()[-1] == (
      "error: action _exit_at_ten raised SystemExit: 0 (the checkpoints written so "
      "far are kept)")
  assert read_results(model_dir)["status"] == "failed"


def test_a_metric_failing_in_the_graph_is_named_in_one_line(model_dir):
  """A streaming metric's update_state failing at run time (a tf.debugging
  assertion) ended in a traceback at a TensorFlow node, with no line naming the
  metric and no status."""
  # Its state resets with each loop call: 10 steps of 32 pass its 200.
  process = run_cli("--task=keras_tasks:FailingMetric", "--train_steps=40",
                    "--steps_per_loop=10", "--mode=train", f"--model_dir={model_dir}",
                    python_path=TESTS)
  assert process.returncode == 1, process.stderr[-2000:]
  assert process.stderr.strip().splitlines()[-1].startswith(
      "error: Task.build_metrics()['fragile'] (update_state) raised "
      "InvalidArgumentError: assertion failed: [the bins overflowed]")
  assert read_results(model_dir)["status"] == "failed"


def test_a_loss_that_raises_is_named_with_its_own_message(model_dir):
  """The line ended at "... raised ValueError: in user code:", without the cause."""
  from user_tasks import RaisingLoss
  with pytest.raises(trainer.errors.UserCodeError) as raised:
    train(*FAST, model_dir=model_dir, task=RaisingLoss(), train_steps=2)
  assert str(raised.value) == ("Task.loss raised ValueError: the labels must be "
                               "probabilities")


def test_a_metric_that_is_not_a_number_is_null_in_results_json(model_dir, capsys):
  """results.json held a bare NaN, which is not JSON."""
  from user_tasks import NanMetric
  train(*FAST, model_dir=model_dir, task=NanMetric(), train_steps=5,
        mode="train_and_eval")
  with open(os.path.join(model_dir, "results.json")) as f:
    text = f.read()

  def refuse(constant):
    raise ValueError(f"{constant} is not JSON")

  results = json.loads(text, parse_constant=refuse)
  assert results["eval"]["ratio"] is None and results["train"]["ratio"] is None
  assert results["eval"]["mae"] > 0
  assert "(ratio was not a number: null in results.json)" in capsys.readouterr().out
