"""Which of the user's methods an op that failed inside a loop belongs to.

The loops run the task's code in the graph: its model, `preprocess`, `loss`,
`metrics` and the `update_state` of its streaming metrics. Each runs in a name
scope that says whose it is, so an op error at run time (a `tf.debugging`
assertion in a metric, a bad gather in a custom layer) names the method in one
line, as an error raised while tracing does (errors.user_code), instead of a
TensorFlow node.

Example:

  with blame.scope("metric", "auc"):
    metric.update_state(labels, outputs)
  ...
  blame.method_of(error)  # "Task.build_metrics()['auc'] (update_state)"
"""

import re
from typing import Optional

import tensorflow as tf

_PREFIX = "user."
_END = ".end"
_METHODS = {"loss": "Task.loss", "metrics": "Task.metrics",
            "preprocess": "Task.preprocess"}
_NODE = re.compile(r"node '?([^\s'}\]]+)")


def scope(kind: str, name: str = "") -> tf.name_scope:
  """The name scope of one of the user's methods in a loop: `kind` "loss",
  "metrics", "preprocess", "model" (`name`: its class) or "metric" (`name`: the
  streaming metric's name)."""
  # ".end" closes the name: TensorFlow makes a scope unique with "_1", "_2",
  # which a metric's own name ("top_5") may end with too.
  return tf.name_scope(_PREFIX + kind + (f".{name}" if name else "") + _END)


def method_of(error: Exception) -> Optional[str]:
  """The user's method whose op raised `error` (a tf.errors.OpError of a loop
  call), or None when the failing node is the framework's."""
  for node in _NODE.findall(str(error)):
    owners = [part for part in node.split("/") if part.startswith(_PREFIX)]
    if owners:
      return _method(re.sub(r"\.end(_\d+)?$", "", owners[-1][len(_PREFIX):]))
  return None


def _method(owner: str) -> str:
  kind, _, name = owner.partition(".")
  if kind == "metric":
    return f"Task.build_metrics()[{name!r}] (update_state)"
  if kind == "model":
    return f"the model's call ({name})"
  return _METHODS.get(kind, f"Task.{kind}")
