"""examples/tf_distributed_tutorial.py ported to a `trainer.Task`: the same model,
loss and metric, without the loop, the strategy or the distributed datasets.

    PYTHONPATH=examples python -m trainer.main --task=tutorial_task:Tutorial \\
        --cpu_devices=2 --global_batch_size=64 --train_steps=200 \\
        --model_dir=runs/tutorial
"""

import dataclasses

import keras

import tf_distributed_tutorial
import trainer


@dataclasses.dataclass
class Tutorial(trainer.Task):
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  metric_goals = {"accuracy": "max"}

  def __post_init__(self):
    self.train, self.test = tf_distributed_tutorial.load_data()

  def build_model(self):
    return tf_distributed_tutorial.create_model()

  def build_metrics(self):
    return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}

  def train_data(self):
    return self.train

  def eval_data(self):
    return self.test
