"""--verify_equivalence: "N replicas equal one device", checked on the task's own
model before step 1.

The first global batch's gradients are computed the way training computes them
(each replica's per-replica batch, one all-reduce) and on one device (the whole
global batch, outside any replica), from the same weights; nothing is applied,
and every model variable (moving statistics, seed states) is given back its value.
Random layers (any layer holding a SeedGenerator) run as at inference for the
check: they equal one device in distribution, not in value. Above the bound, the
check finds what differs: the first layer whose outputs on a replica are not the
one device's rows (a layer with batch statistics, BatchNormalization with
--sync_batchnorm=false), else the loss (its value for an example depends on the
other examples of the batch, as with in-batch negatives), else the model's own
losses or gradients.

Example line:

  equivalence: 2 replicas vs 1 device on the first batch: max |dg| 3.1e-08 (<= 1e-5)
"""

import contextlib
import dataclasses
import functools
import re
import threading
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from trainer.data.base import weighted
from trainer.errors import TaskError
from trainer.training import replica_layers
from trainer.training.steps import float32_outputs

BOUND = 1e-5  # Invariant 3: N replicas and one device within 1e-5.
_SUM = tf.distribute.ReduceOp.SUM


@dataclasses.dataclass(frozen=True)
class Verdict:
  """What the check found.

  Attributes:
    replicas: replicas in sync.
    max_difference: the largest |gradient difference| over every weight.
    culprit: what differs, in words, when above the bound (else None).
  """
  replicas: int
  max_difference: float
  culprit: Optional[str] = None

  @property
  def holds(self) -> bool:
    return self.max_difference <= BOUND

  def line(self) -> str:
    line = (f"equivalence: {self.replicas} replicas vs 1 device on the first "
            f"batch: max |dg| {_short(self.max_difference)} "
            f"({'<=' if self.holds else '>'} {_short(BOUND)})")
    return line if self.holds else f"{line}: {self.culprit}"


def verify(trainer, train_data) -> Optional[Verdict]:
  """Runs the check on `trainer`'s model (every worker: it holds collectives).

  Args:
    trainer: the built Trainer (its weights those step 1 will start from).
    train_data: its training data (TaskData).

  Returns:
    The Verdict, or None on one replica (nothing to compare).
  """
  replicas = trainer.num_replicas
  if replicas == 1:
    return None
  batch = weighted(*train_data.first(trainer.global_batch_size), batched=True)
  model = trainer.model
  kept = _unique(list(model.variables) +
                 [g.state for g in replica_layers.seed_generators(model)])
  values = [tf.convert_to_tensor(v) for v in kept]
  recorder = _Recorder()
  try:
    with _random_layers_at_inference(model), recorder.recording(model):
      distributed, single = _both(trainer, recorder, batch)
  finally:
    for variable, value in zip(kept, values):
      variable.assign(value)
  difference = max(float(np.max(np.abs(a - b), initial=0.0))
                   for a, b in zip(distributed["gradients"], single["gradients"]))
  culprit = None
  if difference > BOUND:
    culprit = _culprit(trainer, distributed, single, recorder.layers)
  return Verdict(replicas=replicas, max_difference=difference, culprit=culprit)


def _short(value: float) -> str:
  """2 significant digits, the exponent without padding: 3.1e-8, 0.15, 1e-5."""
  return re.sub(r"e([+-])0*(\d)", lambda m: "e" + m[1].replace("+", "") + m[2],
                f"{value:.2g}")


def mixed_precision(trainer) -> bool:
  """Whether the model computes in float16 or bfloat16 (the check's bound is
  float32's)."""
  return trainer.model.compute_dtype in ("float16", "bfloat16")


def refusal(verdict: Verdict) -> TaskError:
  """The error of --verify_equivalence=strict above the bound."""
  return TaskError(f"--verify_equivalence=strict: {verdict.line()}; nothing was "
                   "written")


def _unique(variables: list) -> list:
  seen, unique = set(), []
  for variable in variables:
    if id(variable) not in seen:
      seen.add(id(variable))
      unique.append(variable)
  return unique


def _both(trainer, recorder, batch) -> tuple:
  """(the replicas' results, one device's) as numpy: "gradients" (all-reduced,
  dense), "losses" (per example, this worker's replicas concatenated in order),
  "layers" ([[each layer's outputs] per local replica], or [[...]] on one
  device)."""
  strategy = trainer.strategy
  per_replica = trainer.per_replica_batch_size
  variables = trainer.model.trainable_variables

  def replica_part(context):
    start = context.replica_id_in_sync_group * per_replica
    return tf.nest.map_structure(lambda t: t[start:start + per_replica], batch)

  parts = strategy.experimental_distribute_values_from_function(replica_part)

  def step(features, labels, weights):
    features = trainer.objective.preprocess(features)
    recorder.start()
    gradients, _, outputs = trainer.forward_backward(features, labels, weights)
    losses = trainer.objective.loss(labels, outputs, weights, training=True)
    return gradients, losses, recorder.take()

  @tf.function(autograph=False)
  def distributed():
    gradients, losses, layers = strategy.run(step, args=parts)
    reduced = strategy.extended.batch_reduce_to(
        _SUM, [(g, v.value) for g, v in zip(gradients, variables)])
    local = strategy.experimental_local_results
    return ([tf.convert_to_tensor(strategy.experimental_local_results(g)[0])
             for g in reduced], local(losses), [local(layer) for layer in layers])

  @tf.function(autograph=False)
  def single():
    gradients, losses, layers = step(*batch)
    return [tf.convert_to_tensor(g) for g in gradients], losses, layers

  gradients, losses, layers = distributed()
  replicas = len(losses)
  distributed_result = {
      "gradients": [g.numpy() for g in gradients],
      "losses": np.concatenate([t.numpy() for t in losses]),
      "layers": [[layer[r].numpy() for layer in layers] for r in range(replicas)],
      "first_replica": trainer.cluster.pipeline_id * replicas}
  gradients, losses, layers = single()
  single_result = {"gradients": [g.numpy() for g in gradients],
                   "losses": losses.numpy(),
                   "layers": [t.numpy() for t in layers]}
  return distributed_result, single_result


def _close(a, b) -> bool:
  scale = max(1.0, float(np.max(np.abs(b), initial=0.0)))
  return a.shape == b.shape and float(np.max(np.abs(a - b), initial=0.0)) <= (
      BOUND * scale)


def _culprit(trainer, distributed: dict, single: dict, layers: list) -> str:
  """Names what makes the replicas differ from one device: the first layer (in
  the order its calls ended) whose outputs differ, else the loss, else the rest."""
  per_replica = trainer.per_replica_batch_size
  first = distributed["first_replica"]
  for index, reference in enumerate(single["layers"]):
    if reference.shape[:1] != (trainer.global_batch_size,):
      continue  # Not one row per example: nothing to compare row by row.
    for local, outputs in enumerate(distributed["layers"]):
      start = (first + local) * per_replica
      if not _close(outputs[index], reference[start:start + per_replica]):
        return _layer_cause(layers[index])
  local_rows = slice(first * per_replica,
                     first * per_replica + len(distributed["losses"]))
  if not _close(distributed["losses"], single["losses"][local_rows]):
    return ("the loss (Task.loss) differs for the same outputs: an example's loss "
            "depends on the other examples of its replica's batch (e.g. in-batch "
            "negatives), so N replicas' per-example losses are not one device's; "
            "compute it from that example alone")
  return ("no layer output or per-example loss differs, the gradients do: the "
          "model's own losses (model.losses, e.g. an activity regularizer over the "
          "batch) or a custom gradient depend on the per-replica batch")


def _layer_cause(layer) -> str:
  name = f"layer {layer.name!r} ({type(layer).__name__})"
  if isinstance(layer, keras.layers.BatchNormalization) and not layer.synchronized:
    return (f"{name} normalises each replica's own batch "
            "(--sync_batchnorm=false); with --sync_batchnorm (the default) it uses "
            "the global batch's statistics")
  if isinstance(layer, keras.layers.BatchNormalization):
    return (f"{name} is synchronized, yet differs: called with a mask, it "
            "computes its statistics on each replica's batch")
  return (f"{name} gives the replicas other outputs than one device for the same "
          "examples: it computes over its batch (batch statistics); make it "
          "per-example, or synchronise it over the replicas")


class _Recorder:
  """Every layer's outputs in the order the calls end, per replica thread
  (MirroredStrategy traces its replicas in threads)."""

  def __init__(self):
    self._local = threading.local()
    self.layers = []  # The layer of each recorded output (the last trace's).

  def start(self):
    self._local.outputs, self._local.layers = [], []

  def add(self, layer, outputs):
    if getattr(self._local, "outputs", None) is None:
      return
    for tensor in tf.nest.flatten(outputs):
      if isinstance(tensor, tf.Tensor) and tensor.shape.rank:
        self._local.outputs.append(float32_outputs(tensor))
        self._local.layers.append(layer)

  def take(self) -> list:
    outputs, self.layers = self._local.outputs, self._local.layers
    self._local.outputs = None
    return outputs

  @contextlib.contextmanager
  def recording(self, model):
    layers = model._flatten_layers(include_self=True)  # Keras has no public list.
    with contextlib.ExitStack() as stack:
      for layer in layers:
        stack.enter_context(_wrapped_call(layer, self._recording_call))
      yield

  def _recording_call(self, layer, call, *args, **kwargs):
    outputs = call(*args, **kwargs)
    self.add(layer, outputs)
    return outputs


@contextlib.contextmanager
def _wrapped_call(layer, wrapper):
  """`layer.call` replaced by `wrapper(layer, call, ...)` for the block."""
  own = layer.__dict__.get("call")  # An earlier wrapper's, else the class's.
  call = layer.call
  wrapped = functools.wraps(call)(functools.partial(wrapper, layer, call))
  object.__setattr__(layer, "call", wrapped)  # Not tracked by Keras.
  try:
    yield
  finally:
    if own is None:
      object.__delattr__(layer, "call")
    else:
      object.__setattr__(layer, "call", own)


@contextlib.contextmanager
def _random_layers_at_inference(model):
  """Layers holding a SeedGenerator (Dropout, noise, Random* augmentations, a
  user's random layer) called with training=False for the block."""
  def at_inference(layer, call, *args, **kwargs):
    del layer
    if "training" in kwargs:
      kwargs["training"] = False
    return call(*args, **kwargs)

  with contextlib.ExitStack() as stack:
    for layer in model._flatten_layers(include_self=True):
      if getattr(layer, "_seed_generators", None) and layer is not model:
        stack.enter_context(_wrapped_call(layer, at_inference))
    yield
