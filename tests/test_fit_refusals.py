"""What trainer.fit cannot honour (a fit argument, a callback or an option of
one, a model it cannot train as Keras does) is one line on stderr and exit 2,
before anything is written; never ignored."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import trainer
from conftest import REPO, cli_env

X = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
Y = (X[:, :1] > 0).astype("float32")
C = keras.callbacks


def build(loss="binary_crossentropy", compiled=True):
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1,
                                                                  activation="sigmoid")])
  if compiled:
    model.compile(optimizer="sgd", loss=loss, metrics=["accuracy"])
  return model


class Probing(C.Callback):
  def on_test_begin(self, logs=None):
    pass


def _two_outputs():
  inputs = keras.Input((4,))
  model = keras.Model(inputs, [keras.layers.Dense(1, name="a")(inputs),
                               keras.layers.Dense(1, name="b")(inputs)])
  model.compile(optimizer="sgd", loss="mse")
  return model


def _scheduled():
  model = build(compiled=False)
  model.compile(optimizer=keras.optimizers.SGD(
      keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)),
      loss="binary_crossentropy")
  return model


DATASET = tf.data.Dataset.from_tensor_slices((X, Y)).batch(32)
CASES = {
    "initial_epoch": (dict(initial_epoch=2), "fit(initial_epoch=2): trainer.fit "
                      "resumes from its model_dir's checkpoint by itself"),
    "shuffle_batch": (dict(shuffle="batch"), "fit(shuffle='batch'): must be True "
                      "or False"),
    "unknown": (dict(validation_fraction=0.2), "fit(validation_fraction=...): not "
                "an argument of Keras's fit nor a Config field"),
    "owned": (dict(train_steps=100), "fit(train_steps=...): trainer.fit sets it "
              "from epochs (and steps_per_epoch)"),
    "compiled_optimizer": (dict(learning_rate=0.1), "fit(learning_rate=...): "
                           "trainer.fit sets it from model.compile(optimizer=...)"),
    "generator": (dict(x=(x for x in X)), "fit(x=...): a generator: trainer.fit "
                  "takes numpy arrays"),
    "batch_of_a_dataset": (dict(x=DATASET, y=None, batch_size=32),
                           "fit(batch_size=...): not with a dataset"),
    "unbatched_dataset": (dict(x=DATASET.unbatch(), y=None),
                          "fit(x=...): a dataset of single examples"),
    "split_and_data": (dict(validation_split=0.2, validation_data=(X, Y)),
                       "fit(validation_split=...): give validation_split or "
                       "validation_data, not both"),
    "too_large_batch": (dict(batch_size=512), "fit(batch_size=...): 512: more "
                        "than the 256 training examples"),
    "temporal_weights": (dict(sample_weight=np.ones((256, 3))),
                         "fit(sample_weight=...): one weight per example"),
    "progbar": (dict(callbacks=[C.ProgbarLogger()]), "callbacks: "
                "keras.callbacks.ProgbarLogger: trainer.fit does not support it"),
    "cooldown": (dict(validation_split=0.25, callbacks=[C.ReduceLROnPlateau(
        cooldown=2)]), "keras.callbacks.ReduceLROnPlateau: cooldown=2: not "
                 "supported"),
    "baseline": (dict(validation_split=0.25, callbacks=[C.EarlyStopping(
        baseline=0.5)]), "keras.callbacks.EarlyStopping: baseline=0.5: not "
                 "supported"),
    "train_monitor": (dict(validation_split=0.25, callbacks=[C.EarlyStopping(
        monitor="loss")]), "EarlyStopping: monitor='loss': the framework acts on "
                      "evaluations"),
    "no_validation": (dict(callbacks=[C.EarlyStopping()]), "EarlyStopping: "
                      "monitor='val_loss' needs validation data"),
    "two_min_deltas": (dict(validation_split=0.25, callbacks=[
        C.EarlyStopping(patience=3), C.ReduceLROnPlateau()]),
                       "ReduceLROnPlateau: min_delta=0.0001, but "
                       "keras.callbacks.EarlyStopping's differs"),
    "two_monitors": (dict(validation_split=0.25, callbacks=[
        C.EarlyStopping(patience=3, monitor="val_accuracy"),
        C.ReduceLROnPlateau(min_delta=0)]), "ReduceLROnPlateau: "
                     "monitor='val_loss', mode='auto', but "
                     "keras.callbacks.EarlyStopping watches 'val_accuracy'"),
    "scheduler_and_plateau": (dict(validation_split=0.25, callbacks=[
        C.ReduceLROnPlateau(), C.LearningRateScheduler(lambda e, r: r)]),
                              "LearningRateScheduler: with ReduceLROnPlateau"),
    "uncalled_hook": (dict(callbacks=[Probing()]), "Probing: on_test_begin is "
                      "never called"),
    "not_a_callback": (dict(callbacks=[print]), "callbacks: <built-in function "
                       "print> is not a keras.callbacks.Callback"),
    "unknown_monitor": (dict(validation_split=0.25, callbacks=[C.EarlyStopping(
        monitor="val_acc", patience=2)]), "EarlyStopping: monitor='val_acc' is "
                        "not in the logs, which hold loss, accuracy, val_loss, "
                        "val_accuracy"),
    "plateau_of_a_schedule": (dict(validation_split=0.25, build=lambda: _scheduled(),
                                   callbacks=[C.ReduceLROnPlateau()]),
                              "ReduceLROnPlateau: the compiled optimizer's "
                              "learning rate is a schedule"),
    "uncompiled": (dict(build=lambda: build(compiled=False)), "build() must "
                   "return a compiled model"),
    "not_a_model": (dict(build=lambda: "model"), "build() must return a compiled "
                    "keras.Model, got str"),
    "summed_loss": (dict(build=lambda: build(loss=keras.losses.BinaryCrossentropy(
        reduction="sum"))), "the loss 'binary_crossentropy' has reduction='sum'"),
    "class_weight_of_two_outputs": (
        dict(build=_two_outputs, y=[Y, Y], class_weight={0: 1.0, 1: 2.0}),
        "fit(class_weight=...): only for a model of one output"),
}


@pytest.mark.parametrize("case", CASES)
def test_what_fit_cannot_honour_is_one_line_before_anything_is_written(
    case, model_dir, capsys):
  arguments, fragment = CASES[case]
  arguments = dict(dict(build=build, x=X, y=Y, epochs=2), **arguments)
  with pytest.raises(SystemExit) as exited:
    trainer.fit(model_dir=model_dir, verbose=0, **arguments)
  assert exited.value.code == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  assert fragment in lines[0], lines[0]
  assert not os.path.exists(model_dir)


def test_the_programs_own_flags_are_left_to_it(model_dir, monkeypatch):
  """Only the running flags are read from a program's command line: its own
  --learning_rate or --train_steps (which trainer.fit sets from compile and
  epochs) are its own, and --cpu_devices is the run's."""
  monkeypatch.setattr("sys.argv", ["my_program.py", "--learning_rate=0.5",
                                   "--train_steps=10", "--cpu_devices=2"])
  history = trainer.fit(build, X, Y, batch_size=64, epochs=1,
                        model_dir=model_dir)
  assert history.results["num_replicas"] == 2
  assert history.results["global_step"] == len(X) // 64


def test_an_error_of_the_users_build_is_its_traceback_and_one_line(model_dir,
                                                                   capsys):
  def broken():
    raise ValueError("no such layer")

  with pytest.raises(SystemExit) as exited:
    trainer.fit(broken, X, Y, model_dir=model_dir)
  assert exited.value.code == 1
  err = capsys.readouterr().err
  assert "Traceback" in err and 'raise ValueError("no such layer")' in err
  assert err.strip().splitlines()[-1] == (
      "error: build() raised ValueError: no such layer (the checkpoints written "
      "so far are kept)")


PROGRAM = """
import numpy as np, keras, tensorflow as tf, trainer
tf.constant(1.0)  # TensorFlow starts before trainer.fit, on one CPU device.
def build():
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
  model.compile(optimizer="sgd", loss="mse")
  return model
x = np.ones((64, 4), "float32")
history = trainer.fit(build, x, x[:, :1], batch_size=16, verbose=0)
print("replicas", history.results["num_replicas"])
"""


def test_a_program_that_ran_tensorflow_is_restarted_with_its_devices(tmp_path):
  """Its CPU cannot be split into replicas any more: trainer.fit runs the
  program again from its start, with the devices set up first."""
  program = tmp_path / "program.py"
  program.write_text(PROGRAM)
  command = [sys.executable, str(program), "--cpu_devices=2",
             f"--model_dir={tmp_path / 'run'}"]
  ran = subprocess.run(command, cwd=tmp_path, env=cli_env(PYTHONPATH=REPO),
                       capture_output=True, text=True, timeout=240, check=False)
  assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
  assert ran.stdout.count("restarting the program as python -m "
                          "trainer.keras_fit") == 1
  assert "replicas 2" in ran.stdout


def test_a_program_that_cannot_be_restarted_is_one_line(model_dir, monkeypatch,
                                                         capsys):
  """Here: this process has 4 CPU devices, and was restarted already."""
  from trainer.keras_fit import program
  monkeypatch.setattr(program, "_started_here", [{}])
  with pytest.raises(SystemExit) as exited:
    trainer.fit(build, X, Y, cpu_devices=5, model_dir=model_dir)
  assert exited.value.code == 2
  assert capsys.readouterr().err == (
      "error: TensorFlow ran before trainer.fit, and this run needs its devices "
      "set up first (a MultiWorkerMirroredStrategy, or a CPU split into "
      "--cpu_devices replicas): run the program as python -m trainer.keras_fit "
      "PROGRAM.py, with the devices' flags on its command line\n")
  assert not os.path.exists(model_dir)


def test_launch_workers_takes_no_evaluator_beside_a_command(capsys):
  """An evaluator runs --mode=continuous_eval: trainer flags, not a program."""
  from trainer.distribute import launcher
  with pytest.raises(SystemExit) as exited:
    launcher.main(["--num_workers=2", "--evaluator", "--", sys.executable,
                   "my_program.py"])
  assert exited.value.code == 2
  assert capsys.readouterr().err == (
      "launch_workers.py: error: --evaluator: only with trainer flags (python -m "
      "trainer.main's), not a command\n")
