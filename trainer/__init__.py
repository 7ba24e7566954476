"""trainer: a TensorFlow 2 custom training loop on tf.distribute.

    import trainer
    results = trainer.train(trainer.Config(train_steps=100))
    results = trainer.train(trainer.Config(train_steps=100), task=MyTask(hidden=64),
                            actions=[trainer.every(50, log_something)])
    task, model = trainer.load("runs/q1")
    history = trainer.fit(build, x, y, epochs=10, validation_split=0.2,
                          callbacks=[keras.callbacks.EarlyStopping(patience=3)])

A user's problem is a `trainer.Task` (trainer/tasks/base.py); an action is any
callable receiving a `trainer.ActionContext` (trainer/actions/user.py). Importing
this package does not import TensorFlow; `train`, `load` and `fit` do.
"""

from trainer.actions.user import STOP, ActionContext, every
from trainer.config import Config
from trainer.errors import ExitCode, RunStatus
from trainer.tasks.base import RunContext, Task, hyperparameter


def train(config: Config = None, *, task: Task = None, actions=()) -> dict:
  """Runs `config.mode` (train, train_and_eval or eval) and returns the results.

  Args:
    config: the run's configuration (default: `Config()`).
    task: the task to train; default: the one `config.task` names, with
      `config.task_params`.
    actions: callables run after every loop call, after the task's own
      (`Task.actions()`); each receives a `trainer.ActionContext` and may return
      `trainer.STOP`. Wrap one in `trainer.every(N, action)` to run it every N
      steps.

  Returns:
    The dict also written to MODEL_DIR/results.json.

  Raises:
    trainer.errors.TrainerError: bad input, a locked model_dir, divergence, a
      replica that did not get exactly one batch per step, or user code that
      raised (UserCodeError, whose __cause__ is the user's exception).
  """
  from trainer.training import run  # Deferred: TensorFlow is slow to import.
  return run.run(config or Config(), task, actions=actions)


def load(model_dir: str, *, best: bool = False, task: Task = None) -> tuple:
  """The task and the Keras model of a trained run, for prediction in Python.

  Args:
    model_dir: the run directory.
    best: the best evaluation's weights instead of the latest checkpoint's.
    task: the run's task instance, for a task its flags cannot rebuild (one
      made in the program that trained it, e.g. a trainer.fit run's);
      default: the task the run's flags.txt names.

  Returns:
    (task, model): the task prepared as in training, the model holding the
    weights evaluations and exports use (the moving averages with --ema_decay).

  Raises:
    trainer.errors.ModelDirError: not a run, or no (best) checkpoint.
  """
  from trainer.training import open_run  # Deferred: TensorFlow is slow to import.
  return open_run.load(model_dir, best=best, task=task)


def fit(build, x=None, y=None, **arguments):
  """Keras's `model.fit`, as a run of the framework: `build()` returns a new
  compiled Keras model (the framework calls it under the strategy's scope).

      history = trainer.fit(build, x_train, y_train, batch_size=64, epochs=10,
                            validation_split=0.2, model_dir="runs/fit1",
                            callbacks=[keras.callbacks.EarlyStopping(patience=3)])

  Takes Keras's fit arguments and callbacks, and any Config field as a keyword
  (or as a flag on the program's command line); docs/keras.md lists what each
  maps to. Returns a keras.callbacks.History (its `model` is the trained model).
  A bad argument, a refused callback, a failed run, or a run stopped before its
  end (rerun to resume) is one line and SystemExit with the framework's exit
  code. See trainer/keras_fit/fit.py.
  """
  from trainer import keras_fit  # Deferred: imports TensorFlow.
  return keras_fit.fit(build, x, y, **arguments)


__all__ = ["ActionContext", "Config", "ExitCode", "RunContext", "RunStatus", "STOP",
           "Task", "every", "fit", "hyperparameter", "load", "train"]
