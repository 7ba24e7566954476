"""examples/keras_imbalanced.py ported to a `trainer.Task`: its model, metrics
and class weights as they were, now on any number of replicas or workers, with
exact evaluation, resume and export.

    PYTHONPATH=examples python -m trainer.main --task=imbalanced_task:Fraud \\
        --cpu_devices=2 --global_batch_size=64 --train_steps=150 \\
        --eval_every=50 --model_dir=runs/fraud
"""

import dataclasses

import keras

import keras_imbalanced
import trainer


@dataclasses.dataclass
class Fraud(trainer.Task):
  dropout: float = trainer.hyperparameter(0.3, "Dropout rate.", lower=0.0,
                                          upper=0.9)

  loss = keras.losses.BinaryCrossentropy()
  best_metric = "eval/auc"
  metric_goals = {"auc": "max", "precision": "max", "recall": "max", "tp": "max",
                  "tn": "max"}

  def __post_init__(self):
    self.train, self.validation = keras_imbalanced.load_data()
    self.class_weight = keras_imbalanced.class_weights(self.train[1])

  def build_model(self):
    return keras_imbalanced.build_model(self.train[0].shape[1:],
                                        dropout=self.dropout)

  def build_metrics(self):
    return {metric.name: metric for metric in keras_imbalanced.make_metrics()}

  def build_optimizer(self):
    return keras.optimizers.Adam(1e-2)

  def train_data(self):
    return self.train

  def eval_data(self):
    return self.validation
