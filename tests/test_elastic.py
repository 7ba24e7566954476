"""Elastic resume: a run continues on another replica or worker count as long as
the global batch stays the same, and matches the uninterrupted run."""

import numpy as np
import pytest

import trainer
from conftest import float_values
from trainer import Config
from trainer.errors import ModelDirError

SGD = dict(dataset="digits", model="mlp", optimizer="sgd", learning_rate=0.1,
           checkpoint_every=20, steps_per_loop=10, summaries=False)


def assert_close(run_a, run_b):
  """Asserts two runs' latest float variables differ by at most 1e-5."""
  a, b = float_values(run_a), float_values(run_b)
  assert a.keys() == b.keys() and any(k.startswith("model/") for k in a)
  for key in a:
    assert np.max(np.abs(a[key] - b[key])) <= 1e-5, key


def test_two_replicas_continue_on_four_with_the_same_global_batch(tmp_path, capsys):
  straight, elastic = str(tmp_path / "straight"), str(tmp_path / "elastic")
  trainer.train(Config(model_dir=straight, cpu_devices=2, per_replica_batch_size=16,
                       train_steps=40, **SGD))
  trainer.train(Config(model_dir=elastic, cpu_devices=2, per_replica_batch_size=16,
                       train_steps=20, **SGD))
  # Another global batch is refused, listing it; nothing is written.
  with pytest.raises(ModelDirError, match=r"global batch 64 \(4 replica\(s\) x 16; "
                     r"the run has 32\)"):
    trainer.train(Config(model_dir=elastic, cpu_devices=4, per_replica_batch_size=16,
                         train_steps=40, **SGD))
  capsys.readouterr()
  results = trainer.train(Config(model_dir=elastic, cpu_devices=4, global_batch_size=32,
                                 train_steps=40, **SGD))
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
  import json  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  from trainer.training.state import RunState  # pylint: disable=g-import-not-at-top
  (tmp_path / "results.json").write_text(json.dumps({"global_batch_size": 64}))
  state = types.SimpleNamespace(
      record=types.SimpleNamespace(data={}), config=Config(model_dir=str(tmp_path)),
      global_batch_size=32, num_replicas=1, per_replica_batch_size=32,
      data_identity={})
  changes = RunState.resume_changes(state)
  assert changes == ["global batch 32 (1 replica(s) x 32; the run has 64)"]
  state.global_batch_size = 64
  assert RunState.resume_changes(state) == []
