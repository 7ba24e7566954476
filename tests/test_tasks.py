"""The Task API: user tasks from the command line and from Python, the regression
task, tf.data tasks, and every guarantee held for a task that is not the default."""

import dataclasses
import os
import types

import keras

import numpy as np
import pytest
import tensorflow as tf

import trainer
from trainer.config import Config
from trainer.errors import ConfigError
from trainer.outputs import progress
from trainer.tasks import regression

import user_tasks
from conftest import (REPO, TESTS, assert_bit_identical, float_values, one_line_error,
                      read_results, read_scalars, run_cli)
from presets import train


def test_user_task_from_the_command_line_trains_evaluates_and_exports(model_dir):
  args = ["--task=user_tasks:Quadratic", "--task.hidden=8", "--mode=train_and_eval",
          "--cpu_devices=2", "--per_replica_batch_size=8", "--train_steps=30",
          "--steps_per_loop=10", "--eval_every=10", "--learning_rate=0.01",
          f"--model_dir={model_dir}"]
  process = run_cli(*args, python_path=TESTS)
  assert process.returncode == 0, process.stderr
  assert "task user_tasks:Quadratic" in process.stdout
  step_lines = [line for line in process.stdout.splitlines()
                if line.startswith("step 30/30")]
  assert step_lines and "  mae " in step_lines[0] and "accuracy" not in process.stdout
  assert progress.parse_line(step_lines[0]).keys() == {"step", "train/loss",
                                                       "train/mae"}
  results = read_results(model_dir)
  assert set(results["train"]) == {"loss", "mae", "step"}
  assert results["eval"]["examples"] == 77 and "mae" in results["eval"]
  assert results["best_metric"] == "eval/loss"
  assert {"mae", "loss"} <= read_scalars(os.path.join(model_dir, "train")).keys()
  eval_scalars = read_scalars(os.path.join(model_dir, "eval"))
  assert [s for s, _ in eval_scalars["mae"]] == [10, 20, 30]
  flags_txt = open(os.path.join(model_dir, "flags.txt")).read()
  assert "--task=user_tasks:Quadratic\n" in flags_txt
  assert "--task.hidden=8\n" in flags_txt and "--task.delta=1.0\n" in flags_txt
  served = tf.saved_model.load(os.path.join(model_dir, "export"))
  x = np.ones((2, 3), np.float32)
  assert served.signatures["serving_default"](inputs=x)["outputs"].shape == (2, 1)
  # A layout hyperparameter cannot change on resume; another one can.
  refused = run_cli(*args[:1], "--task.hidden=4", *args[2:], "--train_steps=40",
                    python_path=TESTS)
  one_line_error(refused, "--task.hidden=4 (the run has 8)")
  resumed = run_cli(*args, "--task.delta=0.5", "--train_steps=40", python_path=TESTS)
  assert resumed.returncode == 0, resumed.stderr
  assert "resuming at step 30" in resumed.stdout
  assert "--task.delta=0.5\n" in open(os.path.join(model_dir, "flags.txt")).read()


@pytest.mark.parametrize("args, fragment", [
    (["--task=imagenet"], "--task=imagenet: use a built-in task (classification, "
                          "regression) or MODULE:CLASS"),
    (["--task=no_such_module:Task"], "cannot import no_such_module"),
    (["--task=user_tasks:Missing"], "module user_tasks has no Missing"),
    (["--task=user_tasks:NotATask"], "NotATask is not a subclass of trainer.Task"),
    (["--task=user_tasks:Quadratic", "--task.width=3"],
     "--task.width: task user_tasks:Quadratic has no hyperparameter width (it has: "
     "hidden, delta)"),
    (["--task=user_tasks:Quadratic", "--task.hidden=many"], "--task.hidden=many"),
    (["--task.hidden=3"], "task classification has no hyperparameter hidden"),
    (["--task=regression", "--task.hidden=0"], "--task.hidden=0: must be >= 1"),
    (["--task=user_tasks:ScalarLoss"], "Task.loss must return one value per example"),
    (["--task=user_tasks:MismatchedEval", "--mode=train_and_eval"],
     "Task.eval_data(): its features are TensorSpec(shape=(4,), dtype=tf.float32, "
     "name=None), but Task.train_data()'s are TensorSpec(shape=(3,)"),
    (["--task=regression", "--best_metric=eval/accuracy"],
     "--best_metric=eval/accuracy: task regression reports eval/loss, eval/mae"),
])
def test_bad_task_input_is_one_line_and_writes_nothing(model_dir, args, fragment):
  process = run_cli(f"--model_dir={model_dir}", *args, python_path=TESTS)
  one_line_error(process, fragment)
  assert not os.path.exists(model_dir)


def test_a_task_instance_from_python_is_recorded_in_flags(model_dir):
  results = trainer.train(Config(model_dir=model_dir, train_steps=4,
                                 per_replica_batch_size=8, summaries=False),
                          task=user_tasks.Quadratic(hidden=4))
  assert results["status"] == "completed" and results["task"] == "user_tasks:Quadratic"
  flags_txt = open(os.path.join(model_dir, "flags.txt")).read()
  assert "--task.hidden=4\n" in flags_txt
  with pytest.raises(ConfigError, match="must be an instance of a trainer.Task"):
    trainer.train(Config(model_dir=model_dir), task=user_tasks.NotATask())


SGD = ("--task=regression", "--optimizer=sgd", "--learning_rate=0.05",
       "--train_steps=12", "--summaries=false")


def test_regression_two_replicas_match_one_device(tmp_path):
  two = train(*SGD, model_dir=str(tmp_path / "two"), cpu_devices=2,
              per_replica_batch_size=16)
  one = train(*SGD, model_dir=str(tmp_path / "one"), strategy="one_device",
              per_replica_batch_size=32)
  assert two["num_replicas"] == 2 and one["global_batch_size"] == 32
  a, b = float_values(tmp_path / "two"), float_values(tmp_path / "one")
  assert a.keys() == b.keys() and sum(k.startswith("model/") for k in a) == 6
  for key in a:
    np.testing.assert_allclose(a[key], b[key], atol=1e-5, err_msg=key)


def test_regression_eval_counts_each_example_once_in_target_units(model_dir):
  results = train(*SGD, model_dir=model_dir, cpu_devices=2, per_replica_batch_size=16,
                  mode="train_and_eval", eval_every=10, best_metric="eval/mae",
                  train_steps=30, summaries=True)
  data = regression.load_diabetes()
  assert results["eval"]["examples"] == len(data.y_test) == 89  # 3 batches of 32.
  served = tf.saved_model.load(results["export_dir"])
  predictions = served.signatures["serving_default"](
      inputs=tf.constant(data.x_test))["predictions"].numpy()
  target = data.y_test * data.std + data.mean
  assert results["eval"]["mae"] == pytest.approx(
      float(np.mean(np.abs(predictions - target))), rel=1e-4)
  assert results["eval"]["rmse"] == pytest.approx(
      float(np.sqrt(np.mean((predictions - target) ** 2))), rel=1e-4)
  # --best_metric=eval/mae is minimised (regression's metric goals).
  maes = [v for _, v in read_scalars(os.path.join(model_dir, "eval"))["mae"]]
  assert len(maes) == 3
  assert results["best_eval"]["mae"] == pytest.approx(min(maes), rel=1e-6)


@pytest.mark.parametrize("task, extra", [
    ("regression", []),
    ("user_tasks:StreamQuadratic", ["--task.hidden=8"]),
])
def test_resume_is_bit_exact_for_other_tasks(tmp_path, task, extra):
  # regression: 353 examples / 32 = 11 steps an epoch; the stream task repeats
  # 300 examples through a seeded shuffle buffer. Resume at 15 is mid-epoch.
  args = ["--deterministic", f"--task={task}", *extra, "--cpu_devices=2",
          "--per_replica_batch_size=16", "--checkpoint_every=1000", "--optimizer=adam",
          "--learning_rate=0.01"]
  straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
  assert run_cli(f"--model_dir={straight}", "--train_steps=30", *args,
                 python_path=TESTS).returncode == 0
  assert run_cli(f"--model_dir={split}", "--train_steps=15", *args,
                 python_path=TESTS).returncode == 0
  resumed = run_cli(f"--model_dir={split}", "--train_steps=30", *args,
                    python_path=TESTS)
  assert resumed.returncode == 0 and "resuming at step 15" in resumed.stdout
  assert_bit_identical(straight, split)
  # Held in memory and gathered in-graph (the default where the data fits), or
  # read through tf.data and a distributed iterator: the same training, with
  # micro-batches too.
  runs = {name: str(tmp_path / name) for name in ("gathered", "streamed")}
  for name, array_input in (("gathered", "gather"), ("streamed", "dataset")):
    assert run_cli(f"--model_dir={runs[name]}", "--train_steps=30", *args,
                   "--grad_accum_steps=2", f"--array_input={array_input}",
                   python_path=TESTS).returncode == 0
  assert_bit_identical(runs["gathered"], runs["streamed"])


def test_stream_task_counts_a_generator_split_and_exports_dict_inputs(model_dir):
  results = trainer.train(Config(model_dir=model_dir, cpu_devices=4,
                                 per_replica_batch_size=4, train_steps=20,
                                 mode="train_and_eval", learning_rate=0.01,
                                 summaries=False),
                          task=user_tasks.StreamQuadratic(hidden=8))
  assert results["eval"]["examples"] == 77  # 5 global batches of 16, 3 padded.
  assert results["replica_batches"] == {f"replica_{i}": 20 for i in range(4)}
  served = tf.saved_model.load(os.path.join(model_dir, "export"))
  x, y = user_tasks._quadratic_arrays(77, seed=1)
  outputs = served.signatures["serving_default"](x=tf.constant(x))["outputs"].numpy()
  assert results["eval"]["mae"] == pytest.approx(
      float(np.mean(np.abs(outputs - y))), rel=1e-4)


def test_classification_default_numbers_are_unchanged(model_dir):
  """The quickstart's numbers from before the Task API (same seed, deterministic),
  bit for bit on the in-graph gather path. They were measured with TensorFlow's
  default of 2 intra-op threads on this 2-core machine; the split CPU now gives
  each replica 1, which sums in another order, so the test pins 2. And with
  Keras's own Adam ops: the fused kernel (the default since) rounds its constants
  otherwise (tests/test_fused_adam.py)."""
  process = run_cli("--flagfile=flags/quickstart.flags", "--deterministic",
                    "--intra_op_threads=2", "--fused_optimizer=false",
                    f"--model_dir={model_dir}")
  assert process.returncode == 0, process.stderr
  results = read_results(model_dir)
  assert results["train"] == pytest.approx(
      {"loss": 0.045057001113891604, "accuracy": 0.98890625, "step": 300}, rel=1e-6)
  assert results["eval"] == pytest.approx(
      {"loss": 0.29466934204101564, "accuracy": 0.9055555555555556, "examples": 360,
       "step": 300}, rel=1e-6)
  assert results["best_eval"]["step"] == 200
  assert results["best_metric"] == "eval/accuracy"


def test_progress_lines_parse_any_metric_names():
  line = "step 40/90  loss 0.5000  mae 1.2500  top-5 0.7500  1,234 examples/s  ETA ?"
  assert progress.parse_line(line) == {"step": 40, "train/loss": 0.5,
                                       "train/mae": 1.25, "train/top-5": 0.75}
  line = "eval at step 40: loss 0.2500  rmse 3.0000  (89 examples)"
  assert progress.parse_line(line) == {"step": 40, "eval/loss": 0.25,
                                       "eval/rmse": 3.0}
  assert progress.parse_line("model_dir x: resuming at step 3") == {}


def test_progress_numbers_keep_four_significant_digits_when_small():
  assert progress.format_metrics({"loss": 0.000021376, "accuracy": 0.93561,
                                  "examples": 5}) == "loss 2.138e-05  accuracy 0.9356"
  assert progress.format_metrics({"loss": 0.0, "fn": 12.0}) == "loss 0.0000  fn 12.0000"
  parsed = progress.parse_line("step 3/9  loss 2.138e-05  12 examples/s  ETA ?")
  assert parsed["train/loss"] == 2.138e-05
  # A matrix (a confusion matrix) is not a word of a line.
  assert progress.format_metrics({"loss": 1.0, "confusion": [[1.0, 2.0]]}) == (
      "loss 1.0000")


def test_readme_example_task_is_the_shipped_file_and_runs(model_dir):
  with open(os.path.join(REPO, "examples", "quadratic.py")) as f:
    example = f.read()
  with open(os.path.join(REPO, "README.md")) as f:
    readme = f.read()
  assert example[example.index("import dataclasses"):] in readme
  process = run_cli("--task=quadratic:Quadratic", "--task.hidden=64",
                    "--cpu_devices=2", "--mode=train_and_eval", "--learning_rate=0.01",
                    "--train_steps=20", f"--model_dir={model_dir}",
                    python_path=os.path.join(REPO, "examples"))
  assert process.returncode == 0, process.stderr
  assert read_results(model_dir)["eval"]["examples"] == 1000


def test_user_task_two_replicas_match_one_device(tmp_path):
  sgd = dict(optimizer="sgd", learning_rate=0.05, train_steps=8, summaries=False)
  trainer.train(Config(model_dir=str(tmp_path / "two"), cpu_devices=2,
                       per_replica_batch_size=16, **sgd),
                task=user_tasks.Quadratic(hidden=8))
  trainer.train(Config(model_dir=str(tmp_path / "one"), strategy="one_device",
                       per_replica_batch_size=32, **sgd),
                task=user_tasks.Quadratic(hidden=8))
  a, b = float_values(tmp_path / "two"), float_values(tmp_path / "one")
  assert a.keys() == b.keys() and sum(k.startswith("model/") for k in a) == 4
  for key in a:
    np.testing.assert_allclose(a[key], b[key], atol=1e-5, err_msg=key)


def test_a_tasks_optimizer_is_named_and_flags_txt_claims_no_rate_it_ignores(tmp_path):
  runs = {rate: str(tmp_path / rate) for rate in ("0.5", "0.001")}
  for rate, model_dir in runs.items():
    process = run_cli("--task=user_tasks:OwnOptimizer", "--train_steps=10",
                      f"--learning_rate={rate}", f"--model_dir={model_dir}",
                      python_path=TESTS)
    assert process.returncode == 0, process.stderr
    assert ("optimizer SGD from Task.build_optimizer, learning rate 0.01 "
            "(--optimizer, --learning_rate, --momentum, --weight_decay, "
            "--fused_optimizer do not apply)") in process.stdout.splitlines()[0]
  assert_bit_identical(*runs.values())  # The flag changed nothing.
  with open(os.path.join(runs["0.5"], "flags.txt")) as f:
    lines = f.read().splitlines()
  assert not [line for line in lines if line.startswith(
      ("--learning_rate", "--optimizer", "--momentum", "--weight_decay",
       "--fused_optimizer"))]
  assert lines[-1].startswith("# optimizer SGD from Task.build_optimizer")
  # The file still reproduces the run: a rerun from it resumes.
  rerun = run_cli(f"--flagfile={runs['0.5']}/flags.txt", "--train_steps=12",
                  python_path=TESTS)
  assert rerun.returncode == 0 and "resuming at step 10" in rerun.stdout, (
      rerun.stdout + rerun.stderr)


@pytest.mark.parametrize("name", ["step", "gradient_norm", "replica_3", "loss"])
def test_a_metric_named_as_a_summary_column_is_refused(name):
  from trainer.errors import TaskError
  from trainer.training import probe
  task = types.SimpleNamespace(metrics=lambda labels, outputs: {name: outputs})
  with pytest.raises(TaskError, match=f"'{name}' cannot be a metric name"):
    probe._task_metrics(task, None, tf.zeros([2]))


class _CountOver(keras.metrics.Metric):
  """The weighted count of examples whose error is over `threshold`, updated
  under a Python `if` on a tensor."""

  def __init__(self, threshold, **kwargs):
    super().__init__(**kwargs)
    self.threshold = threshold
    self.count = self.add_variable(shape=(), initializer="zeros", name="count",
                                   aggregation="sum")

  def update_state(self, y_true, y_pred, sample_weight=None):
    over = tf.cast(tf.abs(y_pred - y_true) > self.threshold, tf.float32)[:, 0]
    if sample_weight is not None:
      over *= sample_weight
    if tf.reduce_any(over > 0):
      self.count.assign_add(tf.reduce_sum(over))

  def result(self):
    if self.count > 0:  # A Python if on a tensor here too.
      return self.count
    return tf.zeros_like(self.count)


@dataclasses.dataclass
class _BranchyQuadratic(user_tasks.Quadratic):
  """Quadratic with Python `if` and `for` on tensors in each of its functions, as
  AutoGraph allows inside a tf.function (the framework's loops are traced without
  it, and convert a task's code themselves)."""

  def preprocess(self, features):
    if tf.reduce_max(tf.abs(features)) > 1e9:  # Never true; still a tensor test.
      features = tf.zeros_like(features)
    return features

  def loss(self, labels, outputs):
    error = tf.abs(outputs - labels)
    if tf.reduce_any(error > self.delta):
      quadratic = tf.minimum(error, self.delta)
    else:
      quadratic = error
    return tf.reduce_mean(0.5 * quadratic ** 2 + self.delta * (error - quadratic),
                          axis=-1)

  def metrics(self, labels, outputs):
    total = tf.zeros_like(labels[:, 0])
    for column in tf.range(tf.shape(labels)[1]):
      total += tf.abs(outputs[:, column] - labels[:, column])
    return {"mae": total / tf.cast(tf.shape(labels)[1], tf.float32)}

  def build_metrics(self):
    return {"over_one": _CountOver(1.0)}


def test_a_tasks_python_control_flow_on_tensors_is_converted(tmp_path):
  flags = dict(optimizer="sgd", learning_rate=0.05, train_steps=6, cpu_devices=2,
               per_replica_batch_size=16, grad_accum_steps=2, summaries=False,
               mode="train_and_eval")  # Not --deterministic: in-process, for good.
  branchy = trainer.train(Config(model_dir=str(tmp_path / "branchy"), **flags),
                          task=_BranchyQuadratic(hidden=8))
  plain = trainer.train(Config(model_dir=str(tmp_path / "plain"), **flags),
                        task=user_tasks.Quadratic(hidden=8))
  a, b = float_values(tmp_path / "branchy"), float_values(tmp_path / "plain")
  assert a.keys() == b.keys() and sum(k.startswith("model/") for k in a) == 4
  for key in a:
    np.testing.assert_allclose(a[key], b[key], atol=1e-6, err_msg=key)
  assert branchy["eval"]["mae"] == pytest.approx(
      plain["eval"]["mae"], abs=1e-6)
  features, labels = user_tasks.Quadratic().eval_data()
  _, model = trainer.load(str(tmp_path / "branchy"))
  errors = np.abs(model(features) - labels)
  assert branchy["eval"]["over_one"] == float((errors > 1.0).sum())
