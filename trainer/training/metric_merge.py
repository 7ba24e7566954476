"""The probe-time check that a task's streaming metrics merge exactly over
replicas: each metric's state, merged as Keras merges its variables' replica
copies (by their declared aggregation), must give what one device gives. A state
that does not (a running maximum, which Keras declares a sum) is refused before
the first step, in one line naming the metric."""

import numpy as np
import tensorflow as tf

from trainer.errors import TaskError, user_code

# How Keras merges a metric variable's replica copies when it is read, by its
# declared aggregation; "none" cannot be read across replicas at all.
_MERGES = {"sum": lambda states: np.sum(states, axis=0),
           "mean": lambda states: np.mean(states, axis=0),
           "only_first_replica": lambda states: states[0]}


def check_merge(streaming: dict, labels, outputs, weights, *, parts: int = 2):
  """Refuses a streaming metric whose state its variables' declared aggregation
  does not merge exactly over replicas (a running maximum declared "sum", Keras's
  default): the batch split in `parts`, each part on its own replica and the
  states merged as the replicas' copies are, must give what one device gives
  updated with the parts one after the other. Call on a probe batch; the metrics
  are reset after.

  Raises:
    TaskError: naming the metric, its variables' aggregation and the two results.
  """
  batch = int(tf.shape(weights)[0])
  if batch < 2 * parts:
    return
  # Parts of unequal sizes (a quarter, then the rest): replicas of an evaluation
  # carry unequal weight (weight-0 padding), which a state merged by "mean" must
  # survive.
  bounds = np.array([0, *(batch * (i + 1) // (2 * parts) for i in range(parts - 1)),
                     batch])
  for name, (metric, key) in streaming.items():
    _check_metric_merge(name, metric, labels, outputs if key is None else
                        outputs[key], weights, bounds)


def _check_metric_merge(name, metric, labels, predicted, weights, bounds):
  """check_merge of one metric, on the batch's parts between `bounds`."""
  def update(start, stop, *, reset=True):
    part = lambda t: t[start:stop]  # noqa: E731
    if reset:
      metric.reset_state()
    with user_code(f"Task.build_metrics()[{name!r}] (update_state)"):
      metric.update_state(tf.nest.map_structure(part, labels),
                          tf.nest.map_structure(part, predicted),
                          sample_weight=weights[start:stop])

  def result():
    with user_code(f"Task.build_metrics()[{name!r}] (result)"):
      return [np.asarray(v, np.float64) for v in tf.nest.flatten(metric.result())]

  states = []
  for start, stop in zip(bounds[:-1], bounds[1:]):
    update(start, stop)
    states.append([np.asarray(v.numpy()) for v in metric.variables])
  aggregations = [str(getattr(v, "aggregation", "sum")).lower()
                  for v in metric.variables]
  unmergeable = [v.path for v, a in zip(metric.variables, aggregations)
                 if a not in _MERGES]
  if unmergeable:
    raise TaskError(
        f"Task.build_metrics()[{name!r}]: its state {unmergeable[0]} has "
        "aggregation 'none', so its replicas' copies cannot be merged; declare "
        "how (add_variable(..., aggregation='sum', 'mean' or 'only_first_replica'))")
  for variable, aggregation, values in zip(metric.variables, aggregations,
                                           zip(*states)):
    variable.assign(_MERGES[aggregation](np.stack(values)))
  merged = result()
  metric.reset_state()
  for start, stop in zip(bounds[:-1], bounds[1:]):
    update(start, stop, reset=False)  # One device, batch after batch.
  single = result()
  metric.reset_state()
  if all(np.allclose(m, s, rtol=1e-4, atol=1e-6, equal_nan=True)
         for m, s in zip(merged, single)):
    return
  raise TaskError(
      f"Task.build_metrics()[{name!r}]: its state does not merge over replicas by "
      f"its variables' declared aggregation ({', '.join(sorted(set(aggregations)))}"
      f"): on {int(bounds[-1])} training examples it gives {_short(merged)} split "
      f"over {len(bounds) - 1} replicas but {_short(single)} on one device, so an "
      "evaluation on several replicas or workers would report a wrong value. A "
      "state such as a running maximum cannot be declared to Keras (its "
      "aggregations are sum, mean and only_first_replica): keep sums in the "
      "metric (e.g. counts of a histogram) and compute the rest in "
      "Task.finalize_metrics")


def _short(values: list) -> str:
  flat = np.concatenate([np.ravel(v) for v in values]) if values else np.array([])
  shown = ", ".join(f"{v:.4g}" for v in flat[:4])
  return shown + (", ..." if flat.size > 4 else "")
