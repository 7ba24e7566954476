"""Elastic resume: a run continues on another replica or worker count as long as
the global batch stays the same, and matches the uninterrupted run."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import user_tasks
from trainer import data
from trainer.data import elastic
from trainer.errors import ModelDirError
from trainer.training import announce, checkpoint_files, resume
from trainer.training.record import RunRecord

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


def test_a_worker_count_that_cannot_share_the_recorded_input_shards_picks_others():
  """Per-pipeline data keeps the run's input shards where the workers share them,
  and picks others (a multiple of the workers) where they cannot; a new run picks
  the most up to 8."""
  source = data.as_task_data(user_tasks.PipelineQuadratic().train_data(),
                             what="test")
  assert source.input_shards(recorded=None, pipelines=1, global_batch_size=16) == 8
  assert source.input_shards(recorded=8, pipelines=2, global_batch_size=16) == 8
  assert source.input_shards(recorded=8, pipelines=3, global_batch_size=24) == 6
  assert source.input_shards(recorded=2, pipelines=4, global_batch_size=16) == 8
  # An earlier 2-worker run resumed in one process keeps its 2.
  assert source.input_shards(recorded=2, pipelines=1, global_batch_size=16) == 2
  # Data that is not per-pipeline has no shards.
  arrays = data.as_task_data((np.zeros((64, 3), np.float32), np.zeros(64)),
                             what="test")
  assert arrays.input_shards(recorded=8, pipelines=3, global_batch_size=24) == 0


def test_a_resume_reads_over_the_input_shards_its_run_recorded(tmp_path, monkeypatch,
                                                               capsys):
  """The input shards are the run's, from its checkpoints: a resume keeps them
  where a new run would pick others (here runs that pick at most 2, resumed by
  one that would pick 8), and reads what the straight run read."""
  def run(name, steps):
    train(model_dir=str(tmp_path / name), cpu_devices=2, global_batch_size=16,
          train_steps=steps, learning_rate=0.05, optimizer="sgd", summaries=False,
          checkpoint_every=10, steps_per_loop=5,
          task=user_tasks.PipelineQuadratic(hidden=8))
    record = checkpoint_files.read_record(checkpoint_files.latest(
        str(tmp_path / name / "checkpoints")))
    return record.input_shards, capsys.readouterr().out

  monkeypatch.setattr(elastic, "MAX_INPUT_SHARDS", 2)
  assert run("straight", 20)[0] == 2
  run("split", 10)
  monkeypatch.setattr(elastic, "MAX_INPUT_SHARDS", 8)
  shards, out = run("split", 20)
  assert shards == 2 and "the task's pipeline function, input shard(s) 0-1 of 2" in out
  assert "note:" not in out
  assert_close(str(tmp_path / "straight"), str(tmp_path / "split"))
  # A new run picks 8: other examples.
  shards, out = run("new", 20)
  assert shards == 8 and "input shard(s) 0-7 of 8" in out
  with pytest.raises(AssertionError):
    assert_close(str(tmp_path / "straight"), str(tmp_path / "new"))


@pytest.mark.parametrize("record, shards, pipelines, note", [
    ({"input_shards": 8}, 8, 2, None),  # Shared: the same examples.
    ({"input_shards": 8}, 6, 3, "note: the run's data is ordered over 8 input "
     "shards, which 3 worker(s) cannot share evenly; from here on it is ordered "
     "over 6, so the examples are not those an uninterrupted run would have read"),
    # Checkpoints of earlier versions: their input pipelines were the shards,
    # which each had the whole buffer; one pipeline had nothing to share.
    ({"input_pipelines": 2, "num_workers": 1}, 2, 1, "note: the checkpoint is of "
     "an earlier version, whose 2 input pipelines each had the whole shuffle "
     "buffer and block of files; this version shares them among its input "
     "shards, so the examples from here on are not those the earlier version "
     "would have read"),
    ({"num_workers": 2}, 2, 2, "note: the checkpoint is of an earlier version"),
    ({"input_pipelines": 1, "num_workers": 1}, 1, 1, None),
    ({"num_workers": 1}, 1, 1, None)])
def test_a_resume_that_reads_other_examples_says_so_in_one_line(
    record, shards, pipelines, note):
  previous = RunRecord.from_json(json.dumps(record))
  said = announce.data_order_note(
      previous, data.Order(global_batch_size=24, input_shards=shards), pipelines)
  if note is None:
    assert said is None
  else:
    assert said.startswith(note), said


def test_the_run_record_keeps_the_input_shards_under_one_name():
  record = RunRecord.from_json(json.dumps({"input_pipelines": 2}))  # Earlier.
  assert record.ordered_shards() == 2
  facts = resume.RunFacts(layout={}, flags=(), data={}, global_batch_size=32,
                          per_replica_batch_size=32, num_replicas=1, num_workers=1,
                          input_shards=8)
  facts.record_into(record)
  written = json.loads(record.to_json())
  assert written["input_shards"] == 8 and "input_pipelines" not in written
  assert RunRecord.from_json(record.to_json()).ordered_shards() == 8
