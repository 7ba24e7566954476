"""A user action: the eval split's confusion matrix in TensorBoard, every N steps.

From Python, on any classification task:

    import sys; sys.path.insert(0, "examples")
    import trainer
    from confusion_matrix import ConfusionMatrix, digits_eval_split
    images, labels = digits_eval_split()
    results = trainer.train(
        trainer.Config(train_steps=200, model_dir="runs/confusion"),
        actions=[trainer.every(50, ConfusionMatrix(images, labels, num_classes=10))])

or from the command line, with the task below that adds it to the built-in
classification (`PYTHONPATH=examples python -m trainer.main
--task=confusion_matrix:DigitsWithConfusion --model_dir=runs/confusion`). The
matrix appears in TensorBoard's Images tab (rows: true class, columns:
predicted) and as a table in its Text tab, under train/confusion_matrix.
"""

import dataclasses

import numpy as np

import trainer
from trainer.tasks.classification import Classification


class ConfusionMatrix:
  """Counts (true class, predicted class) over some examples; writes the counts as
  an image and a table. The model's inputs are `preprocess(features)`."""

  def __init__(self, features, labels, *, num_classes: int, preprocess=None):
    self.features, self.labels = features, np.asarray(labels)
    self.num_classes = num_classes
    self.preprocess = preprocess or (lambda x: x)
    self.latest = None  # The last matrix written, for a test or a notebook.

  def __call__(self, context: trainer.ActionContext):
    if not context.is_chief:  # Every worker runs actions; one writes.
      return None
    logits = np.asarray(context.model(self.preprocess(self.features),
                                      training=False))
    predicted = logits.argmax(axis=-1)
    matrix = np.zeros((self.num_classes, self.num_classes), np.int64)
    np.add.at(matrix, (self.labels, predicted), 1)
    self.latest = matrix
    # Brighter is more: each row scaled to its largest count, 16 pixels a cell.
    scaled = matrix / np.maximum(matrix.max(axis=1, keepdims=True), 1)
    image = np.kron(scaled, np.ones((16, 16)))[..., None]
    context.summaries.image("confusion_matrix", image)
    header = "| true \\ predicted | " + " | ".join(map(str, range(self.num_classes)))
    rows = [f"| {i} | " + " | ".join(map(str, row)) for i, row in enumerate(matrix)]
    context.summaries.text("confusion_matrix", "\n".join(
        [header + " |", "|---" * (self.num_classes + 1) + "|",
         *[row + " |" for row in rows]]))
    return None


def digits_eval_split():
  """The built-in digits' eval images and labels, as the classification task
  stores them (pixels 0..16)."""
  from trainer.tasks import image_data
  source = image_data.load_source(Classification(), seed=0)
  return source.x_test.astype(np.float32), source.y_test


@dataclasses.dataclass
class DigitsWithConfusion(Classification):
  """The built-in classification, with the confusion matrix every `every` steps."""

  every: int = 100

  layout_fields = Classification.layout_fields

  def actions(self):
    return [trainer.every(self.every, ConfusionMatrix(
        self.source.x_test.astype(np.float32), self.source.y_test,
        num_classes=self.source.num_classes, preprocess=self.preprocess))]
