"""How a step's gradients cross the workers: the all-reduce's options.

Across workers (MultiWorkerMirroredStrategy, gRPC), the gradients are
all-reduced in packs of about PACK_BYTES, last layers first: the order in which
the backward pass makes them, so that each pack's all-reduce starts as soon as
its gradients exist and runs while the earlier layers' are computed, instead of
one all-reduce of every gradient after the whole backward pass. Within one
machine (MirroredStrategy) the gradients stay one all-reduce.
"""

import os

import tensorflow as tf

PACK_BYTES = int(os.environ.get("TRAINER_PACK_BYTES", 4 * 2**20))


def gradient_options(strategy) -> tf.distribute.experimental.CommunicationOptions:
  """The options of the gradients' all-reduce under `strategy`."""
  if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return tf.distribute.experimental.CommunicationOptions(bytes_per_pack=PACK_BYTES)
  return tf.distribute.experimental.CommunicationOptions()
