"""--verify_equivalence tells the truth: N replicas against one device at the
step the run starts from, each variable against the round-off floor measured in
the same call, and a cause named only on evidence
(trainer/training/equivalence.py)."""

import re

import pytest
import tensorflow as tf

import trainer
from trainer.outputs.console import Console
from trainer.training import equivalence

from conftest import TESTS, assert_bit_identical, run_cli
from layer_tasks import BatchNormTask, InBatchNegatives, RawFeatureNormTask

LINE = re.compile(r"equivalence: 2 replicas vs 1 device at step (\d+): ")
HOLDS = re.compile(r"equivalence: 2 replicas vs 1 device at step \d+: gradients "
                   r"within \S+ of their scale \(round-off floor \S+\)"
                   r"(, \d+ round-off gradient\(s\) [^:]*)?: holds")


def _train(model_dir, *, task=None, **changes):
  fields = dict(optimizer="sgd", learning_rate=0.1, train_steps=20,
                steps_per_loop=5, summaries=False, mode="train", cpu_devices=2,
                per_replica_batch_size=16, model_dir=str(model_dir))
  fields.update(changes)
  return trainer.train(trainer.Config(**fields), task=task or BatchNormTask())


def _line(capsys) -> str:
  lines = [line for line in capsys.readouterr().out.splitlines()
           if line.startswith("equivalence:")]
  assert len(lines) == 1, lines
  return lines[0]


def test_a_per_example_task_holds_and_the_check_changes_nothing(tmp_path, capsys):
  """BatchNormalization and Dropout hold (random layers count as equal), and
  the run's weights are those of a run without the check."""
  task = BatchNormTask(dropout=0.5)
  _train(tmp_path / "checked", task=task, deterministic=True,
         verify_equivalence="true")
  assert HOLDS.fullmatch(_line(capsys))
  _train(tmp_path / "plain", task=task, deterministic=True)
  assert_bit_identical(tmp_path / "checked", tmp_path / "plain")


def test_a_batchnorm_cnn_under_adam_holds_at_the_step_it_resumes_from(
    tmp_path, capsys):
  """The built-in cnn with BatchNormalization, Adam: it holds without naming a
  layer, at step 0 and at step 10 after a resume (the weights and batch that
  step reads), where Adam's steps make round-off gradients (the biases before
  the BatchNormalizations) differ by their whole scale, within their floor."""
  def cnn(train_steps):
    return trainer.train(trainer.Config(
        task_params=(("batchnorm", True), ("model", "cnn")), optimizer="adam",
        verify_equivalence="true", train_steps=train_steps, cpu_devices=2,
        per_replica_batch_size=16, mode="train", summaries=False,
        model_dir=str(tmp_path / "run")))

  cnn(10)
  assert HOLDS.fullmatch(line := _line(capsys)), line
  cnn(12)
  line = _line(capsys)
  assert HOLDS.fullmatch(line) and LINE.match(line)[1] == "10", line
  assert "round-off gradient(s)" in line


def test_raw_features_hold_and_no_mask_is_named(tmp_path, capsys):
  """Keras's E[x²] - E[x]² made this differ and blamed a mask there is none of."""
  _train(tmp_path / "run", task=RawFeatureNormTask(), train_steps=1,
         verify_equivalence="true")
  line = _line(capsys)
  assert HOLDS.fullmatch(line) and "mask" not in line, line


@pytest.mark.parametrize("task, sync, named", [
    (InBatchNegatives(), True, "the loss (Task.loss) differs for the same outputs: "
     "an example's loss depends on the other examples of its replica's batch (e.g. "
     "in-batch negatives)"),
    (BatchNormTask(nested=True), False, "layer 'block_norm' "
     "(BatchNormalization) normalises each replica's own batch "
     "(--sync_batchnorm=false")])
def test_what_differs_is_named_on_evidence(tmp_path, capsys, task, sync, named):
  _train(tmp_path / "run", task=task, train_steps=1, sync_batchnorm=sync,
         verify_equivalence="true")
  line = _line(capsys)
  assert re.match(r"equivalence: 2 replicas vs 1 device at step 0: a gradient "
                  r"differs by \S+ of its scale \(round-off floor \S+\)", line), line
  assert f": differs: {named}" in line


def test_strict_refuses_before_writing_anything(tmp_path):
  model_dir = tmp_path / "new" / "run"
  result = run_cli("--task=layer_tasks:InBatchNegatives", "--cpu_devices=2",
                   "--verify_equivalence=strict", f"--model_dir={model_dir}",
                   python_path=TESTS)
  assert result.returncode == 2, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: --verify_equivalence=strict: equivalence: 2 "
                         "replicas vs 1 device at step 0: a gradient differs by ")
  assert "the loss (Task.loss)" in last and "Traceback" not in result.stderr
  assert not (tmp_path / "new").exists()


def test_a_global_batch_that_does_not_fit_one_device_is_said(monkeypatch, capsys):
  """The one-device half runs the whole global batch on one device: out of
  memory, one line says it was not checked, and the run goes on."""
  def out_of_memory(trainer, train_data):
    raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating")

  monkeypatch.setattr(equivalence, "verify", out_of_memory)

  class Trainer:
    num_replicas, global_batch_size, step, jit_compile = 2, 4096, 0, False
    model = type("Model", (), {"compute_dtype": "float32"})()

  class Watchdog:
    def guard(self, phase, step):
      assert phase == "the equivalence check"
      return tf.name_scope("guarded")

  equivalence.check_before_training(
      Trainer(), None, console=Console(total_steps=1, is_chief=True,
                                       progress_lines=False),
      vote=lambda phase, stop: stop, watchdog=Watchdog(), strict=True)
  assert ("equivalence: not checked: the global batch of 4096 does not fit one "
          "device") in capsys.readouterr().out
