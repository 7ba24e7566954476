"""--array_input=gather (trainer/data/arrays.py's GatherInput): each replica gathers
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
  assert read_results(gather)["replica_batches"] == {"replica_0": 80,
                                                     "replica_1": 80}
