"""--verify_equivalence: "N replicas equal one device", checked on the task's own
model against the round-off floor.

At the weights the run's next step starts from (after a restore) and on the
global batch that step reads, the gradients are computed three ways, nothing
applied and every model variable (moving statistics, seed states) given back its
value after:

- the replicas': each replica its per-replica batch through the patched layers
  (synchronized BatchNormalization), one all-reduce: what training computes;
- one device's: the whole global batch outside any replica, through the layers
  as Keras built them (BatchNormalization's own moments): what one device
  computes;
- one device's again on the global batch in other orders (reversed, and
  rotated by half): the round-off floor, what float summation order alone
  changes.

Each variable is compared on its own scale (its one-device gradient's largest
magnitude): the replicas hold where every variable's difference is within
`FLOOR_FACTOR` times its floor, or `BOUND` of its scale. A variable whose
gradient is round-off (the bias before a BatchNormalization, whose true gradient
is 0) differs by its whole scale between two orders on one device: within its
floor, it holds, and the line counts such variables, since an optimizer that
normalises its steps (Adam) turns their round-off into steps of the learning
rate. Random layers (any layer holding a SeedGenerator) run as at inference:
they equal one device in distribution, not in value.

Beyond the floor, a cause is named only on evidence, the same way: the first
layer whose outputs on a replica differ from one device's rows beyond that
layer's floor, else the per-example loss, else the model's own losses, else the
gradients alone (a custom gradient).

Example line:

  equivalence: 2 replicas vs 1 device at step 0: gradients within 3.1e-8 of
  their scale (round-off floor 2.4e-8): holds
"""

import dataclasses
import re
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from trainer.data.base import weighted
from trainer.errors import TaskError
from trainer.training import replica_layers
from trainer.training.layer_outputs import (LayerRecorder, random_layers_at_inference,
                                            row_layers)

BOUND = 1e-5  # A difference below this fraction of a gradient's scale always holds.
FLOOR_FACTOR = 4.0  # Within 4x what another summation order changes.
ROUND_OFF = 1e-2  # A gradient whose floor is above 1% of its scale is round-off.
_SUM = tf.distribute.ReduceOp.SUM


@dataclasses.dataclass(frozen=True)
class Verdict:
  """What the check found.

  Attributes:
    replicas: replicas in sync.
    step: the global step whose batch and weights were checked.
    difference: a variable's difference from one device, relative to its
      gradient's scale: the worst beyond its floor, else the largest of the
      variables whose gradient is not round-off.
    floor: the round-off floor of that variable, on the same scale.
    holds: every variable within its floor (or BOUND).
    round_off: how many variables' gradients are round-off (floor above
      ROUND_OFF of their scale).
    culprit: what differs, in words, when it does not hold (else None).
  """
  replicas: int
  step: int
  difference: float
  floor: float
  holds: bool
  round_off: int = 0
  culprit: Optional[str] = None

  def line(self) -> str:
    line = (f"equivalence: {self.replicas} replicas vs 1 device at step "
            f"{self.step}: " + (
                f"gradients within {_short(self.difference)} of their scale"
                if self.holds else
                f"a gradient differs by {_short(self.difference)} of its scale")
            + f" (round-off floor {_short(self.floor)})")
    if self.round_off:
      line += (f", {self.round_off} round-off gradient(s) (a true gradient of 0, "
               "as a bias before BatchNormalization has; Adam turns its round-off "
               "into full steps)")
    return f"{line}: holds" if self.holds else f"{line}: differs: {self.culprit}"


def verify(trainer, train_data) -> Optional[Verdict]:
  """Runs the check on `trainer`'s model at its step (every worker: it holds
  collectives).

  Args:
    trainer: the built Trainer, restored (its weights those the next step
      starts from).
    train_data: its training data (TaskData).

  Returns:
    The Verdict, or None on one replica (nothing to compare).

  Raises:
    tf.errors.ResourceExhaustedError: the global batch does not fit one device.
  """
  if trainer.num_replicas == 1:
    return None
  [batch] = train_data.host_batches(
      trainer.order, num_replicas=trainer.num_replicas,
      start_step=trainer.step * trainer.accum_steps, count=1)
  batch = weighted(*batch, batched=True)
  model = trainer.model
  kept = _unique(list(model.variables) +
                 [g.state for g in replica_layers.seed_generators(model)])
  values = [tf.convert_to_tensor(v) for v in kept]
  recorder = LayerRecorder()

  def restored():  # Each pass from the same state (renorm reads its averages).
    for variable, value in zip(kept, values):
      variable.assign(value)

  try:
    with random_layers_at_inference(model), recorder.recording(model):
      distributed = _distributed(trainer, recorder, batch)
      with replica_layers.as_keras_built(model):
        size = trainer.global_batch_size
        single = []
        for order in (np.arange(size), np.arange(size)[::-1],
                      np.roll(np.arange(size), size // 2)):
          restored()
          single.append(_single(trainer, recorder, batch, order))
  finally:
    restored()
  return _verdict(trainer, distributed, single, recorder.layers)


def check_before_training(trainer, train_data, *, console, vote, watchdog,
                          strict: bool):
  """--verify_equivalence in a run: the replicas against one device at the
  trainer's step, in one line, under the hang watchdog (it holds collectives);
  a global batch that does not fit one device is one line too. Under strict, a
  difference is exit 2 (every worker agrees through `vote`).

  Args:
    trainer: the restored Trainer.
    train_data: its training data.
    console: where the line goes.
    vote: `vote(phase, stop) -> bool` over every worker (StopPolicy.vote).
    watchdog: the run's HangWatchdog.
    strict: --verify_equivalence=strict.

  Raises:
    TaskError: strict, and the replicas differ from one device.
  """
  why_not = unchecked(trainer)
  if why_not:
    console.say(f"equivalence: not checked: {why_not}")
    return
  verdict = None
  with watchdog.guard("the equivalence check", step=trainer.step):
    try:
      verdict = verify(trainer, train_data)
    except tf.errors.ResourceExhaustedError:
      console.say(f"equivalence: not checked: the global batch of "
                  f"{trainer.global_batch_size} does not fit one device")
  if verdict is not None:
    console.say(verdict.line())
  # Every worker votes, whatever its own check found (or could not check).
  if vote("the equivalence vote", strict and verdict is not None and
          not verdict.holds):
    raise refusal(verdict) if verdict is not None and not verdict.holds else (
        TaskError("--verify_equivalence=strict: another worker's check found a "
                  "difference (its line says which); nothing was written"))


def _verdict(trainer, distributed: dict, single: list, layers: list) -> Verdict:
  reference, reordered = single[0], single[1:]
  gradients = reference["gradients"]
  largest = max((_max_abs(g) for g in gradients), default=0.0)
  rows = []  # (beyond its floor, is round-off, difference, floor)
  for index, one in enumerate(gradients):
    scale = max(_max_abs(one), 1e-6 * largest, 1e-30)
    difference = _max_abs(distributed["gradients"][index] - one) / scale
    floor = max(_max_abs(other["gradients"][index] - one)
                for other in reordered) / scale
    rows.append((difference > FLOOR_FACTOR * floor + BOUND, floor > ROUND_OFF,
                 difference, floor))
  holds = not any(row[0] for row in rows)
  # The variable shown: the worst beyond its floor, else the worst of those
  # whose gradient is not round-off (a round-off one differs by its scale).
  shown = max(rows, key=lambda row: (row[0], not row[1], row[2]),
              default=(False, False, 0.0, 0.0))
  culprit = None if holds else _culprit(trainer, distributed, reference,
                                        reordered, layers)
  return Verdict(replicas=trainer.num_replicas, step=trainer.step,
                 difference=shown[2], floor=shown[3], holds=holds,
                 round_off=sum(row[1] for row in rows), culprit=culprit)


def _max_abs(array) -> float:
  return float(np.max(np.abs(array), initial=0.0))


def _short(value: float) -> str:
  """2 significant digits, the exponent without padding: 3.1e-8, 0.15, 1e-5."""
  return re.sub(r"e([+-])0*(\d)", lambda m: "e" + m[1].replace("+", "") + m[2],
                f"{value:.2g}")


def unchecked(trainer) -> str:
  """Why the check cannot run on this trainer ("" where it can): one replica,
  float16 or bfloat16 (which round any two splits of a batch far apart), or
  XLA (its compiled step cannot hand the layers' outputs out)."""
  if trainer.num_replicas == 1:
    return "1 replica: nothing to compare"
  if trainer.model.compute_dtype in ("float16", "bfloat16"):
    return ("--mixed_precision: float16 and bfloat16 round any two splits of a "
            "batch far apart")
  if trainer.jit_compile:
    return ("--jit_compile: the compiled step cannot hand each layer's outputs "
            "out; check without it")
  return ""


def refusal(verdict: Verdict) -> TaskError:
  """The error of --verify_equivalence=strict when the replicas differ."""
  return TaskError(f"--verify_equivalence=strict: {verdict.line()}; nothing was "
                   "written")


def _unique(variables: list) -> list:
  seen, unique = set(), []
  for variable in variables:
    if id(variable) not in seen:
      seen.add(id(variable))
      unique.append(variable)
  return unique


def _step_of(trainer, recorder):
  """One replica's (or one device's) forward and backward pass, recorded:
  (gradients, per-example losses, the model's own losses, layer outputs)."""

  def step(features, labels, weights):
    features = trainer.objective.preprocess(features)
    recorder.start()
    gradients, _, outputs = trainer.forward_backward(features, labels, weights)
    losses = trainer.objective.loss(labels, outputs, weights, training=True)
    own = trainer.model.losses
    own = tf.add_n([tf.cast(t, tf.float32) for t in own]) if own else tf.zeros([])
    return gradients, losses, own, recorder.take()

  return step


def _distributed(trainer, recorder, batch) -> dict:
  """The replicas' results as numpy: "gradients" (all-reduced, dense),
  "losses" (per example, this worker's replicas in order), "own" (each local
  replica's model losses), "layers" ([[each layer's outputs] per local
  replica]) and "first_replica" (this worker's first global replica)."""
  strategy = trainer.strategy
  per_replica = trainer.per_replica_batch_size
  variables = trainer.model.trainable_variables
  step = _step_of(trainer, recorder)

  def replica_part(context):
    start = context.replica_id_in_sync_group * per_replica
    return tf.nest.map_structure(lambda t: t[start:start + per_replica], batch)

  parts = strategy.experimental_distribute_values_from_function(replica_part)

  @tf.function(autograph=False)
  def distributed():
    gradients, losses, own, layers = strategy.run(step, args=parts)
    reduced = strategy.extended.batch_reduce_to(
        _SUM, [(g, v.value) for g, v in zip(gradients, variables)])
    local = strategy.experimental_local_results
    return ([tf.convert_to_tensor(local(g)[0]) for g in reduced], local(losses),
            local(own), [local(layer) for layer in layers])

  gradients, losses, own, layers = distributed()
  replicas = len(losses)
  return {"gradients": [g.numpy() for g in gradients],
          "losses": np.concatenate([t.numpy() for t in losses]),
          "own": [float(t) for t in own],
          "layers": [[layer[r].numpy() for layer in layers]
                     for r in range(replicas)],
          "first_replica": trainer.cluster.pipeline_id * replicas}


def _single(trainer, recorder, batch, order) -> dict:
  """One device's results on the global batch taken in `order` (a permutation),
  as numpy, every row given back in the batch's own order."""
  step = _step_of(trainer, recorder)
  permuted = tf.nest.map_structure(lambda t: tf.gather(t, order), batch)

  @tf.function(autograph=False)
  def single():
    gradients, losses, own, layers = step(*permuted)
    return [tf.convert_to_tensor(g) for g in gradients], losses, own, layers

  gradients, losses, own, layers = single()
  inverse = np.argsort(order)
  size = len(order)
  return {"gradients": [g.numpy() for g in gradients],
          "losses": losses.numpy()[inverse], "own": float(own),
          "layers": [t.numpy()[inverse] if t.shape[:1] == (size,) else t.numpy()
                     for t in layers]}


def _beyond_floor(value, reference, others) -> bool:
  """Whether `value` differs from `reference` beyond what `others` (the same
  computed in other summation orders) do, on `reference`'s scale."""
  scale = max(_max_abs(reference), 1e-30)
  floor = max(_max_abs(other - reference) for other in others) / scale
  return _max_abs(value - reference) / scale > FLOOR_FACTOR * floor + BOUND


def _culprit(trainer, distributed: dict, reference: dict, reordered: list,
             layers: list) -> str:
  """Names what makes the replicas differ from one device, on evidence."""
  per_replica = trainer.per_replica_batch_size
  first = distributed["first_replica"]
  for index in row_layers(reference["layers"], trainer.global_batch_size):
    for local, outputs in enumerate(distributed["layers"]):
      rows = slice((first + local) * per_replica,
                   (first + local + 1) * per_replica)
      if outputs[index].shape != reference["layers"][index][rows].shape:
        continue
      if _beyond_floor(outputs[index], reference["layers"][index][rows],
                       [other["layers"][index][rows] for other in reordered]):
        return _layer_cause(layers[index])
  rows = slice(first * per_replica,
               first * per_replica + len(distributed["losses"]))
  if _beyond_floor(distributed["losses"], reference["losses"][rows],
                   [other["losses"][rows] for other in reordered]):
    return ("the loss (Task.loss) differs for the same outputs: an example's loss "
            "depends on the other examples of its replica's batch (e.g. in-batch "
            "negatives), so N replicas' per-example losses are not one device's; "
            "compute it from that example alone")
  replicas = trainer.num_replicas
  if _beyond_floor(np.array([sum(distributed["own"]) * replicas / len(
      distributed["own"])]), np.array([reference["own"] * replicas]),
                   [np.array([other["own"] * replicas]) for other in reordered]):
    return ("the model's own losses (model.losses, e.g. an activity regularizer "
            "over the batch) differ: they depend on the per-replica batch")
  return ("no layer output, per-example loss or model loss differs beyond the "
          "floor, the gradients do: a custom gradient or a gradient that depends "
          "on the per-replica batch")


def _layer_cause(layer) -> str:
  name = f"layer {layer.name!r} ({type(layer).__name__})"
  if isinstance(layer, keras.layers.BatchNormalization):
    if not replica_layers.is_synchronized(layer):
      return (f"{name} normalises each replica's own batch (--sync_batchnorm="
              "false, or a subclass with its own _moments); with --sync_batchnorm "
              "(the default) it uses the global batch's statistics")
    return (f"{name} is synchronized, yet its outputs differ from one device's "
            "beyond the round-off floor")
  return (f"{name} gives the replicas other outputs than one device for the same "
          "examples: it computes over its batch (batch statistics); make it "
          "per-example, or synchronise it over the replicas")
