"""Keras's example "Simple MNIST convnet" (keras.io/examples/vision/mnist_convnet)
with `model.fit(...)` replaced by `trainer.fit(build, ...)`:

    python examples/fit_mnist_convnet.py
    python examples/fit_mnist_convnet.py --cpu_devices=2     # 2 replicas
    python scripts/launch_workers.py --num_workers=2 -- \\
        python examples/fit_mnist_convnet.py                 # 2 workers

The model's construction and compile moved into `build()` (the framework calls
it under the strategy's scope), and `model` comes back from the History; the
rest is the example's. MNIST needs a download, so the images are the package's
8x8 digits (scikit-learn's), each pixel a 2x2 block padded to 20x20 (not
28x28: a quicker example), scaled from 0..16 instead of 0..255; 1,500 train
(10% of them validate), 297 test. With 1,350 training images instead of
54,000, an epoch is 10 batches: 15 epochs become 8.
"""

import os

import keras
import numpy as np
from keras import layers

import trainer

"""
## Prepare the data
"""

# Model / data parameters
num_classes = 10
input_shape = (20, 20, 1)

# Load the data and split it between train and test sets
digits = np.load(os.path.join(os.path.dirname(trainer.__file__), "tasks",
                              "digits.npz"))
images = np.pad(np.kron(digits["images"], np.ones((2, 2), "uint8")),
                ((0, 0), (2, 2), (2, 2)))
(x_train, y_train), (x_test, y_test) = ((images[:1500], digits["target"][:1500]),
                                        (images[1500:], digits["target"][1500:]))

# Scale images to the [0, 1] range
x_train = x_train.astype("float32") / 16
x_test = x_test.astype("float32") / 16
# Make sure images have shape (20, 20, 1)
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)
print("x_train shape:", x_train.shape)
print(x_train.shape[0], "train samples")
print(x_test.shape[0], "test samples")


# convert class vectors to binary class matrices
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

"""
## Build the model
"""


def build():
  model = keras.Sequential(
      [
          keras.Input(shape=input_shape),
          layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
          layers.MaxPooling2D(pool_size=(2, 2)),
          layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
          layers.MaxPooling2D(pool_size=(2, 2)),
          layers.Flatten(),
          layers.Dropout(0.5),
          layers.Dense(num_classes, activation="softmax"),
      ]
  )
  model.compile(loss="categorical_crossentropy", optimizer="adam",
                metrics=["accuracy"])
  return model


"""
## Train the model
"""

batch_size = 128
epochs = 8

history = trainer.fit(build, x_train, y_train, batch_size=batch_size,
                      epochs=epochs, validation_split=0.1,
                      model_dir="runs/fit_mnist_convnet")
model = history.model
model.summary()

"""
## Evaluate the trained model
"""

score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])
