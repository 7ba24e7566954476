"""The training machinery: set-up, state, compiled steps, the controller and its
actions, evaluation and checkpoints. `run.run` is `trainer.train`."""
