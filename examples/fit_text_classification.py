"""Keras's example "Text classification from scratch"
(keras.io/examples/nlp/text_classification_from_scratch) with `model.fit(...)`
replaced by `trainer.fit(build, ...)`:

    python examples/fit_text_classification.py
    python examples/fit_text_classification.py --cpu_devices=2     # 2 replicas
    python scripts/launch_workers.py --num_workers=2 -- \\
        python examples/fit_text_classification.py                 # 2 workers

The model's construction and compile moved into `build()`, and `model` comes
back from the History; the rest is the example's: the TextVectorization adapted
to the training text and mapped over the datasets of string batches. (The
program runs TensorFlow before trainer.fit, so on 2 replicas of a CPU or on 2
workers trainer.fit restarts it once with its devices set up first.)

The IMDB reviews need a download, so the reviews are generated: 40 words each,
neutral words and five positive or negative ones, each of the review's tone 8
times in 10 ("<br />" and punctuation included, for the example's
standardization), 1,600 to train (20% of them validate) and 320 to test. The
vocabulary is 2,000 tokens, the sequences 60, the embedding 32 wide, the
convolutions 32 filters: a small model for small data; 8 epochs, not 3.
"""

import re
import string

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import trainer

"""
## Load the data: generated movie reviews
"""

batch_size = 32


def generated_reviews(count, seed):
  rng = np.random.default_rng(seed)
  neutral = [f"word{i}" for i in range(300)]
  good = ["great", "wonderful", "superb", "moving", "brilliant", "fun"]
  bad = ["awful", "boring", "dull", "terrible", "weak", "mess"]
  labels = rng.integers(0, 2, count)
  texts = []
  for label in labels:
    words = list(rng.choice(neutral, 40))
    for i in rng.choice(40, 5, replace=False):  # Now and then a contrary word.
      tone = good if (label == 1) == (rng.random() > 0.2) else bad
      words[i] = rng.choice(tone) + rng.choice(["", "!", "."])
    texts.append(" ".join(words).replace("word1 ", "word1<br />", 1))
  return np.array(texts), labels


(train_text, train_labels) = generated_reviews(1600, seed=1337)
(test_text, test_labels) = generated_reviews(320, seed=42)
raw_train_ds = tf.data.Dataset.from_tensor_slices(
    (train_text[:1280], train_labels[:1280])).batch(batch_size)
raw_val_ds = tf.data.Dataset.from_tensor_slices(
    (train_text[1280:], train_labels[1280:])).batch(batch_size)
raw_test_ds = tf.data.Dataset.from_tensor_slices(
    (test_text, test_labels)).batch(batch_size)

print(f"Number of batches in raw_train_ds: {raw_train_ds.cardinality()}")
print(f"Number of batches in raw_val_ds: {raw_val_ds.cardinality()}")
print(f"Number of batches in raw_test_ds: {raw_test_ds.cardinality()}")

"""
## Prepare the data
"""


# Having looked at our data above, we see that the raw text contains HTML break
# tags of the form '<br />'. These tags will not be removed by the default
# standardizer (which doesn't strip HTML). Because of this, we will need to
# create a custom standardization function.
def custom_standardization(input_data):
  lowercase = tf.strings.lower(input_data)
  stripped_html = tf.strings.regex_replace(lowercase, "<br />", " ")
  return tf.strings.regex_replace(
      stripped_html, f"[{re.escape(string.punctuation)}]", ""
  )


# Model constants.
max_features = 2000
embedding_dim = 32
sequence_length = 60

# Now that we have our custom standardization, we can instantiate our text
# vectorization layer. We are using this layer to normalize, split, and map
# strings to integers, so we set our 'output_mode' to 'int'.
vectorize_layer = keras.layers.TextVectorization(
    standardize=custom_standardization,
    max_tokens=max_features,
    output_mode="int",
    output_sequence_length=sequence_length,
)

# Now that the vectorize_layer has been created, call `adapt` on a text-only
# dataset to create the vocabulary. You don't have to batch, but for very large
# datasets this means you're not keeping spare copies of the dataset in memory.

# Let's make a text-only dataset (no labels):
text_ds = raw_train_ds.map(lambda x, y: x)
# Let's call `adapt`:
vectorize_layer.adapt(text_ds)

"""
## Two options to vectorize the data
"""


def vectorize_text(text, label):
  text = tf.expand_dims(text, -1)
  return vectorize_layer(text), label


# Vectorize the data.
train_ds = raw_train_ds.map(vectorize_text)
val_ds = raw_val_ds.map(vectorize_text)
test_ds = raw_test_ds.map(vectorize_text)

# Do async prefetching / buffering of the data for best performance on GPU.
train_ds = train_ds.cache().prefetch(buffer_size=10)
val_ds = val_ds.cache().prefetch(buffer_size=10)
test_ds = test_ds.cache().prefetch(buffer_size=10)

"""
## Build a model
"""


def build():
  # An integer input for vocab indices.
  inputs = keras.Input(shape=(None,), dtype="int64")

  # Next, we add a layer to map those vocab indices into a space of
  # dimensionality 'embedding_dim'.
  x = layers.Embedding(max_features, embedding_dim)(inputs)
  x = layers.Dropout(0.5)(x)

  # Conv1D + global max pooling
  x = layers.Conv1D(32, 7, padding="valid", activation="relu", strides=3)(x)
  x = layers.Conv1D(32, 7, padding="valid", activation="relu", strides=3)(x)
  x = layers.GlobalMaxPooling1D()(x)

  # We add a vanilla hidden layer:
  x = layers.Dense(32, activation="relu")(x)
  x = layers.Dropout(0.5)(x)

  # We project onto a single unit output layer, and squash it with a sigmoid:
  predictions = layers.Dense(1, activation="sigmoid", name="predictions")(x)

  model = keras.Model(inputs, predictions)

  # Compile the model with binary crossentropy loss and an adam optimizer.
  model.compile(loss="binary_crossentropy", optimizer="adam",
                metrics=["accuracy"])
  return model


"""
## Train the model
"""

epochs = 8

# Fit the model using the train and test datasets.
history = trainer.fit(build, train_ds, validation_data=val_ds, epochs=epochs,
                      model_dir="runs/fit_text_classification")
model = history.model

"""
## Evaluate the model on the test set
"""

model.evaluate(test_ds)
