"""The model registry. Every model maps images to float32 logits."""

import dataclasses

import keras

from trainer.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Head:
  """What every model ends with (dropout, L2 and the logits), and whether its
  hidden layers are batch-normalised."""
  num_classes: int
  dropout: float = 0.0
  l2: float = 0.0
  seed: int = 0
  batchnorm: bool = False


def _head(x, head: Head):
  if head.dropout:
    # A seeded SeedGenerator: its state is checkpointed (see checkpoints.py).
    x = keras.layers.Dropout(head.dropout, seed=head.seed)(x)
  # Logits stay float32 under mixed precision so the loss is computed in float32.
  return keras.layers.Dense(head.num_classes, dtype="float32", name="logits",
                            kernel_regularizer=_regularizer(head))(x)


def _regularizer(head: Head):
  return keras.regularizers.L2(head.l2) if head.l2 else None


def _unit(x, head: Head, layer_class, *args, activation="relu", **kwargs):
  """`layer_class(*args, **kwargs)` on x with its activation; with
  --task.batchnorm, a BatchNormalization between the layer and the activation.
  Without it, the layers are those the model always had."""
  kwargs["kernel_regularizer"] = _regularizer(head)
  if not head.batchnorm:
    return layer_class(*args, activation=activation, **kwargs)(x)
  x = keras.layers.BatchNormalization()(layer_class(*args, **kwargs)(x))
  return keras.layers.Activation(activation)(x) if activation else x


def _cnn(inputs, head: Head):
  """The seed's CNN: Conv2D(32,3)-MaxPool-Flatten-Dense(64)-Dense(classes)."""
  x = inputs if len(inputs.shape) == 4 else keras.layers.Reshape(
      _as_image(inputs.shape[1:]))(inputs)
  x = _unit(x, head, keras.layers.Conv2D, 32, 3)
  x = keras.layers.MaxPooling2D(2)(x)
  x = keras.layers.Flatten()(x)
  x = _unit(x, head, keras.layers.Dense, 64)
  return _head(x, head)


def _mlp(inputs, head: Head):
  """Flatten-Dense(128)-Dense(classes)."""
  x = keras.layers.Flatten()(inputs)
  x = _unit(x, head, keras.layers.Dense, 128)
  return _head(x, head)


def _resnet(inputs, head: Head):
  """A small ResNet: a stem and three residual stages of 16, 32, 64 channels,
  each convolution batch-normalised with --task.batchnorm."""
  x = inputs if len(inputs.shape) == 4 else keras.layers.Reshape(
      _as_image(inputs.shape[1:]))(inputs)
  x = _unit(x, head, keras.layers.Conv2D, 16, 3, padding="same")
  for stage, filters in enumerate((16, 32, 64)):
    strides = 1 if stage == 0 else 2
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
      shortcut = _unit(x, head, keras.layers.Conv2D, filters, 1, strides=strides,
                       activation=None)
    y = _unit(x, head, keras.layers.Conv2D, filters, 3, strides=strides,
              padding="same")
    y = _unit(y, head, keras.layers.Conv2D, filters, 3, padding="same",
              activation=None)
    x = keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))
  x = keras.layers.GlobalAveragePooling2D()(x)
  return _head(x, head)


def _as_image(shape):
  """[H, W] or [D] inputs as an image shape for the convolutional models."""
  return (shape[0], shape[1], 1) if len(shape) == 2 else (shape[0], 1, 1)


_REGISTRY = {"cnn": _cnn, "mlp": _mlp, "resnet": _resnet}


MODELS = tuple(_REGISTRY)


def build_model(model: str, *, input_shape, head: Head) -> keras.Model:
  """Builds the model named by --model (the framework seeds Keras first).

  Call it inside `strategy.scope()` so the variables are mirrored.

  Args:
    model: cnn, mlp or resnet.
    input_shape: shape of one example.
    head: the logits' classes, dropout, L2 and seed.

  Returns:
    A built Keras functional model.
  """
  if model == "cnn":
    height, width = (_as_image(input_shape) if len(input_shape) < 3
                     else input_shape)[:2]
    if min(height, width) < 4:  # Conv 3x3 (valid), then 2x2 pooling.
      raise ConfigError(f"--model=cnn needs examples of at least 4x4, the data's "
                        f"have shape {tuple(input_shape)}; use --model=mlp or resnet")
  inputs = keras.Input(shape=input_shape, name="inputs")
  outputs = _REGISTRY[model](inputs, head)
  return keras.Model(inputs, outputs, name=model)
