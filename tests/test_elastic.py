"""Elastic resume: a run continues on another replica or worker count as long as
the global batch stays the same, and matches the uninterrupted run."""

import json
import os

import keras
import pytest
import tensorflow as tf

from trainer.errors import ModelDirError
from trainer.training import resume

from conftest import assert_close
from presets import MLP_SGD, train

SGD = (*MLP_SGD, "--learning_rate=0.1", "--checkpoint_every=20", "--steps_per_loop=10",
       "--summaries=false")


def test_two_replicas_continue_on_four_with_the_same_global_batch(tmp_path, capsys):
  straight, elastic = str(tmp_path / "straight"), str(tmp_path / "elastic")
  train(*SGD, model_dir=straight, cpu_devices=2, per_replica_batch_size=16,
        train_steps=40)
  train(*SGD, model_dir=elastic, cpu_devices=2, per_replica_batch_size=16,
        train_steps=20)
  # Another global batch is refused, listing it; nothing is written.
  with pytest.raises(ModelDirError, match=r"global batch 64 \(4 replica\(s\) x 16; "
                     r"the run has 32\)"):
    train(*SGD, model_dir=elastic, cpu_devices=4, per_replica_batch_size=16,
          train_steps=40)
  capsys.readouterr()
  results = train(*SGD, model_dir=elastic, cpu_devices=4, global_batch_size=32,
                  train_steps=40)
  assert ("at step 20, resuming on 4 replicas (was 2), global batch 32 unchanged "
          "(8 per replica)") in capsys.readouterr().out
  assert_close(straight, elastic)
  # The ledger: 20 steps on 2 replicas of 16, then 20 on 4 replicas of 8.
  assert results["per_replica_batch_size"] == 8 and results["global_batch_size"] == 32
  assert results["replica_examples"] == {f"replica_{i}": 160 for i in range(4)}
  assert results["ledger_history"] == [{
      "until_step": 20, "num_replicas": 2, "replica_batches": [20, 20],
      "replica_examples": [320, 320]}]



def test_a_checkpoint_without_the_global_batch_is_checked_by_its_results(tmp_path):
  """Checkpoints of an earlier version carry no global batch in their run record;
  the run's results.json has it, so a changed batch is still refused."""
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  record = tf.Variable(json.dumps({"ledger_batches": [5]}))  # No global batch.
  tf.train.Checkpoint(model=list(model.weights), record=record).write(
      str(tmp_path / "checkpoints" / "ckpt-5"))
  (tmp_path / "results.json").write_text(json.dumps({"global_batch_size": 64}))
  facts = resume.RunFacts(layout={}, flags=(), data={}, global_batch_size=32,
                          per_replica_batch_size=32, num_replicas=1, num_workers=1,
                          input_shards=0)
  assert os.path.exists(tmp_path / "checkpoints" / "ckpt-5.index")
  assert resume.differences(str(tmp_path), facts, model) == [
      "global batch 32 (1 replica(s) x 32; the run has 64)"]
  facts = resume.RunFacts(**dict(facts.__dict__, global_batch_size=64))
  assert resume.differences(str(tmp_path), facts, model) == []
