"""The training options: schedules, clipping, accumulation, EMA, best model, early
stopping, warm start, profiler and time budget."""

import glob
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from trainer.config import parse_duration
from trainer.errors import ConfigError
from trainer.training import schedules

from conftest import (assert_bit_identical, checkpoint_values, read_results,
                       read_scalars, run_cli, run_replay)
from presets import MLP_SGD, train

SGD = (*MLP_SGD, "--learning_rate=0.1", "--per_replica_batch_size=8",
       "--summaries=false")


def _digits():
  """The digits as the classification task loads them."""
  from trainer.tasks import image_data
  from trainer.tasks.classification import Classification
  return image_data.load_source(Classification(), seed=0)


def _model_weights(model_dir):
  return {k: v for k, v in checkpoint_values(f"{model_dir}/checkpoints").items()
          if k.startswith("model/")}


# 1. Schedules.
def _factor(step, **kwargs):
  options = dict(schedule="constant", warmup_steps=0, decay_steps=100, min_ratio=0.0,
                 factor=0.1, boundaries=())
  options.update(kwargs)
  return float(schedules.rate_factor(step, **options))


def test_schedules_at_chosen_steps():
  assert _factor(50) == 1.0
  assert _factor(0, warmup_steps=10) == pytest.approx(0.1)  # (0 + 1) / 10.
  assert _factor(9, warmup_steps=10) == pytest.approx(1.0)
  assert _factor(10, schedule="cosine", warmup_steps=10) == pytest.approx(1.0)
  assert _factor(55, schedule="cosine", warmup_steps=10) == pytest.approx(0.5)
  assert _factor(100, schedule="cosine", warmup_steps=10) == pytest.approx(0.0)
  assert _factor(100, schedule="cosine", min_ratio=0.2) == pytest.approx(0.2)
  assert _factor(25, schedule="linear") == pytest.approx(0.75)
  assert _factor(500, schedule="linear", min_ratio=0.1) == pytest.approx(0.1)
  assert _factor(50, schedule="exponential") == pytest.approx(math.sqrt(0.1))
  assert _factor(100, schedule="exponential") == pytest.approx(0.1)
  boundaries = dict(schedule="step", boundaries=(10, 20))
  assert [_factor(s, **boundaries) for s in (9, 10, 19, 20)] == pytest.approx(
      [1.0, 0.1, 0.1, 0.01])


def test_the_summary_is_the_rate_applied_at_each_step(model_dir):
  train(*SGD, model_dir=model_dir, train_steps=40, steps_per_loop=1,
        lr_schedule="cosine", warmup_steps=5, min_learning_rate=0.01, summaries=True)
  rates = dict(read_scalars(os.path.join(model_dir, "train"))["learning_rate"])
  for step in (1, 3, 5, 6, 20, 40):  # The call ending at `step` ran step - 1.
    expected = 0.1 * _factor(step - 1, schedule="cosine", warmup_steps=5,
                             decay_steps=40, min_ratio=0.1)
    assert rates[step] == pytest.approx(expected, rel=1e-5), step


# 2. Optimizers and clipping.
def test_clipping_bounds_the_update_and_is_counted(model_dir):
  train(*SGD, model_dir=model_dir, train_steps=1, steps_per_loop=1, clip_norm=0.01,
        checkpoint_every=1, learning_rate=1.0, summaries=True)
  directory = os.path.join(model_dir, "checkpoints")
  first = tf.train.load_checkpoint(os.path.join(directory, "ckpt-0"))
  last = tf.train.load_checkpoint(os.path.join(directory, "ckpt-1"))
  keys = [k for k in checkpoint_values(directory) if k.startswith("model/")]
  change = math.sqrt(sum(float(np.sum((last.get_tensor(k) - first.get_tensor(k)) ** 2))
                         for k in keys))
  assert change == pytest.approx(0.01, rel=1e-3)  # lr 1 x the clipped norm.
  scalars = read_scalars(os.path.join(model_dir, "train"))
  assert scalars["clipped_fraction"] == [(1, 1.0)]
  assert scalars["gradient_norm"][0][1] > 0.01  # The norm before clipping.


@pytest.mark.parametrize("optimizer", ["adamw", "lion"])
def test_new_optimizers_train(model_dir, optimizer):
  results = train(*SGD, model_dir=model_dir, train_steps=30, optimizer=optimizer,
                  learning_rate=0.003)
  assert results["train"]["loss"] < 2.0


# 3. Gradient accumulation.
def test_accumulated_micro_batches_equal_one_large_batch(tmp_path):
  accumulated = train(*SGD, model_dir=str(tmp_path / "a"), train_steps=10,
                      grad_accum_steps=4)
  large = train(*SGD, model_dir=str(tmp_path / "b"), train_steps=10,
                per_replica_batch_size=32)
  assert accumulated["global_step"] == large["global_step"] == 10
  assert accumulated["replica_batches"] == {"replica_0": 40}  # Micro-batches.
  a, b = _model_weights(tmp_path / "a"), _model_weights(tmp_path / "b")
  for key in a:
    np.testing.assert_allclose(a[key], b[key], atol=1e-6, err_msg=key)


# 4. EMA.
def test_ema_weights_are_what_eval_and_export_use(model_dir):
  results = train(*SGD, model_dir=model_dir, train_steps=30, mode="train_and_eval",
                  ema_decay=0.9)
  values = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  raw = [values[f"model/{i}/.ATTRIBUTES/VARIABLE_VALUE"] for i in range(4)]
  ema = [values[f"ema/{i}/.ATTRIBUTES/VARIABLE_VALUE"] for i in range(4)]
  assert not np.allclose(raw[0], ema[0])
  source = _digits()
  x = source.x_test.astype(np.float32)
  served = tf.saved_model.load(os.path.join(model_dir, "export"))
  logits = served.signatures["serving_default"](inputs=x)["logits"].numpy()
  hidden = np.maximum(x.reshape(len(x), -1) * source.scale @ ema[0] + ema[1], 0)
  np.testing.assert_allclose(logits, hidden @ ema[2] + ema[3], atol=1e-4)
  loss = tf.keras.losses.sparse_categorical_crossentropy(source.y_test, logits,
                                                         from_logits=True)
  assert results["eval"]["loss"] == pytest.approx(float(np.mean(loss)), rel=1e-4)


# 5. Best model, 6. early stopping.
def test_best_checkpoint_survives_rotation_and_export_best_reproduces_it(model_dir):
  # "Best" = the highest loss, so the best step is an early one that rotation
  # (--keep_checkpoints=1) removes from checkpoints/ while best/ keeps it.
  results = train(*SGD, model_dir=model_dir, train_steps=60, mode="train_and_eval",
                  eval_every=10, keep_checkpoints=1, checkpoint_every=10,
                  best_metric="eval/loss", best_goal="max", learning_rate=0.5,
                  summaries=True)
  best = results["best_eval"]
  assert best["step"] < 60
  assert not os.path.exists(os.path.join(model_dir, "checkpoints",
                                         f"ckpt-{best['step']}.index"))
  best_dir = os.path.join(model_dir, "checkpoints", "best")
  assert os.listdir(best_dir) and all(
      n.startswith(f"ckpt-{best['step']}.") for n in os.listdir(best_dir))
  source = _digits()
  served = tf.saved_model.load(results["export_best_dir"])
  logits = served.signatures["serving_default"](
      inputs=source.x_test.astype(np.float32))["logits"].numpy()
  loss = tf.keras.losses.sparse_categorical_crossentropy(source.y_test, logits,
                                                         from_logits=True)
  assert best["loss"] == pytest.approx(float(np.mean(loss)), rel=1e-4)
  evaluations = read_scalars(os.path.join(model_dir, "eval"))["loss"]
  assert len(evaluations) == 6
  assert best["loss"] == pytest.approx(max(v for _, v in evaluations), rel=1e-6)


def test_early_stopping_stops_at_the_evaluation_and_exits_0(model_dir):
  args = [f"--model_dir={model_dir}", "--model=mlp", "--optimizer=sgd",
          "--train_steps=200", "--mode=train_and_eval", "--eval_every=10",
          "--steps_per_loop=10", "--early_stopping_patience=2",
          "--early_stopping_min_delta=100", "--best_metric=eval/loss"]
  process = run_cli(*args)
  assert process.returncode == 0, process.stderr
  assert "early stop at step 30" in process.stdout
  results = read_results(model_dir)
  assert results["status"] == "early_stopped" and results["global_step"] == 30
  assert os.path.isdir(os.path.join(model_dir, "export"))
  again = run_cli(*args)
  assert again.returncode == 0 and "nothing changed" in again.stdout


# 7. Warm start.
def test_warm_start_restores_what_fits_and_names_the_rest(tmp_path, capsys):
  source_dir = str(tmp_path / "source")
  train(*SGD, model_dir=source_dir, train_steps=20)
  rng = np.random.default_rng(0)
  data = tmp_path / "three.npz"
  np.savez(data, x_train=rng.integers(0, 17, (64, 8, 8, 1)).astype(np.uint8),
           y_train=np.arange(64) % 3, x_test=np.zeros((8, 8, 8, 1), np.uint8),
           y_test=np.arange(8) % 3)
  tuned_dir = str(tmp_path / "tuned")
  train(*SGD, "--dataset=npz", f"--data_path={data}", model_dir=tuned_dir,
        train_steps=5, init_checkpoint=source_dir)
  out = capsys.readouterr().out
  assert "restored 2 of 4 model weights; not restored: logits/kernel ((128, 10) " \
         "there, (128, 3) here), logits/bias" in out
  source = _model_weights(source_dir)
  start = tf.train.load_checkpoint(os.path.join(tuned_dir, "checkpoints", "ckpt-0"))
  key = "model/0/.ATTRIBUTES/VARIABLE_VALUE"
  np.testing.assert_array_equal(start.get_tensor(key), source[key])
  tuned = checkpoint_values(os.path.join(tuned_dir, "checkpoints"))
  assert int(tuned["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == 5


def test_warm_start_refuses_a_checkpoint_where_nothing_fits(tmp_path):
  source_dir = str(tmp_path / "cnn")
  train(*SGD, "--model=cnn", model_dir=source_dir, train_steps=2)
  target = str(tmp_path / "mlp")
  with pytest.raises(ConfigError, match=r"--init_checkpoint=.*: none of its 6 model "
                     r"weights fit the model being built"):
    train(*SGD, model_dir=target, train_steps=2, init_checkpoint=source_dir)
  assert not os.path.exists(target)


# 8. Profiler.
def test_profile_steps_write_a_trace_and_where_a_step_went(model_dir, capsys):
  results = train(*SGD, model_dir=model_dir, train_steps=12, profile_steps=(5, 8),
                  cpu_devices=2, steps_per_loop=2)
  [trace] = glob.glob(os.path.join(model_dir, "train", "plugins", "profile", "*",
                                   "*.xplane.pb"))
  breakdown = read_results(model_dir)["profile"]
  assert breakdown == results["profile"] and breakdown["trace"] == trace
  assert breakdown["steps"] == 4 and breakdown["loop_calls"] >= 1
  ops = breakdown["op_ms_per_step"]
  # The step's name scopes reach the trace: the gathered input, the two replicas'
  # forward and backward passes, their gradients' sum and the update.
  for part in ("input", "forward_backward", "all_reduce", "optimizer"):
    assert breakdown["ops_per_step"][part] > 0, (part, breakdown["ops_per_step"])
  # Which part took the most op time depends on the machine's load (a copy that
  # waited for the other test process counted 0.74 ms a step in CI): only that
  # the parts took some.
  assert all(ops[part] > 0 for part in ("input", "forward_backward", "optimizer"))
  assert "profile of 4 steps: " in capsys.readouterr().out
  # A step marker per loop call (the Profile tab's Overview page), numbered by
  # the call's last step.
  assert breakdown["loop_calls"] == 2 and _step_markers(trace) == [6, 8]


def _step_markers(trace) -> list:
  """The step numbers of the trace's step markers (profile.STEP_MARKER)."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2

  from trainer.outputs import profile
  space = xplane_pb2.XSpace()
  with open(trace, "rb") as f:
    space.ParseFromString(f.read())
  steps = []
  for plane in space.planes:
    names = {i: m.name for i, m in plane.stat_metadata.items()}
    for line in plane.lines:
      for event in line.events:
        if plane.event_metadata[event.metadata_id].name == profile.STEP_MARKER:
          steps += [stat.int64_value or stat.uint64_value for stat in event.stats
                    if names.get(stat.metadata_id) == "step_num"]
  return sorted(steps)


def test_a_trace_that_cannot_be_read_does_not_fail_the_run(model_dir, capsys,
                                                          monkeypatch):
  from google.protobuf.message import DecodeError

  from trainer.outputs import profile

  def corrupt(*unused_args, **unused_kwargs):
    raise DecodeError("Error parsing message")

  monkeypatch.setattr(profile, "step_breakdown", corrupt)
  results = train(*SGD, model_dir=model_dir, train_steps=8, profile_steps=(3, 4))
  assert results["status"] == "completed" and "profile" not in results
  assert ("note: no step breakdown from the profile (DecodeError: Error parsing "
          "message)") in capsys.readouterr().out


# 9. Histograms.
def _histograms(directory) -> dict:
  """{tag: {step: [k, 3] buckets (left edge, right edge, count)}}."""
  from tensorboard.backend.event_processing import event_accumulator
  accumulator = event_accumulator.EventAccumulator(
      directory, size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  return {tag: {e.step: tf.make_ndarray(e.tensor_proto)
                for e in accumulator.Tensors(tag)}
          for tag in accumulator.Tags()["tensors"]
          if tag.startswith(("weights/", "gradients/"))}


def test_histograms_show_the_weights_and_that_steps_gradients(model_dir):
  train(*SGD, "--summaries=true", "--checkpoint_every=1", "--keep_checkpoints=3",
        "--histogram_every=5", model_dir=model_dir, train_steps=10, cpu_devices=2)
  histograms = _histograms(os.path.join(model_dir, "train"))
  after, before = (tf.train.load_checkpoint(
      os.path.join(model_dir, "checkpoints", f"ckpt-{step}")) for step in (10, 9))
  # The MLP's kernels and biases, each of its own size: that pairs them with tags.
  keys = {int(np.prod(shape)): key
          for key, shape in after.get_variable_to_shape_map().items()
          if key.startswith("model/")}
  names = [tag[len("weights/"):] for tag in histograms if tag.startswith("weights/")]
  assert len(names) == len(keys) == 4
  for name in names:
    assert sorted(histograms[f"weights/{name}"]) == [5, 10]
    key = keys[int(histograms[f"weights/{name}"][10][:, 2].sum())]
    weights = after.get_tensor(key)
    # Plain SGD: step 10's all-reduced gradient is (w9 - w10) / learning rate.
    gradient = (before.get_tensor(key) - weights) / 0.1
    for tag, values in ((f"weights/{name}", weights),
                        (f"gradients/{name}", gradient)):
      buckets = histograms[tag][10]
      assert buckets[:, 2].sum() == values.size, tag
      assert buckets[0, 0] == pytest.approx(values.min(), abs=1e-4), tag
      assert buckets[-1, 1] == pytest.approx(values.max(), abs=1e-4), tag


# 10. ReduceLROnPlateau.
def test_reduce_lr_on_plateau_lowers_the_rate_and_resumes_exactly(tmp_path):
  # A metric that never improves (the loss, taken as better when larger): the
  # rate halves at every second evaluation after the first, kept on resume.
  args = ["--model=mlp", "--optimizer=sgd", "--learning_rate=0.1",
          "--per_replica_batch_size=8", "--deterministic", "--eval_every=5",
          "--best_metric=eval/loss", "--best_goal=max", "--reduce_lr_patience=2",
          "--reduce_lr_factor=0.5", "--summary_every=5", "--checkpoint_every=1000"]
  straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
  process = run_cli(f"--model_dir={straight}", "--train_steps=30", *args)
  assert process.returncode == 0, process.stderr
  assert ("2 evaluations without eval/loss improving: learning rate 0.1 -> 0.05 at "
          "step 15") in process.stdout
  rates = dict(read_scalars(os.path.join(straight, "train"))["learning_rate"])
  assert [rates[s] for s in (15, 20, 25, 30)] == pytest.approx([0.1, 0.05, 0.05,
                                                                0.025])
  # Split where the rate was lowered (a run's end evaluates, so a split off the
  # --eval_every grid would add an evaluation and change the count).
  first = run_cli(f"--model_dir={split}", "--train_steps=15", *args)
  assert first.returncode == 0 and "0.1 -> 0.05 at step 15" in first.stdout
  resumed = run_cli(f"--model_dir={split}", "--train_steps=30", *args)
  assert resumed.returncode == 0 and "resuming at step 15" in resumed.stdout
  assert "0.1 -> 0.05" not in resumed.stdout  # Not again: the record kept it.
  assert_bit_identical(straight, split)
  # Each reduction was checkpointed, so a replay of step 30 from ckpt-25 trains
  # steps 26 to 29 at the lowered rate, as the run did: the same gradient norm.
  steps = sorted(int(p.split("ckpt-")[1].split(".")[0]) for p in glob.glob(
      os.path.join(straight, "checkpoints", "ckpt-*.index")))
  assert steps[-2:] == [25, 30]
  replayed = run_replay(f"--model_dir={straight}", "--step=30")
  assert replayed.returncode == 0 and "replayed from ckpt-25" in replayed.stdout
  logged = dict(read_scalars(os.path.join(straight, "train"))["gradient_norm"])[30]
  norm = float(replayed.stdout.split("  gradient norm ")[1].split()[0])
  assert np.float32(norm) == np.float32(logged)


# 11. Time budget.
def test_max_time_stops_with_a_checkpoint_and_a_rerun_resumes(model_dir):
  args = [f"--model_dir={model_dir}", "--model=mlp", "--optimizer=sgd",
          "--steps_per_loop=50", "--checkpoint_every=100000"]
  process = run_cli(*args, "--train_steps=1000000", "--max_time=2s")
  assert process.returncode == 0, process.stderr
  results = read_results(model_dir)
  assert results["status"] == "time_limit" and results["global_step"] % 50 == 0
  step = results["global_step"]
  assert os.path.exists(os.path.join(model_dir, "checkpoints", f"ckpt-{step}.index"))
  resumed = run_cli(*args, f"--train_steps={step + 50}", "--max_time=1h")
  assert resumed.returncode == 0 and f"resuming at step {step}" in resumed.stdout
  assert read_results(model_dir)["status"] == "completed"


def test_durations_parse():
  assert parse_duration("90m", flag="--max_time") == 5400
  assert parse_duration("2h", flag="--max_time") == 7200
  assert parse_duration("3600s", flag="--max_time") == 3600
  assert parse_duration("45", flag="--max_time") == 45
  for bad in ("soon", "", "-5m", "0s", "nanh"):
    with pytest.raises(ConfigError, match="--max_time"):
      parse_duration(bad, flag="--max_time")


# All together, resumed bit-exactly.
def test_resume_is_bit_exact_with_every_option_on(tmp_path):
  args = ["--deterministic", "--model=mlp", "--dropout=0.2", "--cpu_devices=2",
          "--per_replica_batch_size=8", "--optimizer=adamw", "--learning_rate=0.01",
          # --decay_steps fixed: by default it follows --train_steps (15, then 30).
          "--lr_schedule=cosine", "--warmup_steps=5", "--decay_steps=30",
          "--clip_norm=0.5",
          "--grad_accum_steps=3", "--ema_decay=0.95", "--checkpoint_every=1000",
          "--mode=train_and_eval", "--eval_every=10"]
  straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
  assert run_cli(f"--model_dir={straight}", "--train_steps=30", *args).returncode == 0
  assert run_cli(f"--model_dir={split}", "--train_steps=15", *args).returncode == 0
  resumed = run_cli(f"--model_dir={split}", "--train_steps=30", *args)
  assert resumed.returncode == 0 and "resuming at step 15" in resumed.stdout
  a = assert_bit_identical(straight, split)
  assert any(k.startswith("ema/") for k in a)


@pytest.mark.parametrize("args, fragment", [
    (["--warmup_steps=-1"], "--warmup_steps"),
    (["--lr_schedule=cosine", "--warmup_steps=50", "--decay_steps=20"],
     "--decay_steps=20: must be more than --warmup_steps=50"),
    (["--grad_accum_steps=0"], "--grad_accum_steps=0: must be >= 1"),
    (["--ema_decay=1.5"], "--ema_decay=1.5: must be in (0, 1)"),
    (["--mode=train_and_eval", "--best_metric=eval/recall"],
     "--best_metric=eval/recall: task classification reports eval/loss, "
     "eval/accuracy"),
    (["--init_checkpoint=/no/such/run"], "--init_checkpoint=/no/such/run: no "
     "checkpoint there"),
    (["--max_time=soon"], "--max_time=soon: must be a positive duration"),
    (["--lr_schedule=step"], "--lr_schedule=step needs --lr_boundaries"),
    (["--profile_steps=9,3"], "--profile_steps=9,3: must be A,B with 1 <= A <= B"),
    (["--profile_steps=5,50"], "<= --train_steps"),
    (["--early_stopping_patience=3"], "--early_stopping_patience=3: needs "
     "evaluations: --mode=train_and_eval and --eval_every=N"),
    (["--reduce_lr_patience=2"], "--reduce_lr_patience=2: needs evaluations"),
    (["--reduce_lr_patience=2", "--eval_every=5", "--reduce_lr_factor=1"],
     "--reduce_lr_factor=1.0: must be in (0, 1)"),
])
def test_bad_option_values_are_one_line_and_write_nothing(model_dir, args, fragment):
  process = run_cli(f"--model_dir={model_dir}", "--train_steps=20", *args)
  assert process.returncode == 2, process.stdout + process.stderr
  lines = process.stderr.strip().splitlines()
  assert len(lines) == 1 and fragment in lines[0], lines
  assert not os.path.exists(model_dir)
