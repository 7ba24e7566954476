"""--array_input=gather (trainer/data/gather.py): each replica gathers
its own batch in-graph, the same examples `experimental_distribute_dataset` gives
it."""

import numpy as np
import tensorflow as tf

from trainer import data
from trainer.distribute.cluster import Cluster

from conftest import assert_bit_identical, read_results, run_cli


def test_each_replica_gathers_what_the_distributed_dataset_gives_it():
  x = np.arange(50 * 3, dtype=np.float32).reshape(50, 3)
  arrays = data.ArrayData(x, np.arange(50))
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  order = data.Order(global_batch_size=8, seed=4, shuffle=True)
  cluster = Cluster(num_replicas=2)
  gather = arrays.gather_input(strategy, cluster, order, per_replica_batch_size=4,
                               preprocess=lambda f: f * 2.0)
  copies = strategy.experimental_local_results(gather.arrays)
  assert [c[0].device.split("/")[-1] for c in copies] == ["device:CPU:0",
                                                          "device:CPU:1"]
  gathered = tf.function(lambda step: strategy.run(gather.replica_batch,
                                                   args=(step, gather.arrays)))
  for step in (0, 5, 6, 13):  # 6 steps an epoch: 6 and 13 are in later epochs.
    expected = next(iter(arrays.train_input(strategy, cluster, order, start_step=step,
                                            preprocess=lambda f: f * 2.0)))
    got = gathered(tf.constant(step, tf.int64))
    for want, have in zip(tf.nest.flatten(expected), tf.nest.flatten(got)):
      for a, b in zip(strategy.experimental_local_results(want),
                      strategy.experimental_local_results(have)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_gather_and_dataset_train_bit_identically(tmp_path):
  # Accumulation (micro-steps), shuffling over several epochs, an evaluation.
  args = ["--deterministic", "--model=mlp", "--cpu_devices=2", "--train_steps=40",
          "--grad_accum_steps=2", "--per_replica_batch_size=16",
          "--mode=train_and_eval", "--eval_every=20"]
  gather, dataset = str(tmp_path / "gather"), str(tmp_path / "dataset")
  assert run_cli(*args, f"--model_dir={gather}").returncode == 0
  result = run_cli(*args, "--array_input=dataset", f"--model_dir={dataset}")
  assert result.returncode == 0, result.stderr
  assert_bit_identical(gather, dataset)
  # Its evaluations gather the eval split too, and say the same to the last bit.
  assert read_results(gather)["eval"] == read_results(dataset)["eval"]
  assert read_results(gather)["replica_batches"] == {"replica_0": 80,
                                                     "replica_1": 80}


def test_an_eval_split_is_gathered_as_the_padded_distributed_dataset_gives_it():
  # 50 examples in global batches of 8: the 7th step holds 2 real ones and 6 copies.
  x = np.arange(50 * 3, dtype=np.float32).reshape(50, 3)
  arrays = data.ArrayData(x, np.arange(50), np.linspace(0.5, 1.5, 50))
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  cluster = Cluster(num_replicas=2)
  gather = arrays.gather_input(strategy, cluster, None, per_replica_batch_size=4,
                               preprocess=lambda f: f * 2.0)
  dataset, num_batches = arrays.eval_input(strategy, cluster, global_batch_size=8,
                                           preprocess=lambda f: f * 2.0)
  assert gather.eval_steps == num_batches == 7
  gathered = tf.function(lambda step: strategy.run(gather.replica_batch,
                                                   args=(step, gather.arrays)))
  for step, expected in enumerate(dataset):
    got = gathered(tf.constant(step, tf.int64))
    assert len(got) == 4  # features, labels, weights, padding
    for want, have in zip(tf.nest.flatten(expected), tf.nest.flatten(got)):
      for a, b in zip(strategy.experimental_local_results(want),
                      strategy.experimental_local_results(have)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
  padding = strategy.experimental_local_results(got[3])
  assert [p.numpy().tolist() for p in padding] == [[1, 1, 0, 0], [0, 0, 0, 0]]


def test_a_dataset_is_held_in_memory_only_where_a_second_read_gives_its_elements():
  x = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
  plain = tf.data.Dataset.from_tensor_slices((x, np.arange(40)))
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  order = data.Order(global_batch_size=8, seed=4, shuffle=True, buffer=16)
  held = {}
  for name, dataset in {
      "plain": plain,
      "mapped": plain.map(lambda f, y: (f * 2.0, y)),
      # Its elements in another order: held, in the framework's order.
      "shuffled": plain.shuffle(10),
      # A shuffled part: other elements.
      "shuffled_part": plain.shuffle(10).take(20),
      "random": plain.map(lambda f, y: (f + tf.random.uniform([3]), y)),
      "generator": tf.data.Dataset.from_generator(
          lambda: iter(zip(x, range(40))),
          output_signature=(tf.TensorSpec([3], tf.float32),
                            tf.TensorSpec([], tf.int32))),
      "endless": plain.repeat()}.items():
    stream = data.StreamData(dataset)
    held[name] = stream.gather_input(strategy, Cluster(num_replicas=2), order,
                                     per_replica_batch_size=4,
                                     preprocess=lambda f: f) is not None
  assert held == {"plain": True, "mapped": True, "shuffled": True,
                  "shuffled_part": False, "random": False, "generator": False,
                  "endless": False}
  # Held, each replica gathers what the distributed dataset gives it, at any step.
  stream = data.StreamData(plain.map(lambda f, y: (f * 2.0, y)))
  gather = stream.gather_input(strategy, Cluster(num_replicas=2), order,
                               per_replica_batch_size=4, preprocess=lambda f: f)
  step = tf.function(lambda: strategy.run(
      gather.replica_batch, args=(gather.step_input(None, None), gather.arrays)))
  for start in (0, 7):
    expected = iter(stream.train_input(strategy, Cluster(num_replicas=2), order,
                                       start_step=start, preprocess=lambda f: f))
    reader = gather.iterator(start)
    gather.loop_input(reader, 3)  # Past the end of the first epoch (5 steps)
    for step_number in range(9):  # in calls of 3 steps.
      if step_number and step_number % 3 == 0:
        gather.loop_input(reader, 3)
      want, have = next(expected), step()
      for a, b in zip(tf.nest.flatten(want), tf.nest.flatten(have)):
        for one, other in zip(strategy.experimental_local_results(a),
                              strategy.experimental_local_results(b)):
          np.testing.assert_array_equal(one.numpy(), other.numpy())
