"""Every reach into Keras's and TensorFlow's private API, in one place.

The framework needs a few things neither library makes public: every layer of a
model however it is nested, the seed generators a layer draws from, the moments
a BatchNormalization normalises with, what a tf.data graph holds, and the eager
runtime's options. Each access is one function here, so that a Keras or
TensorFlow upgrade is this one file to read, and `setup.cfg` bounds both to the
versions it was checked against (`CHECKED_WITH`). `patch_check.check_patches`
verifies at start-up, on tiny layers under the run's strategy, that the patches
built on these accesses take effect, and refuses the run in one line if a
Keras release moved them.

Nothing here imports TensorFlow or Keras at module level: `tf_loader` asks
whether TensorFlow has started before it may be imported.
"""

import sys

# The releases every access below was read against and the test suite ran on.
CHECKED_WITH = {"keras": "3.15", "tensorflow": "2.21"}
# What setup.cfg allows (keep the two in step).
SUPPORTED_KERAS = ">=3.15,<3.16"

# The attribute Keras keeps a layer's SeedGenerators in (Layer.__init__).
_SEED_GENERATORS = "_seed_generators"


def keras_version() -> str:
  import keras
  return keras.__version__


# ---- Keras: layers and their seed generators. ----

def layers_of(model) -> list:
  """Every layer of `model` (itself first), however nested: Sequential,
  functional, subclassed, inner models, a user's layer holding others. Keras has
  no public list of them."""
  return list(model._flatten_layers(include_self=True))


def seed_generators(layer) -> list:
  """The SeedGenerators `layer` itself draws from (Dropout's, a Random*
  augmentation's, a user's layer's `keras.random.SeedGenerator`)."""
  return list(getattr(layer, _SEED_GENERATORS, None) or [])


def set_untracked(owner, name: str, value):
  """Sets an attribute that Keras's tracking must not see (a wrapped method)."""
  object.__setattr__(owner, name, value)


def delete_untracked(owner, name: str):
  object.__delattr__(owner, name)


def keras_call_message(message: str) -> str:
  """The error's own message inside the context Keras adds to an error raised
  in a layer's call ("Exception encountered when calling X.call()." then the
  message in bold, then the arguments); `message` itself otherwise."""
  while message.startswith("Exception encountered when calling"):
    start, end = message.find("\x1b[1m"), message.rfind("\x1b[0m")
    if start < 0 or end < start:
      break
    message = message[start + len("\x1b[1m"):end]
  return message


# ---- Keras: BatchNormalization's moments. ----

def moments_overridden(layer) -> bool:
  """Whether `layer`'s class (a user's subclass) defines its own `_moments`."""
  import keras
  return type(layer)._moments is not keras.layers.BatchNormalization._moments


def replace_moments(layer, moments):
  """Makes `layer` normalise with `moments(inputs, mask) -> (mean, variance)`
  (the squeezed statistics, float32) in training; Keras calls `_moments` there."""
  set_untracked(layer, "_moments", moments)


def restore_moments(layer):
  """Gives `layer` back its class's own moments (undoes `replace_moments`)."""
  if "_moments" in vars(layer):
    delete_untracked(layer, "_moments")


def reduction_axes(layer) -> list:
  """The axes a built BatchNormalization reduces over (all but its axis)."""
  return list(layer._reduction_axes)


# ---- Keras: what `compile` and the callbacks keep (trainer.fit). ----

def compile_config(model):
  """The arguments `model.compile` was called with (a dict), or None."""
  return getattr(getattr(model, "_compile_config", None), "config", None)


def resolved_loss(identifier, labels, outputs):
  """The loss Keras's compile resolves `identifier` ("crossentropy", ...) to for
  these labels and outputs."""
  from keras.src.trainers import compile_utils
  return compile_utils.get_loss(identifier, labels, outputs)


def resolved_metric(identifier, labels, outputs):
  """The metric Keras's compile resolves `identifier` ("accuracy", ...) to for
  these labels and outputs."""
  from keras.src.trainers import compile_utils
  return compile_utils.get_metric(identifier, labels, outputs)


def keras_mask(tensor):
  """The mask Keras attached to a layer's output, or None."""
  return getattr(tensor, "_keras_mask", None)


def metric_direction(metric):
  """"up" or "down": which way a Keras metric improves, where it says."""
  return getattr(metric, "_direction", None)


def profiled_batches(tensorboard_callback) -> tuple:
  """(first, last) batch of a keras.callbacks.TensorBoard's profile_batch, as
  it parsed them (0, 0: none)."""
  return tensorboard_callback._start_batch, tensorboard_callback._stop_batch


# ---- TensorFlow: what a tf.data graph holds. ----

def serialized_dataset_graph(dataset):
  """`dataset`'s graph (a GraphDef, serialized, as a scalar string tensor),
  external state ignored. Raises what TensorFlow raises for a graph it cannot
  serialize (over protobuf's 2 GiB)."""
  import tensorflow as tf
  return dataset._as_serialized_graph(
      external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE)


def op_is_stateful(op_name: str):
  """Whether TensorFlow's registry declares the op stateful; None where it does
  not know the op (a function's name, say)."""
  from tensorflow.python.framework import op_def_registry
  definition = op_def_registry.get(op_name)
  return None if definition is None else bool(definition.is_stateful)


# ---- TensorFlow: the eager runtime. ----

def runtime_started() -> bool:
  """Whether TensorFlow's runtime has started in this process (from then on its
  devices cannot be split nor a MultiWorkerMirroredStrategy created); False
  when TensorFlow is not imported."""
  if "tensorflow" not in sys.modules:
    return False
  from tensorflow.python.eager import context
  return context.context()._initialized


def eager_context():
  """TensorFlow's eager context (function call options, the coordination
  service of a cluster)."""
  from tensorflow.python.eager import context
  return context.context()


def function_call_options(*, executor_type, config_proto):
  """A FunctionCallOptions for `eager_context().function_call_options`."""
  from tensorflow.python.eager import context
  return context.FunctionCallOptions(executor_type=executor_type,
                                     config_proto=config_proto)


def trackable_type():
  """The base class of everything a SavedModel or checkpoint can track."""
  import tensorflow as tf
  return tf.__internal__.tracking.Trackable


def autograph_converted(function):
  """`function` converted by AutoGraph when called, as a tf.function with
  AutoGraph would call it."""
  import tensorflow as tf
  return tf.__internal__.autograph.tf_convert(
      function, tf.__internal__.autograph.control_status_ctx())
