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
import re
from typing import ClassVar, Dict, Optional, Tuple

# What a metric may be called: it is a TensorBoard tag, a results.json key and a
# word of the progress line.
METRIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


class Task:
  """Base class of everything `trainer` can train. Subclass it as a dataclass.

  Required: `build_model`, `train_data`, `loss`. Everything else has a default.

  Data (`train_data`, `eval_data`) is one of
  - arrays: `(features, labels)`, each a numpy array or a dict of arrays with the
    same first dimension. The training order is then a pure function of
    (--seed, step): exact resume needs no iterator state.
  - an unbatched `tf.data.Dataset` of `(features, labels)` elements. The framework
    repeats it, shuffles it with a seeded buffer (--shuffle, --shuffle_buffer),
    batches it and, on resume, skips the batches already trained on.
  - `trainer.data.TFRecords(files, parse=...)`: each worker reads only its own
    files; the order is a function of (--seed, step) and a resume re-reads at
    most one block of files (see trainer/data/records.py).
  - a function `input_context -> tf.data.Dataset` building one input pipeline's
    (one worker's) part, distributed with `distribute_datasets_from_function`;
    treated as a dataset per pipeline (shuffled, repeated, batched, skipped).

  Attributes:
    config: the run's `trainer.Config`, set by the framework before any method is
      called (e.g. `self.config.seed`). Built-in tasks read their flags from it.
    layout_fields: names of the fields that change the model or the data layout,
      so a run cannot resume with another value. None (the default) means all
      fields; `()` means none.
    metric_goals: {"metric name": "max" or "min"}: which way is better, for
      `--best_metric` and sweeps. Metrics not listed (and the loss) are "min".
    best_metric: the metric that picks the best evaluation by default.
  """

  layout_fields: ClassVar[Optional[Tuple[str, ...]]] = None
  metric_goals: ClassVar[Dict[str, str]] = {}
  best_metric: ClassVar[str] = "eval/loss"

  config = None  # Set by the framework (see the class docstring).

  def prepare(self):
    """One-time preparation that needs TensorFlow, e.g. adapting a
    `TextVectorization` or `StringLookup` layer to the training text.

    Called once per process, after the devices and the strategy are set up and
    before any other method. (A task's `__init__` or `__post_init__` runs before
    the devices are set up, when TensorFlow must not start yet.) Keep what it
    builds as attributes of the task (`self.vectorize = ...`): `preprocess` and
    the serving methods may use it, and the export carries it.

    Returns:
      None, or what it prepared (e.g. the vocabulary, as a list): its fingerprint
      joins the training data's identity in the checkpoint, so a resume that
      prepares something else (another vocabulary) is refused.
    """
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
    """Returns per-example losses, shape [batch] (the framework averages them)."""
    raise NotImplementedError(f"{type(self).__name__} must define loss()")

  def metrics(self, labels, outputs) -> dict:
    """Returns {name: per-example values, shape [batch]}.

    The framework reports their exact (weighted) means over a loop call in
    training and over the whole split in evaluation.
    """
    del labels, outputs
    return {}

  def finalize_metrics(self, means: dict) -> dict:
    """Maps the metrics' exact means to what is reported (e.g. adds sqrt(mse)).

    Args:
      means: {"loss": ..., metric name: mean, ...}.

    Returns:
      The dict to report (the default returns `means` unchanged).
    """
    return means

  def preprocess(self, features):
    """Maps stored features to model inputs (runs in the input pipeline, or for
    arrays under --array_input=gather on each replica's batch inside the train
    step, and in the exported serving function): keep it per-example, with no
    Python-side or random work (use --array_input=dataset for that). The default
    returns them unchanged."""
    return features

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

  def serving_outputs(self, outputs) -> dict:
    """Maps model outputs to the exported signature's {name: tensor}."""
    return {"outputs": outputs}


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
