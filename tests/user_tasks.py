"""Tasks a user would write, outside the trainer package: loaded by tests through
`--task=user_tasks:NAME` (with tests/ on PYTHONPATH) or passed to trainer.train."""

import dataclasses
import threading
import time

import keras
import numpy as np
import tensorflow as tf

import trainer


def _quadratic_arrays(n, seed):
  x = np.random.default_rng(seed).normal(size=(n, 3)).astype("float32")
  return x, (x ** 2).sum(axis=1, keepdims=True)


class TwoLayer(keras.Model):
  """A subclassed model: its weights exist only after its first call."""

  def __init__(self, hidden):
    super().__init__()
    self.hidden = keras.layers.Dense(hidden, activation="tanh")
    self.out = keras.layers.Dense(1)

  def call(self, inputs):
    return self.out(self.hidden(inputs))


@dataclasses.dataclass
class Quadratic(trainer.Task):
  """Learns sum(x**2) with a subclassed model and a custom (Huber-like) loss."""

  hidden: int = 16
  delta: float = 1.0

  layout_fields = ("hidden",)

  def build_model(self):
    return TwoLayer(self.hidden)

  def train_data(self):
    return _quadratic_arrays(512, seed=0)

  def eval_data(self):
    return _quadratic_arrays(77, seed=1)  # Not a multiple of any global batch.

  def loss(self, labels, outputs):
    error = tf.abs(outputs - labels)
    quadratic = tf.minimum(error, self.delta)
    return tf.reduce_mean(0.5 * quadratic ** 2 + self.delta * (error - quadratic),
                          axis=-1)

  def metrics(self, labels, outputs):
    return {"mae": tf.reduce_mean(tf.abs(outputs - labels), axis=-1)}


@dataclasses.dataclass
class StreamQuadratic(Quadratic):
  """Quadratic, its data given as unbatched tf.data.Datasets of dict features."""

  def train_data(self):
    x, y = _quadratic_arrays(300, seed=0)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y))

  def eval_data(self):
    x, y = _quadratic_arrays(77, seed=1)
    # A generator: the framework cannot know its length and counts it.
    return tf.data.Dataset.from_generator(
        lambda: iter(zip(({"x": row} for row in x), y)),
        output_signature=({"x": tf.TensorSpec([3], tf.float32)},
                          tf.TensorSpec([1], tf.float32)))

  def build_model(self):
    inputs = {"x": keras.Input(shape=(3,), name="x")}
    hidden = keras.layers.Dense(self.hidden, activation="tanh")(inputs["x"])
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


@dataclasses.dataclass
class ScalarLoss(Quadratic):
  """A mistake: the loss is already averaged (a scalar, not per example)."""

  def loss(self, labels, outputs):
    return tf.reduce_mean(tf.square(outputs - labels))


@dataclasses.dataclass
class OwnOptimizer(Quadratic):
  """A task that builds its optimizer: --learning_rate does not apply."""

  def build_optimizer(self):
    return keras.optimizers.SGD(0.01, momentum=0.5)


class NotATask:
  pass


@dataclasses.dataclass
class SlowFinish(Quadratic):
  """Prints a marker and takes a few seconds in the final evaluation and in the
  export, so a test can signal it there. Run with --train_steps=10
  --steps_per_loop=10: finalize_metrics is called by the set-up's probe, the one
  loop call, then the final evaluation."""

  calls = 0  # Not annotated: a counter, not a hyperparameter.
  layout_fields = ()

  def finalize_metrics(self, means):
    self.calls += 1
    if self.calls == 3:
      print("final evaluation running", flush=True)
      time.sleep(3)
    return means

  exports = 0

  def serving_outputs(self, outputs):
    # Traced once per signature: only the first trace waits for the signal.
    self.exports += 1
    if self.exports == 1:
      print("export running", flush=True)
      time.sleep(3)
    return {"outputs": outputs}


@dataclasses.dataclass
class HangsAt(Quadratic):
  """Its training stream stops delivering after `hang_after` examples, as a stuck
  file system or a lost peer would: the loop call waiting for it hangs."""

  hang_after: int = 96
  layout_fields = ()

  def train_data(self):
    x, y = _quadratic_arrays(512, seed=0)

    def examples():
      for i in range(2**62):
        if i == self.hang_after:
          time.sleep(3600)
        yield x[i % 512], y[i % 512]

    return tf.data.Dataset.from_generator(
        examples, output_signature=(tf.TensorSpec([3], tf.float32),
                                    tf.TensorSpec([1], tf.float32)))


@dataclasses.dataclass
class PipelineQuadratic(Quadratic):
  """Quadratic, its data given as functions that build one input pipeline's part
  (given the tf.distribute.InputContext): each pipeline reads every n-th example."""

  def train_data(self):
    x, y = _quadratic_arrays(512, seed=0)
    return lambda context: tf.data.Dataset.from_tensor_slices((x, y)).shard(
        context.num_input_pipelines, context.input_pipeline_id)

  def eval_data(self):
    x, y = _quadratic_arrays(77, seed=1)
    return lambda context: tf.data.Dataset.from_tensor_slices((x, y)).shard(
        context.num_input_pipelines, context.input_pipeline_id)


@dataclasses.dataclass
class BagOfTokens(trainer.Task):
  """An Embedding model: its gradient is sparse (tf.IndexedSlices), with many
  lookups of the same rows (the padding token 0 fills half of every sequence)."""

  vocabulary: int = 64
  layout_fields = ("vocabulary",)

  def build_model(self):
    tokens = keras.Input(shape=(12,), dtype="int32")
    embedded = keras.layers.Embedding(self.vocabulary, 8)(tokens)
    pooled = keras.layers.GlobalAveragePooling1D()(embedded)
    return keras.Model(tokens, keras.layers.Dense(1)(pooled))

  def _examples(self, count, seed):
    tokens = np.random.default_rng(seed).integers(
        1, self.vocabulary, size=(count, 12)).astype("int32")
    tokens[:, 6:] = 0
    return tokens, (tokens % 3 == 0).mean(axis=1, keepdims=True).astype("float32")

  def train_data(self):
    return self._examples(256, seed=0)

  def eval_data(self):
    return self._examples(50, seed=1)

  def loss(self, labels, outputs):
    return tf.reduce_mean(tf.square(outputs - labels), axis=-1)


_HIDDEN = {}  # Where TextBag(hide_vectorizer=True) keeps its layer: not on the task.
_WORDS = ["good", "bad", "plain", "film", "plot", "actor", "scene", "music"]


def _texts(count, seed, extra_words=0):
  rng = np.random.default_rng(seed)
  words = _WORDS + [f"word{i}" for i in range(extra_words)]
  texts = [" ".join(rng.choice(words, size=6)) for _ in range(count)]
  labels = [float(t.split().count("good") > t.split().count("bad")) for t in texts]
  return np.array(texts), np.array(labels, np.float32)[:, None]


@dataclasses.dataclass
class TextBag(trainer.Task):
  """Raw strings in, a TextVectorization adapted in prepare(): its lookup table is
  used by preprocess, in the input pipeline and in the export."""

  extra_words: int = 0  # More words in the adapted text: another vocabulary.
  hide_vectorizer: bool = False  # A mistake: keep the layer in a global.

  layout_fields = ()

  def prepare(self, context):
    del context
    vectorize = keras.layers.TextVectorization(max_tokens=40,
                                               output_sequence_length=6)
    texts, _ = _texts(200, seed=0, extra_words=self.extra_words)
    vectorize.adapt(tf.data.Dataset.from_tensor_slices(texts).batch(50))
    if self.hide_vectorizer:
      _HIDDEN["vectorize"] = vectorize
    else:
      self.vectorize = vectorize
    return vectorize.get_vocabulary()

  def preprocess(self, features):
    return (_HIDDEN["vectorize"] if self.hide_vectorizer else self.vectorize)(features)

  def build_model(self):
    tokens = keras.Input(shape=(6,), dtype="int64")
    pooled = keras.layers.GlobalAveragePooling1D()(
        keras.layers.Embedding(40, 8)(tokens))
    return keras.Model(tokens, keras.layers.Dense(1)(pooled))

  def train_data(self):
    return tf.data.Dataset.from_tensor_slices(_texts(200, seed=0))

  def eval_data(self):
    return tf.data.Dataset.from_tensor_slices(_texts(60, seed=1))

  def loss(self, labels, outputs):
    return keras.losses.binary_crossentropy(labels, outputs, from_logits=True)

  def metrics(self, labels, outputs):
    return {"accuracy": tf.cast(tf.equal(tf.cast(outputs > 0, tf.float32), labels),
                                tf.float32)[:, 0]}


@dataclasses.dataclass
class TextArrays(TextBag):
  """TextBag's strings as numpy arrays in a dict with a numeric column: the
  (seed, step) order of arrays, strings and all."""

  def _arrays(self, count, seed):
    texts, labels = _texts(count, seed)
    lengths = np.array([[len(t) / 40.0] for t in texts], np.float32)
    return {"text": texts.astype(object), "length": lengths}, labels

  def preprocess(self, features):
    return {"tokens": self.vectorize(features["text"]),
            "length": features["length"]}

  def build_model(self):
    tokens = keras.Input(shape=(6,), dtype="int64", name="tokens")
    length = keras.Input(shape=(1,), name="length")
    pooled = keras.layers.GlobalAveragePooling1D()(
        keras.layers.Embedding(40, 8)(tokens))
    joined = keras.layers.Concatenate()([pooled, length])
    return keras.Model({"tokens": tokens, "length": length},
                       keras.layers.Dense(1)(joined))

  def train_data(self):
    return self._arrays(200, seed=0)

  def eval_data(self):
    return self._arrays(60, seed=1)


@dataclasses.dataclass
class EarlyAdapt(TextBag):
  """A mistake: TensorFlow work in __post_init__, before the devices are set up."""

  def __post_init__(self):
    self.table = tf.constant(_WORDS)


@dataclasses.dataclass
class BatchedSeries(trainer.Task):
  """A Keras user's windows, passed as they had them: already batched (or, with
  batched=False, unbatched: then tf.data does not know the windows' length)."""

  batched: bool = True

  def build_model(self):
    return keras.Sequential([keras.Input(shape=(12, 3)), keras.layers.Flatten(),
                             keras.layers.Dense(1)])

  def train_data(self):
    series = np.random.default_rng(0).normal(size=(300, 3)).astype("float32")
    return keras.utils.timeseries_dataset_from_array(
        series, series[:, 0], sequence_length=12,
        batch_size=32 if self.batched else None)

  def loss(self, labels, outputs):
    return tf.square(outputs[:, 0] - labels)


def _fail_at_ten(context):
  if context.step >= 10:
    return {}["missing metric"]  # A KeyError in the user's own code.
  return None


@dataclasses.dataclass
class BrokenAction(Quadratic):
  """Its action raises at step 10 (after the checkpoint of step 5)."""

  layout_fields = ()

  def actions(self):
    return [_fail_at_ten]


@dataclasses.dataclass
class BrokenPrepare(Quadratic):
  """Its prepare() raises."""

  layout_fields = ()

  def prepare(self, context):
    raise RuntimeError("the vocabulary file is missing")


def _slow_off_chief(context):
  if not context.is_chief:
    time.sleep(0.2)  # Worker 1 spends longer after each call than the chief.


@dataclasses.dataclass
class SlowOffChief(Quadratic):
  """Worker 1 is slower than the chief between loop calls, so the two time their
  (automatic-length) calls differently."""

  layout_fields = ()

  def actions(self):
    return [_slow_off_chief]


@dataclasses.dataclass
class PrepareFailsOffChief(Quadratic):
  """Its prepare() raises on every worker but the chief (its own bad files)."""

  layout_fields = ()

  def prepare(self, context):
    if not context.is_chief:
      raise RuntimeError("this worker's shard list is empty")
    return super().prepare(context)


class PrepareHangsOffChief(Quadratic):
  """Its prepare() never returns on every worker but the chief, whose process
  lives on (a network filesystem that stopped answering)."""

  layout_fields = ()

  def prepare(self, context):
    if not context.is_chief:
      threading.Event().wait()
    return super().prepare(context)


@dataclasses.dataclass
class MismatchedEval(Quadratic):
  """A mistake: eval features of another shape than the training ones."""

  def eval_data(self):
    x, y = _quadratic_arrays(20, seed=1)
    return np.concatenate([x, x[:, :1]], axis=1), y


@dataclasses.dataclass
class ChangingShape(trainer.Task):
  """A dataset whose feature width changes after 300 elements (5, then 6)."""

  def build_model(self):
    return keras.Sequential([keras.layers.Dense(1)])

  def train_data(self):
    def part(width):
      return tf.data.Dataset.from_tensor_slices(
          (np.ones((300, width), np.float32), np.ones((300, 1), np.float32)))
    return part(5).concatenate(part(6))

  def loss(self, labels, outputs):
    return tf.reduce_mean(tf.square(outputs - labels), axis=-1)


def _interrupt_at_ten(context):
  if context.step >= 10:
    raise KeyboardInterrupt


def _exit_at_ten(context):
  if context.step >= 10:
    import sys
    sys.exit(0)


@dataclasses.dataclass
class InterruptingAction(Quadratic):
  """Its action raises KeyboardInterrupt at step 10 (as SIGINT)."""

  layout_fields = ()

  def actions(self):
    return [_interrupt_at_ten]


@dataclasses.dataclass
class ExitingAction(Quadratic):
  """Its action calls sys.exit(0) at step 10: a failure, not a success."""

  layout_fields = ()

  def actions(self):
    return [_exit_at_ten]


@dataclasses.dataclass
class RaisingLoss(Quadratic):
  """Its loss raises in the user's own code (AutoGraph wraps it "in user code")."""

  layout_fields = ()

  def loss(self, labels, outputs):
    if labels.shape[-1] == 1:
      raise ValueError("the labels must be probabilities")
    return super().loss(labels, outputs)


@dataclasses.dataclass
class NanMetric(Quadratic):
  """A metric that is not a number (0/0 on every example)."""

  layout_fields = ()

  def metrics(self, labels, outputs):
    zero = tf.reduce_sum(outputs - outputs, axis=-1)
    return dict(super().metrics(labels, outputs), ratio=zero / zero)


@dataclasses.dataclass
class ShapesChangeMidRun(Quadratic):
  """A dataset whose elements have 3 features for the first 200, then 4 (a
  feature added to the later files, say): the probe sees only the first."""

  def train_data(self):
    x, y = _quadratic_arrays(400, seed=0)
    first = tf.data.Dataset.from_tensor_slices((x[:200], y[:200]))
    later = tf.data.Dataset.from_tensor_slices(
        (np.concatenate([x[200:], x[200:, :1]], axis=1), y[200:]))
    return first.concatenate(later)

  def eval_data(self):
    return None


@dataclasses.dataclass
class BucketedSequences(Quadratic):
  """Sequences batched by tf.data's bucket_by_sequence_length (padded batches
  inside group_by_window), as a keras-io text pipeline does."""

  def train_data(self):
    lengths = tf.data.Dataset.range(400).map(lambda i: i % 5 + 1)
    sequences = lengths.map(lambda n: (tf.ones([n, 3]), tf.ones([1])))
    return sequences.bucket_by_sequence_length(
        lambda x, y: tf.shape(x)[0], [3], [8, 8])

  def eval_data(self):
    return None


@dataclasses.dataclass
class NoisyPreprocess(Quadratic):
  """Task.preprocess adds noise (an augmentation written in preprocess)."""

  def preprocess(self, features):
    return features + tf.random.uniform(tf.shape(features), maxval=0.01)


@dataclasses.dataclass
class BatchedInFlatMap(Quadratic):
  """Two parts of the data, each batched by 32 inside a flat_map (batches the
  dataset objects' attributes do not show); `batched=false`: the same examples,
  concatenated, in the same order. `mixed`: one part batched, one not."""

  batched: bool = True
  mixed: bool = False

  def train_data(self):
    x, y = _quadratic_arrays(512, seed=0)
    parts = [tf.data.Dataset.from_tensor_slices((x[:256], y[:256])),
             tf.data.Dataset.from_tensor_slices((x[256:], y[256:]))]
    if not self.batched:
      return parts[0].concatenate(parts[1])
    if self.mixed:
      return tf.data.Dataset.sample_from_datasets([parts[0].batch(32), parts[1]],
                                                  seed=1)
    whole = parts[0].concatenate(parts[1])
    return tf.data.Dataset.range(2).flat_map(
        lambda i: whole.skip(i * 256).take(256).batch(32))

  def build_model(self):  # No keras.Input: Dense would take [8, 32, 3] too.
    return keras.Sequential([keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1)])

  def eval_data(self):
    return None


@dataclasses.dataclass
class RaggedBatches(Quadratic):
  """Sequences of varying lengths in tf.data's ragged_batch."""

  def train_data(self):
    lengths = tf.data.Dataset.range(400).map(lambda i: i % 5 + 1)
    return lengths.map(lambda n: (tf.ones([n, 3]), tf.ones([1]))).ragged_batch(8)

  def eval_data(self):
    return None
