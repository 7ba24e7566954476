"""`trainer.Task`: the one place a user's problem lives.

A task says what to train (its model), on what (its data), toward what (its
per-example loss) and how to judge it (its per-example metrics). The framework owns
everything else: the strategy, the one-batch-per-replica assertion and ledger,
averaging the loss over the global batch, the all-reduce, exact evaluation,
checkpoints, summaries and export. A task never sees a strategy or a replica.

A task is a dataclass; its fields are its hyperparameters, settable as
`--task.NAME=VALUE` flags, recorded in flags.txt, sweepable and shown as HParams.

Example (the README's "Your own task" section runs it):

    import dataclasses, keras, numpy as np, tensorflow as tf
    import trainer

    @dataclasses.dataclass
    class Quadratic(trainer.Task):
      hidden: int = 32

      def build_model(self):
        return keras.Sequential([keras.layers.Dense(self.hidden, activation="relu"),
                                 keras.layers.Dense(1)])

      def train_data(self):
        x = np.random.default_rng(0).normal(size=(4096, 3)).astype("float32")
        return x, (x ** 2).sum(axis=1, keepdims=True)

      def eval_data(self):
        x = np.random.default_rng(1).normal(size=(500, 3)).astype("float32")
        return x, (x ** 2).sum(axis=1, keepdims=True)

      def loss(self, labels, outputs):
        return tf.reduce_mean(tf.square(outputs - labels), axis=-1)

      def metrics(self, labels, outputs):
        return {"mae": tf.reduce_mean(tf.abs(outputs - labels), axis=-1)}

    results = trainer.train(trainer.Config(train_steps=100), task=Quadratic(hidden=64))

This module does not import TensorFlow: tasks are loaded (and their flags defined)
before TensorFlow starts.
"""

import dataclasses
import math
import re
from typing import ClassVar, Dict, Optional, Tuple

from trainer.flag_spelling import TASK_FLAG_ALIASES, flag_value
from trainer.errors import ConfigError

# What a metric may be called: it is a TensorBoard tag, a results.json key and a
# word of the progress line.
METRIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


def hyperparameter(default, help_text: str, *, choices=None, lower=None,
                   upper=None):
  """A task field with the help its `--task.NAME` flag shows and the bounds
  `Task.check_hyperparameters` enforces (a plain default works too).

  Example:
    hidden: int = trainer.hyperparameter(32, "Units of the hidden layer.", lower=1)
  """
  return dataclasses.field(default=default, metadata=dict(
      help=help_text, choices=choices, lower=lower, upper=upper))


@dataclasses.dataclass(frozen=True)
class RunContext:
  """What a task may know of the run it is part of (given to `Task.prepare`).

  Attributes:
    seed: --seed (the framework seeds Keras with it before build_model).
    model_dir: the run directory.
    is_chief: whether this process writes the run's files.
    num_workers: processes training together.
    num_replicas: replicas in sync over every worker.
    per_replica_batch_size: examples per replica per step.
    global_batch_size: examples per step over every replica.
  """
  seed: int = 0
  model_dir: str = ""
  is_chief: bool = True
  num_workers: int = 1
  num_replicas: int = 1
  per_replica_batch_size: int = 32
  global_batch_size: int = 32


class Task:
  """Base class of everything `trainer` can train. Subclass it as a dataclass.

  Required: `build_model`, `train_data`, `loss`. Everything else has a default.

  Data (`train_data`, `eval_data`) is one of
  - arrays: `(features, labels)` or `(features, labels, sample_weights)`, each a
    numpy array or a dict of arrays with the same first dimension (numbers or
    strings). The training order is then a pure function of (--seed, step):
    exact resume needs no iterator state.
  - an unbatched `tf.data.Dataset` of `(features, labels)` or `(features, labels,
    sample_weight)` elements. The framework
    repeats it, shuffles it with a seeded buffer (--shuffle, --shuffle_buffer),
    batches it and, on resume, skips the batches already trained on.
  - `trainer.data.TFRecords(files, parse=...)`: each worker reads only its own
    files; the order is a function of (--seed, step) and a resume re-reads at
    most one block of files (see trainer/data/records.py).
  - a function `input_context -> tf.data.Dataset` building one input pipeline's
    (one worker's) part, distributed with `distribute_datasets_from_function`;
    treated as a dataset per pipeline (shuffled, repeated, batched, skipped).

  Attributes:
    layout_fields: names of the fields that change the model or the data layout,
      so a run cannot resume with another value. None (the default) means all
      fields; `()` means none.
    metric_goals: {"metric name": "max" or "min"}: which way is better, for
      `--best_metric` and sweeps. Metrics not listed (and the loss) are "min".
    best_metric: the metric that picks the best evaluation by default.
    class_weight: {class id: weight} weighing each example's training loss by
      its label's class, as Keras `fit(class_weight=...)` (classes not named
      weigh 1; evaluation is not weighed); --class_weight overrides it. A label
      row of several columns is the class of its argmax; a single column is
      rounded, as Keras does, so a soft label of 0.9 is class 1. Labels that are
      no class ids (negative, or fractions above 1: a regression's targets) are
      refused before the first step.
  """

  layout_fields: ClassVar[Optional[Tuple[str, ...]]] = None
  metric_goals: ClassVar[Dict[str, str]] = {}
  best_metric: ClassVar[str] = "eval/loss"
  class_weight: ClassVar[Optional[Dict[int, float]]] = None

  def prepare(self, context: RunContext):
    """One-time preparation that needs TensorFlow or the run: loading data,
    adapting a `TextVectorization` or `StringLookup` layer to the training text.

    Called once per process, after the devices and the strategy are set up and
    before any other method. (A task's `__init__` or `__post_init__` runs before
    the devices are set up, when TensorFlow must not start yet.) Keep what it
    builds as attributes of the task (`self.vectorize = ...`): `preprocess` and
    the serving methods may use it, and the export carries it.

    Args:
      context: the run's seed, batch sizes, replicas and directory.

    Returns:
      None, or what it prepared: it joins the training data's identity in the
      checkpoint, so a resume that prepares something else (another
      vocabulary) is refused. A dict's entries are recorded one by one (strings
      as they are, other values by a fingerprint); any other value (e.g. the
      vocabulary, as a list) by its fingerprint.
    """
    del context
    return None

  def build_model(self):
    """Returns a new Keras model (functional, Sequential or subclassed).

    Called once, inside `strategy.scope()`, after `keras.utils.set_random_seed(
    config.seed)`. The framework calls it on one batch to build its weights.
    """
    raise NotImplementedError(f"{type(self).__name__} must define build_model()")

  def train_data(self):
    """Returns the training data: `(features, labels)` arrays or a tf.data.Dataset."""
    raise NotImplementedError(f"{type(self).__name__} must define train_data()")

  def eval_data(self):
    """Returns the evaluation data (as `train_data`), or None for no evaluation.

    Every example is evaluated exactly once, on any replica or worker count.
    """
    return None

  def loss(self, labels, outputs):
    """Returns per-example losses, shape [batch].

    The framework weighs them by the examples' sample weights (and, in
    training, their class weights) and averages them over the global batch, as
    Keras' default `sum_over_batch_size` reduction. A `keras.losses.Loss` works
    too, as the attribute itself (`loss = keras.losses.BinaryCrossentropy()`):
    the framework takes its per-example values.
    """
    raise NotImplementedError(f"{type(self).__name__} must define loss()")

  def metrics(self, labels, outputs) -> dict:
    """Returns {name: per-example values, shape [batch]}.

    The framework reports their exact weighted means over a loop call in
    training and over the whole split in evaluation.
    """
    del labels, outputs
    return {}

  def build_metrics(self) -> dict:
    """Returns {name: keras.metrics.Metric}: streaming metrics such as AUC,
    Precision or F1Score (any metric whose state is sums).

    Called once, inside `strategy.scope()`. The framework updates each metric
    on every replica with `(labels, outputs, sample_weight)` (padding weighs 0),
    merges them exactly over replicas and workers, resets them for each loop
    call and each evaluation, and reports `result()` under the name. For a model
    with dict outputs, give `(metric, output key)`. Default: none.

    Example:
      def build_metrics(self):
        return {"auc": keras.metrics.AUC(), "recall": keras.metrics.Recall()}
    """
    return {}

  def finalize_metrics(self, means: dict, *, sums: dict, examples: int) -> dict:
    """Maps what was measured to what is reported (e.g. adds sqrt(mse)).

    Called on every loop call's and every evaluation's values (an override may
    leave out `sums` and `examples` from its signature).

    Args:
      means: {"loss": mean, metric: weighted mean, streaming metric: result()}.
      sums: {metric: weighted sum, "loss": the weighted losses' sum (evaluation;
        in training, the steps' mean losses' sum), "weight": the weights' sum}.
      examples: how many examples were measured (padding excluded).

    Returns:
      The dict to report (the default returns `means` unchanged).
    """
    del sums, examples
    return means

  def preprocess(self, features):
    """Maps stored features to model inputs (runs in the input pipeline, or, for
    data held in memory under --array_input=gather (arrays, and TFRecords and
    datasets that fit), on each replica's batch inside the train and eval steps;
    and in the exported serving function): keep it per-example, with no
    Python-side or random work (use --array_input=dataset for that). The default
    returns them unchanged."""
    return features

  def actions(self) -> list:
    """The task's own actions, run after every loop call (before those given to
    `trainer.train`), in CLI runs too: callables receiving a
    `trainer.ActionContext` (see trainer/actions/user.py). Default: none."""
    return []

  def checkpoint_items(self) -> dict:
    """{name: tf.Variable or other trackable} of state the task keeps outside its
    model (e.g. a step counter of a curriculum), checkpointed with the run and
    restored on resume. Called once, after `build_model`. Default: none."""
    return {}

  def build_optimizer(self):
    """Returns a Keras optimizer, or None (the default) for --optimizer."""
    return None

  def serving_signature(self, feature_spec):
    """The exported signature's inputs: `tf.TensorSpec`s (or a dict of them).

    Args:
      feature_spec: specs of one batch of stored features (leading dim None).
    """
    return feature_spec

  def serving_outputs(self, outputs):
    """Maps model outputs to the exported signature's outputs. The export names
    them: a dict by its keys (nested keys joined by "_"), a list or tuple as
    output_0, output_1, ..., one tensor as "outputs". The default returns the
    model's outputs as they are."""
    return outputs


def check_hyperparameters(task) -> None:
  """Checks a task's fields against their metadata's choices and bounds.

  Raises:
    ConfigError: naming the flag (--NAME for the built-in tasks' short names,
      else --task.NAME) and what is valid.
  """
  for field in hyperparameters(type(task)):
    value, meta = getattr(task, field.name), field.metadata
    flag = field.name if field.name in TASK_FLAG_ALIASES else f"task.{field.name}"
    if value is None or isinstance(value, (tuple, list)):
      continue
    if meta.get("choices") and value not in meta["choices"]:
      raise ConfigError(f"--{flag}={flag_value(value)}: must be one of "
                        f"{', '.join(meta['choices'])}")
    if isinstance(value, float) and not math.isfinite(value):
      raise ConfigError(f"--{flag}={value}: must be a finite number")
    if meta.get("lower") is not None and value < meta["lower"]:
      raise ConfigError(f"--{flag}={value}: must be >= {meta['lower']}")
    if meta.get("upper") is not None and value > meta["upper"]:
      raise ConfigError(f"--{flag}={value}: must be <= {meta['upper']}")


def hyperparameters(task_class) -> list:
  """The dataclass fields of a Task class: its hyperparameters (maybe none)."""
  if not dataclasses.is_dataclass(task_class):
    return []
  return [f for f in dataclasses.fields(task_class) if f.init]


def layout_field_names(task_class) -> list:
  """The hyperparameters a resume must not change."""
  names = [f.name for f in hyperparameters(task_class)]
  if task_class.layout_fields is None:
    return names
  return [n for n in names if n in task_class.layout_fields]


def metric_goal(task_class, metric: str) -> str:
  """"max" or "min" for a metric named "split/name" (or a bare name)."""
  if metric == "examples_per_second":
    return "max"
  return task_class.metric_goals.get(metric.split("/")[-1], "min")
