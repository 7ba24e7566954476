"""What a compiled Keras model says, as a Task computes it: the per-example loss
and the streaming metrics of `model.compile(...)`.

Keras resolves `compile`'s strings ("accuracy", "crossentropy") from the shapes
of the labels and the outputs; `bind` does it the same way (Keras's own
resolvers), on a probe batch, and names each metric as Keras's logs do
(`accuracy`; `OUTPUT_accuracy` for a model of several outputs, `OUTPUT_loss`
for each output's loss). This module holds trainer.fit's reaches into Keras
internals through trainer/internals.py (the compile arguments, Keras's
resolvers of strings), for the Keras versions setup.cfg allows.

The loss of an example is the sum over outputs of its loss weight times the
mean of the output's loss over its non-batch elements: averaged over the global
batch (times the sample weights), that is Keras's `sum_over_batch_size`.
"""

import keras
import tensorflow as tf

from trainer import internals
from trainer.errors import TaskError
from trainer.keras_fit.data import OUTPUT

_PER_EXAMPLE_REDUCTIONS = ("sum_over_batch_size", "mean")
# compile() arguments that say how Keras runs its own loop, not what it trains.
_EXECUTION = ("run_eagerly", "steps_per_execution", "jit_compile")


def compile_arguments(model) -> dict:
  """The arguments `model.compile` was called with.

  Raises:
    TaskError: the model was not compiled, or has no loss.
  """
  config = internals.compile_config(model)
  if not getattr(model, "compiled", False) or config is None:
    raise TaskError("build() must return a compiled model: call model.compile("
                    "optimizer=..., loss=..., metrics=[...]) in build()")
  if config.get("loss") is None:
    raise TaskError("build(): model.compile() was given no loss; trainer.fit "
                    "trains the compiled loss (model.compile(loss=...))")
  return {k: v for k, v in config.items() if k not in _EXECUTION}


class FitMetric(keras.metrics.Metric):
  """A compiled metric as a Task's streaming metric: it reads its own output
  (a model of several outputs) and, as Keras's `metrics=` are, is unweighted
  by the sample weights, examples of weight 0 included (the evaluation's
  padding never reaches a metric: steps.make_eval_loop takes it out)."""

  def __init__(self, metric: keras.metrics.Metric, *, output, weighted: bool,
               outputs: "Outputs"):
    super().__init__(name=metric.name)
    self.metric = metric
    self._output, self._weighted, self._outputs = output, weighted, outputs
    self._direction = internals.metric_direction(metric)

  def update_state(self, y_true, y_pred, sample_weight=None):
    labels = self._outputs.labels(y_true)[self._output]
    predicted = self._outputs.outputs(y_pred)[self._output]
    if not self._weighted:  # The framework keeps the eval padding out.
      sample_weight = None
    self.metric.update_state(labels, predicted, sample_weight=sample_weight)

  def reset_state(self):
    self.metric.reset_state()

  def result(self):
    return self.metric.result()


class Outputs:
  """The model's outputs and labels by output name, whatever their structure
  (one tensor, a list in the model's output order, or a dict)."""

  def __init__(self, names: tuple, *, positional_labels: bool = False):
    """Args:
      names: the outputs' names, in the model's order.
      positional_labels: the labels are a dict of OUTPUT_0, OUTPUT_1, ...
        (fit() was given a list): the outputs' in that order.
    """
    self.names = names
    self._positional = positional_labels

  def outputs(self, outputs) -> dict:
    if isinstance(outputs, dict):
      return outputs
    if isinstance(outputs, (list, tuple)):
      return dict(zip(self.names, outputs))
    return {self.names[0]: outputs}

  def labels(self, labels) -> dict:
    if isinstance(labels, dict) and self._positional:
      return {name: labels[f"{OUTPUT}_{i}"] for i, name in enumerate(self.names)}
    if isinstance(labels, dict) and len(self.names) > 1:
      return labels
    if isinstance(labels, dict):  # One output: its labels under its name.
      return {self.names[0]: next(iter(labels.values()))}
    if isinstance(labels, (list, tuple)):
      return dict(zip(self.names, labels))
    return {self.names[0]: labels}


def output_names(model, outputs) -> tuple:
  """The names Keras gives the model's outputs: the dict's keys, the functional
  model's output names, or one name."""
  if isinstance(outputs, dict):
    return tuple(outputs)
  if isinstance(outputs, (list, tuple)):
    names = tuple(getattr(model, "output_names", None) or ())
    if len(names) != len(outputs):
      names = tuple(f"output_{i}" for i in range(len(outputs)))
    return names
  return ("output",)


def _per_output(value, names: tuple, *, what: str) -> dict:
  """compile()'s `what` (loss, loss_weights, metrics) as {output name: value}:
  one value for every output, a list in output order, or a dict by name."""
  if isinstance(value, dict):
    unknown = sorted(set(value) - set(names))
    if unknown:
      raise TaskError(f"build(): model.compile({what}=...) names output(s) "
                      f"{', '.join(map(repr, unknown))}; the model's outputs are "
                      f"{', '.join(map(repr, names))}")
    return {name: value.get(name) for name in names}
  if isinstance(value, (list, tuple)) and len(names) > 1:
    if len(value) != len(names):
      raise TaskError(f"build(): model.compile({what}=...) has {len(value)} "
                      f"entries for the model's {len(names)} outputs")
    return dict(zip(names, value))
  if isinstance(value, (list, tuple)) and what != "metrics" and len(value) == 1:
    return {names[0]: value[0]}
  return dict.fromkeys(names, value)


class CompiledModel:
  """A compiled model's loss and metrics, resolved on a probe batch (`bind`)."""

  def __init__(self, model):
    self.arguments = compile_arguments(model)
    self.outputs = None  # Outputs, once bound.
    self._losses = {}  # {output name: (keras.losses.Loss, weight)}
    self.metrics = {}  # {name as Keras logs it: FitMetric}

  @property
  def output_losses(self) -> tuple:
    """The names Keras logs each output's loss under (several outputs only)."""
    if len(self._losses) < 2:
      return ()
    return tuple(f"{name}_loss" for name in self._losses)

  def bind(self, model, labels, outputs, *, positional_labels: bool = False):
    """Resolves the compiled loss and metrics on a probe batch, as Keras does on
    the first batch; builds the metrics (call inside the strategy's scope).

    Raises:
      TaskError: a loss that is not averaged over the batch, masked outputs,
        or compile arguments that do not fit the model's outputs.
    """
    names = output_names(model, outputs)
    self.outputs = Outputs(names, positional_labels=positional_labels)
    given = (labels, outputs)  # As the steps give them to the metrics.
    outputs, labels = self.outputs.outputs(outputs), self.outputs.labels(labels)
    for name, value in outputs.items():
      if internals.keras_mask(value) is not None:
        raise TaskError(
            f"build(): the model's output {name!r} carries a Keras mask: Keras "
            "averages a masked loss over the batch's unmasked steps, which is "
            "not a sum of per-example losses; trainer.fit cannot train it on "
            "several replicas as on one device")
    missing = [name for name in names if name not in labels]
    if missing:
      raise TaskError(f"fit(y=...): no labels for the model's output(s) "
                      f"{', '.join(map(repr, missing))}")
    args = self.arguments
    losses = _per_output(args["loss"], names, what="loss")
    weights = _per_output(args.get("loss_weights"), names, what="loss_weights")
    self._losses = {}
    for name in names:
      if losses[name] is None:
        continue
      loss = internals.resolved_loss(losses[name], labels[name], outputs[name])
      reduction = getattr(loss, "reduction", "sum_over_batch_size")
      if reduction not in _PER_EXAMPLE_REDUCTIONS:
        raise TaskError(
            f"build(): the loss {loss.name!r} has reduction={reduction!r}; "
            "trainer.fit averages per-example losses over the global batch, as "
            "Keras's default reduction='sum_over_batch_size'")
      self._losses[name] = (loss, 1.0 if weights[name] is None else
                            float(weights[name]))
    self.metrics = {}
    for weighted, key in ((False, "metrics"), (True, "weighted_metrics")):
      if not args.get(key):
        continue
      per_output = (dict.fromkeys(names[:1], args[key]) if len(names) == 1 else
                    _per_output(args[key], names, what=key))
      for name, identifiers in per_output.items():
        for identifier in _as_list(identifiers):
          metric = internals.resolved_metric(identifier, labels[name], outputs[name])
          self._add_metric(FitMetric(metric, output=name, weighted=weighted,
                                     outputs=self.outputs),
                           prefix=f"{name}_" if len(names) > 1 else "",
                           weighted=weighted)
    for metric in self.metrics.values():
      # Built now, as Keras builds a metric on its first batch (F1Score's state
      # takes the outputs' shape): then its result has its shape.
      metric.update_state(*given)
      metric.reset_state()

  def _add_metric(self, metric, *, prefix: str, weighted: bool):
    """Names a metric as Keras's logs do: a second "accuracy" is "accuracy_1",
    a weighted one already named "weighted_accuracy"."""
    name = f"{prefix}{metric.name}"
    if name in self.metrics and weighted:
      name = f"{prefix}weighted_{metric.name}"
    base, index = name, 1
    while name in self.metrics or name in self.output_losses:
      name, index = f"{base}_{index}", index + 1
    self.metrics[name] = metric

  def direction(self, name: str):
    """"max" or "min" for a metric Keras logs as `name` (its own direction, or a
    loss's), or None where Keras cannot tell either."""
    if "loss" in name:
      return "min"
    metric = self.metrics.get(name)
    direction = internals.metric_direction(metric)
    return {"up": "max", "down": "min"}.get(direction)

  @tf.autograph.experimental.do_not_convert
  def output_loss(self, name: str, labels, outputs):
    """The per-example loss of output `name`, unweighted: the mean of its
    elements past the batch dimension."""
    loss, _ = self._losses[name]
    y_true = tf.cast(self.outputs.labels(labels)[name], loss.dtype)
    y_pred = tf.cast(self.outputs.outputs(outputs)[name], loss.dtype)
    values = tf.convert_to_tensor(loss.call(y_true, y_pred))
    if values.shape.rank and values.shape.rank > 1:
      values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
    return values

  @tf.autograph.experimental.do_not_convert
  def per_example_loss(self, labels, outputs):
    """The compiled loss of each example: the outputs' losses times their
    loss weights, summed."""
    total = None
    for name, (_, weight) in self._losses.items():
      values = self.output_loss(name, labels, outputs) * weight
      total = values if total is None else total + values
    return total


def _as_list(value) -> list:
  if value is None:
    return []
  return list(value) if isinstance(value, (list, tuple)) else [value]
