"""trainer: a TensorFlow 2 custom training loop on tf.distribute.

    import trainer
    results = trainer.train(trainer.Config(dataset="digits", train_steps=100))

Importing this package does not import TensorFlow; `train` does.
"""

from trainer.config import Config


def train(config: Config) -> dict:
  """Runs `config.mode` (train, train_and_eval or eval) and returns the results.

  Args:
    config: the run's configuration.

  Returns:
    The dict also written to MODEL_DIR/results.json.

  Raises:
    trainer.errors.TrainerError: bad input, a locked model_dir, divergence, or a
      replica that did not get exactly one batch per step.
  """
  from trainer import loop  # Deferred: TensorFlow is slow to import.
  return loop.run(config)


__all__ = ["Config", "train"]
