"""Histograms of the weights and of their gradients every --histogram_every
steps (TensorBoard's Histograms and Distributions tabs)."""

from trainer.actions.base import Action, LoopCall, due, next_multiple


class Histograms(Action):
  """At every multiple of `every`: `weights/NAME` and `gradients/NAME` of each
  trainable variable, under MODEL_DIR/train. The gradients are that step's,
  all-reduced, before clipping (kept by the update: see UpdateRule)."""

  def __init__(self, *, trainer, summaries, every: int):
    self._trainer = trainer
    self._summaries = summaries
    self._every = every

  def next_stop(self, step):
    return next_multiple(step, self._every) if self._every else None

  def __call__(self, call: LoopCall):
    if not (due(call.step, self._every) and self._summaries.enabled):
      return
    for variable, gradient in zip(self._trainer.model.trainable_variables,
                                  self._trainer.rule.gradient_copies):
      self._summaries.histogram("train", call.step, f"weights/{variable.path}",
                                variable.numpy())
      self._summaries.histogram("train", call.step, f"gradients/{variable.path}",
                                gradient.numpy())
