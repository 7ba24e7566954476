"""How a step's gradients cross the workers: the all-reduce's options.

Across workers (MultiWorkerMirroredStrategy, gRPC), the gradients are
all-reduced in packs of about PACK_BYTES, last layers first (the order the
backward pass makes them), instead of one all-reduce of every gradient
concatenated: the packs' transfers pipeline, and each can start as soon as its
gradients exist. Gradients under PACK_BYTES in all (the built-in cnn's 1.4 MB)
are one pack either way. Measured (docs/performance.md, weak scaling): an MLP
of 9.8M parameters (39 MB of gradients) on 2 workers of one core each trained
267 examples/s in one pack, 324 in packs of 4 MB, 382 in packs of 8 MB, 363 in
16 MB and 329 in 32 MB. Within one machine (MirroredStrategy) the gradients
stay one all-reduce.
"""

import tensorflow as tf

PACK_BYTES = 8 * 2**20


def gradient_options(strategy) -> tf.distribute.experimental.CommunicationOptions:
  """The options of the gradients' all-reduce under `strategy`."""
  if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return tf.distribute.experimental.CommunicationOptions(bytes_per_pack=PACK_BYTES)
  return tf.distribute.experimental.CommunicationOptions()
