"""trainer: a TensorFlow 2 custom training loop on tf.distribute.

    import trainer
    results = trainer.train(trainer.Config(train_steps=100))
    results = trainer.train(trainer.Config(train_steps=100), task=MyTask(hidden=64))

A user's problem is a `trainer.Task` (see trainer/tasks/base.py). Importing this
package does not import TensorFlow; `train` does.
"""

from trainer.config import Config
from trainer.tasks.base import Task


def train(config: Config = None, *, task: Task = None) -> dict:
  """Runs `config.mode` (train, train_and_eval or eval) and returns the results.

  Args:
    config: the run's configuration (default: `Config()`).
    task: the task to train; default: the one `config.task` names, with
      `config.task_params`.

  Returns:
    The dict also written to MODEL_DIR/results.json.

  Raises:
    trainer.errors.TrainerError: bad input, a locked model_dir, divergence, or a
      replica that did not get exactly one batch per step.
  """
  from trainer.training import run  # Deferred: TensorFlow is slow to import.
  return run.run(config or Config(), task)


__all__ = ["Config", "Task", "train"]
