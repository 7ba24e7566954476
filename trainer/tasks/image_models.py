"""The model registry. Every model maps images to float32 logits."""

import dataclasses

import keras

from trainer.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Head:
  """What every model ends with: dropout, L2 and the logits."""
  num_classes: int
  dropout: float = 0.0
  l2: float = 0.0
  seed: int = 0


def _head(x, head: Head):
  if head.dropout:
    # A seeded SeedGenerator: its state is checkpointed (see checkpoints.py).
    x = keras.layers.Dropout(head.dropout, seed=head.seed)(x)
  # Logits stay float32 under mixed precision so the loss is computed in float32.
  return keras.layers.Dense(head.num_classes, dtype="float32", name="logits",
                            kernel_regularizer=_regularizer(head))(x)


def _regularizer(head: Head):
  return keras.regularizers.L2(head.l2) if head.l2 else None


def _cnn(inputs, head: Head):
  """The seed's CNN: Conv2D(32,3)-MaxPool-Flatten-Dense(64)-Dense(classes)."""
  x = inputs if len(inputs.shape) == 4 else keras.layers.Reshape(
      _as_image(inputs.shape[1:]))(inputs)
  x = keras.layers.Conv2D(32, 3, activation="relu",
                          kernel_regularizer=_regularizer(head))(x)
  x = keras.layers.MaxPooling2D(2)(x)
  x = keras.layers.Flatten()(x)
  x = keras.layers.Dense(64, activation="relu",
                         kernel_regularizer=_regularizer(head))(x)
  return _head(x, head)


def _mlp(inputs, head: Head):
  """Flatten-Dense(128)-Dense(classes)."""
  x = keras.layers.Flatten()(inputs)
  x = keras.layers.Dense(128, activation="relu",
                         kernel_regularizer=_regularizer(head))(x)
  return _head(x, head)


def _resnet(inputs, head: Head):
  """A small ResNet: a stem and three residual stages of 16, 32, 64 channels.

  No BatchNorm, so replicas stay exactly equivalent to one device.
  """
  x = inputs if len(inputs.shape) == 4 else keras.layers.Reshape(
      _as_image(inputs.shape[1:]))(inputs)
  reg = _regularizer(head)
  x = keras.layers.Conv2D(16, 3, padding="same", activation="relu",
                          kernel_regularizer=reg)(x)
  for stage, filters in enumerate((16, 32, 64)):
    strides = 1 if stage == 0 else 2
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
      shortcut = keras.layers.Conv2D(filters, 1, strides=strides,
                                     kernel_regularizer=reg)(x)
    y = keras.layers.Conv2D(filters, 3, strides=strides, padding="same",
                            activation="relu", kernel_regularizer=reg)(x)
    y = keras.layers.Conv2D(filters, 3, padding="same", kernel_regularizer=reg)(y)
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
