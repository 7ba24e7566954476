"""`trainer.fit` is Keras's `model.fit` as the framework's run: on unshuffled
data and the same initial weights it trains as Keras does on one device (the
same weights and the same History, on 2 replicas), with Keras's callbacks
mapped to the run's own mechanisms; what it cannot honour is one line before
anything is written."""

import csv
import os
import re
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import trainer
from conftest import REPO, cli_env, read_results

RNG = np.random.default_rng(0)
X = RNG.normal(size=(640, 6)).astype("float32")
Y = ((X[:, 0] + 0.5 * RNG.normal(size=640)) > 0.8).astype("float32")[:, None]
WEIGHTS = np.where(X[:, 1] > 0, 2.0, 1.0).astype("float32")
VALIDATION = (X[512:], Y[512:])


def build(metrics=("accuracy",), optimizer=None):
  model = keras.Sequential([keras.Input((6,)),
                            keras.layers.Dense(16, activation="relu"),
                            keras.layers.Dense(1, activation="sigmoid")])
  model.compile(optimizer=optimizer or keras.optimizers.SGD(0.5),
                loss="binary_crossentropy", metrics=list(metrics))
  return model


def keras_fit(builder, *args, **kwargs):
  """Keras's own fit of the model trainer.fit would build (seeded alike)."""
  keras.utils.set_random_seed(0)
  model = builder()
  return model, model.fit(*args, verbose=0, **kwargs)


def assert_same_history(ours, theirs, *, rtol=1e-5, keys=None):
  assert set(ours.history) == set(theirs.history)
  assert ours.epoch == theirs.epoch
  for key in keys or theirs.history:
    np.testing.assert_allclose(ours.history[key], theirs.history[key], rtol=rtol,
                               atol=1e-6, err_msg=key)


def assert_same_weights(history, model):
  for ours, theirs in zip(history.model.weights, model.weights):
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-5,
                               err_msg=ours.path)


@pytest.mark.parametrize("weights", [
    {"sample_weight": WEIGHTS[:512]}, {"class_weight": {0: 1.0, 1: 3.0}}],
                         ids=["sample_weight", "class_weight"])
def test_fit_on_two_replicas_trains_as_keras_fit_with_weights(weights, model_dir):
  """Sample or class weights, a string metric and a streaming one, the
  History's Keras keys and values, and the trained model coming back."""
  arguments = dict(batch_size=64, epochs=4, shuffle=False,
                   validation_data=VALIDATION, **weights)
  builder = lambda: build(("accuracy", keras.metrics.AUC(name="auc")))  # noqa: E731
  history = trainer.fit(builder, X[:512], Y[:512], cpu_devices=2,
                        model_dir=model_dir, **arguments)
  model, theirs = keras_fit(builder, X[:512], Y[:512], **arguments)
  assert_same_history(history, theirs)
  assert history.params == {"verbose": 1, "epochs": 4, "steps": 8}
  assert_same_weights(history, model)
  # The model comes back compiled: its evaluate gives the recorded numbers.
  evaluated = history.model.evaluate(*VALIDATION, verbose=0, return_dict=True)
  for key, value in evaluated.items():
    assert value == pytest.approx(history.history[f"val_{key}"][-1], rel=1e-5)
  assert history.results["status"] == "completed"
  assert history.results["num_replicas"] == 2


def test_an_epoch_of_several_loop_calls_keeps_keras_values(model_dir):
  """steps_per_loop shorter than an epoch: its train values still Keras's, the
  loss and a mean (accuracy) as the calls' steps-weighted mean, a count
  (TruePositives) as their sum; a callback's batch ends at each call's end."""
  builder = lambda: build(("accuracy", keras.metrics.TruePositives(name="tp")))  # noqa: E731
  arguments = dict(batch_size=64, epochs=2, shuffle=False)
  hooks = Hooks()
  history = trainer.fit(builder, X[:512], Y[:512], model_dir=model_dir,
                        steps_per_loop=3, callbacks=[hooks], **arguments)
  _, theirs = keras_fit(builder, X[:512], Y[:512], **arguments)
  assert_same_history(history, theirs)
  assert [c[1] for c in hooks.calls if c[0] == "batch_end"] == [2, 5, 7, 2, 5, 7]


@pytest.mark.parametrize("as_lists", [False, True], ids=["dicts", "lists"])
def test_several_outputs_train_as_keras_fit(as_lists, model_dir):
  """Losses with loss weights and per-output metrics, by output name or in
  output order: Keras's per-output keys (OUTPUT_loss, OUTPUT_metric) and
  values (with sample weights: Keras's dict case cannot take them)."""
  labels = [(X[:512, 0] > 0).astype("int64"), X[:512, 1:2] * 2]

  def builder():
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, [
        keras.layers.Dense(2, activation="softmax", name="cls")(hidden),
        keras.layers.Dense(1, name="reg")(hidden)])
    losses, weights = ["sparse_categorical_crossentropy", "mse"], [1.0, 0.5]
    metrics = [["accuracy"], ["mae"]]
    if not as_lists:
      losses, weights, metrics = (dict(zip(["cls", "reg"], v))
                                  for v in (losses, weights, metrics))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=losses,
                  loss_weights=weights, metrics=metrics)
    return model

  y = labels if as_lists else dict(zip(["cls", "reg"], labels))
  arguments = dict(batch_size=64, epochs=3, shuffle=False, validation_split=0.25)
  if as_lists:
    arguments["sample_weight"] = WEIGHTS[:512]
  history = trainer.fit(builder, X[:512], y, model_dir=model_dir, **arguments)
  _, theirs = keras_fit(builder, X[:512], y, **arguments)
  assert "val_reg_loss" in theirs.history
  assert_same_history(history, theirs)


@pytest.mark.parametrize("as_dict", [False, True], ids=["list", "dict"])
def test_several_inputs_train_as_keras_fit(as_dict, model_dir):
  """Inputs as a list in the model's order or a dict by name; and the program
  run again trains nothing and returns the same History."""
  a, b = X[:512, :3], X[:512, 3:]

  def builder():
    first, second = keras.Input((3,), name="a"), keras.Input((3,), name="b")
    hidden = keras.layers.Dense(8, activation="relu")(
        keras.layers.Concatenate()([first, second]))
    model = keras.Model([first, second], keras.layers.Dense(
        1, activation="sigmoid")(hidden))
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  metrics=["accuracy"])
    return model

  x = {"a": a, "b": b} if as_dict else [a, b]
  arguments = dict(batch_size=64, epochs=2, shuffle=False, validation_split=0.25)
  history = trainer.fit(builder, x, Y[:512], model_dir=model_dir, **arguments)
  model, theirs = keras_fit(builder, x, Y[:512], **arguments)
  assert_same_history(history, theirs)
  assert_same_weights(history, model)
  again = trainer.fit(builder, x, Y[:512], model_dir=model_dir, **arguments)
  assert again.history == history.history


class Hooks(keras.callbacks.Callback):
  """Records the hooks Keras calls, with the logs' keys."""

  def __init__(self, stop_at_epoch=None):
    super().__init__()
    self.calls, self.stop_at_epoch = [], stop_at_epoch

  def on_train_begin(self, logs=None):
    self.calls.append(("train_begin",))

  def on_epoch_begin(self, epoch, logs=None):
    self.calls.append(("epoch_begin", epoch))

  def on_train_batch_end(self, batch, logs=None):
    self.calls.append(("batch_end", batch, tuple(sorted(logs))))

  def on_epoch_end(self, epoch, logs=None):
    self.calls.append(("epoch_end", epoch, tuple(sorted(logs))))
    if epoch == self.stop_at_epoch:
      self.model.stop_training = True

  def on_train_end(self, logs=None):
    self.calls.append(("train_end", tuple(sorted(logs))))


def _rows(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def test_keras_callbacks_on_a_dataset_act_as_in_keras(model_dir, tmp_path):
  """EarlyStopping (restoring the best weights) and ReduceLROnPlateau on
  val_loss, ModelCheckpoint's best file, CSVLogger's rows and a callback's own
  hooks, on batched datasets: the run stops at Keras's epoch with Keras's
  History, files and model."""
  train = tf.data.Dataset.from_tensor_slices((X[:512], Y[:512])).batch(64)
  val = tf.data.Dataset.from_tensor_slices(VALIDATION).batch(64)

  def callbacks(name):
    return [keras.callbacks.EarlyStopping(patience=2, min_delta=1e-4,
                                          restore_best_weights=True),
            keras.callbacks.ReduceLROnPlateau(patience=1, factor=0.5,
                                              min_delta=1e-4),
            keras.callbacks.CSVLogger(str(tmp_path / f"{name}.csv")),
            keras.callbacks.ModelCheckpoint(
                str(tmp_path / name / "best.weights.h5"), save_best_only=True,
                save_weights_only=True),
            Hooks()]

  ours_callbacks, their_callbacks = callbacks("ours"), callbacks("theirs")
  history = trainer.fit(build, train, epochs=30, validation_data=val,
                        callbacks=ours_callbacks, model_dir=model_dir)
  model, theirs = keras_fit(build, train, epochs=30, validation_data=val,
                            callbacks=their_callbacks)
  assert len(theirs.epoch) < 30  # Keras stopped early...
  assert_same_history(history, theirs)  # ...at the same epoch, as the run did.
  assert history.results["status"] == "early_stopped"
  assert min(theirs.history["learning_rate"]) < 0.5  # A reduction, logged.
  assert_same_weights(history, model)  # The best epoch's, as Keras restores.
  assert np.argmin(history.history["val_loss"]) < len(history.epoch) - 1
  for ours_row, their_row in zip(_rows(tmp_path / "ours.csv"),
                                 _rows(tmp_path / "theirs.csv"), strict=True):
    assert ours_row.keys() == their_row.keys()
    for key in their_row:
      assert float(ours_row[key]) == pytest.approx(float(their_row[key]), rel=1e-5)
  best = keras.models.clone_model(model)
  best.load_weights(tmp_path / "ours" / "best.weights.h5")
  model.load_weights(tmp_path / "theirs" / "best.weights.h5")
  for a, b in zip(best.weights, model.weights):
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)
  # Every hook Keras calls during training, in Keras's order and with its logs
  # (an epoch is one loop call: its only batch end is its last batch's).
  hooks = ours_callbacks[-1].calls
  assert hooks[0] == ("train_begin",) and hooks[-1][0] == "train_end"
  assert hooks[1:4] == [("epoch_begin", 0),
                        ("batch_end", 7, ("accuracy", "loss")),
                        ("epoch_end", 0, ("accuracy", "learning_rate", "loss",
                                          "val_accuracy", "val_loss"))]


def test_a_callback_stops_training_and_the_learning_rate_follows_a_schedule(
    model_dir):
  schedule = lambda epoch, rate: rate if epoch < 2 else rate * 0.5  # noqa: E731
  arguments = dict(batch_size=64, epochs=6, shuffle=False)
  hooks, theirs_hooks = Hooks(stop_at_epoch=3), Hooks(stop_at_epoch=3)
  history = trainer.fit(
      build, X[:512], Y[:512], model_dir=model_dir, **arguments,
      callbacks=[keras.callbacks.LearningRateScheduler(schedule), hooks])
  model, theirs = keras_fit(
      build, X[:512], Y[:512], **arguments,
      callbacks=[keras.callbacks.LearningRateScheduler(schedule), theirs_hooks])
  assert theirs.history["learning_rate"] == [0.5, 0.5, 0.25, 0.125]
  assert_same_history(history, theirs)
  assert_same_weights(history, model)
  assert history.results["status"] == "stopped"
  assert [c[:2] for c in hooks.calls if c[0] == "epoch_end"] == [
      ("epoch_end", e) for e in range(4)]


class Interrupt(keras.callbacks.Callback):
  """Stops the run in the middle of epoch 2 (at its batch 3): as Ctrl-C does,
  or with the requeue signal SLURM sends before a job's time limit."""

  def __init__(self, how):
    super().__init__()
    self.how, self.epochs_ended = how, 0

  def on_epoch_end(self, epoch, logs=None):
    self.epochs_ended += 1

  def on_train_batch_end(self, batch, logs=None):
    if self.epochs_ended == 2 and batch == 3:
      if self.how == "ctrl_c":
        raise KeyboardInterrupt
      os.kill(os.getpid(), signal.SIGUSR1)


@pytest.mark.parametrize("how", ["ctrl_c", "requeue"])
def test_an_interrupted_fit_resumes_to_the_straight_runs_history(
    how, tmp_path, monkeypatch):
  """Stopped mid-epoch (a checkpoint of that step; SystemExit 4, and under
  SLURM the job requeued), the program run again goes on from there: its
  History holds every epoch once, the interrupted epoch's values counted over
  both invocations, and its weights are the straight run's."""
  scontrol = tmp_path / "bin" / "scontrol"
  scontrol.parent.mkdir()
  scontrol.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'requeued'}\n")
  scontrol.chmod(0o755)
  monkeypatch.setenv("PATH", f"{scontrol.parent}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.setenv("SLURM_JOB_ID", "42")
  arguments = dict(batch_size=64, epochs=4, validation_data=VALIDATION,
                   steps_per_loop=4)
  straight = trainer.fit(build, X[:512], Y[:512],
                         model_dir=str(tmp_path / "straight"), **arguments)
  with pytest.raises(SystemExit) as stopped:
    trainer.fit(build, X[:512], Y[:512], model_dir=str(tmp_path / "resumed"),
                callbacks=[Interrupt(how)], **arguments)
  assert stopped.value.code == 4
  assert read_results(str(tmp_path / "resumed"))["status"] == (
      "requeued" if how == "requeue" else "interrupted")
  assert read_results(str(tmp_path / "resumed"))["global_step"] == 20
  if how == "requeue":
    assert (tmp_path / "requeued").read_text() == "requeue 42\n"
  resumed = trainer.fit(build, X[:512], Y[:512],
                        model_dir=str(tmp_path / "resumed"), **arguments)
  assert resumed.results["global_step"] == 32
  assert_same_history(resumed, straight, rtol=1e-6)
  for a, b in zip(resumed.model.weights, straight.model.weights):
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)


def test_a_diverging_fit_stops_with_the_nan_guard(model_dir, capsys):
  """As TerminateOnNaN, always: exit 3, divergence.json, the checkpoints
  kept."""
  with pytest.raises(SystemExit) as stopped:
    trainer.fit(lambda: build(optimizer=keras.optimizers.SGD(1e30)), X[:512],
                Y[:512] * 1e30, batch_size=64, epochs=3, model_dir=model_dir,
                callbacks=[keras.callbacks.TerminateOnNaN()])
  assert stopped.value.code == 3
  assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: ")
  assert os.path.isfile(os.path.join(model_dir, "divergence.json"))


def test_a_fit_run_is_loaded_with_its_task_or_as_its_keras_export(model_dir):
  history = trainer.fit(build, X[:512], Y[:512], batch_size=64, epochs=1,
                        model_dir=model_dir, verbose=0)
  _, model = trainer.load(model_dir, task=history.task)
  exported = keras.models.load_model(os.path.join(model_dir, "export",
                                                  "model.keras"))
  for a, b in zip(model.weights, exported.weights):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  # Its flags alone name no build() nor data: one line says how to load it.
  with pytest.raises(trainer.errors.TaskError, match=re.escape(
      "this run was made by trainer.fit(build, ...), whose build() and data live "
      "in the program that trained it: load its model with "
      "keras.models.load_model('MODEL_DIR/export/model.keras')")):
    trainer.load(model_dir)


def test_the_programs_command_line_gives_config_fields(model_dir, monkeypatch):
  monkeypatch.setattr("sys.argv", ["my_program.py", "--cpu_devices=2",
                                   f"--model_dir={model_dir}", "--seed=3",
                                   "--epochs=7"])  # Not a framework flag: left.
  history = trainer.fit(build, X[:512], Y[:512], batch_size=64, epochs=1,
                        model_dir="elsewhere", verbose=0)
  assert history.model_dir == model_dir
  assert history.results["num_replicas"] == 2
  assert not os.path.exists("elsewhere")


def test_the_keras_guide_runs_as_written(tmp_path):
  """docs/keras.md's program, in a fresh process."""
  with open(os.path.join(REPO, "docs", "keras.md")) as f:
    [program] = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
  ran = subprocess.run([sys.executable, "-c", program], cwd=tmp_path,
                       env=cli_env(PYTHONPATH=REPO), capture_output=True,
                       text=True, timeout=300, check=False)
  assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
  assert os.path.isdir(tmp_path / "runs" / "fit_digits" / "export")


def test_a_metric_of_several_values_is_reported_but_not_logged(model_dir):
  """F1Score per class (built on its first batch, as Keras builds it): in the
  run's results, not in Keras's scalar logs."""
  labels = keras.utils.to_categorical(Y[:512, 0].astype(int), 2)

  def builder():
    model = keras.Sequential([keras.Input((6,)),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss="categorical_crossentropy",
                  metrics=["accuracy", keras.metrics.F1Score()])
    return model

  history = trainer.fit(builder, X[:512], labels, epochs=1, validation_split=0.25,
                        model_dir=model_dir, verbose=0)
  assert sorted(history.history) == ["accuracy", "loss", "val_accuracy",
                                     "val_loss"]
  assert len(history.results["eval"]["f1_score"]) == 2


class _StopLearning(keras.callbacks.Callback):
  """Sets the optimizer's learning rate to 0 from the second epoch on."""

  def on_epoch_begin(self, epoch, logs=None):
    if epoch >= 1:
      self.model.optimizer.learning_rate = 0.0


def test_a_callback_that_sets_the_learning_rate_is_obeyed(model_dir):
  """The framework set the task optimizer's rate before every step, silently
  undoing a callback's `model.optimizer.learning_rate = x` (the loss went on
  falling); now a rate set from outside becomes the rate, as in Keras."""
  arguments = dict(batch_size=64, epochs=3, shuffle=False)
  history = trainer.fit(build, X[:512], Y[:512], callbacks=[_StopLearning()],
                        model_dir=model_dir, **arguments)
  _, theirs = keras_fit(build, X[:512], Y[:512], callbacks=[_StopLearning()],
                        **arguments)
  assert_same_history(history, theirs)
  assert history.history["loss"][1] == pytest.approx(history.history["loss"][2])
