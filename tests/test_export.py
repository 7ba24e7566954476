"""Exports of anything a run can train, served by every loader: saved_model_cli
(the session-based loader TensorFlow Serving is built like), tf.saved_model.load
and keras.layers.TFSMLayer in a fresh process, and keras.models.load_model of the
model.keras beside the SavedModel (where Keras can load the model without the
task's code; where not, the run says so in one line)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import export_tasks
import trainer
from conftest import (TESTS, checkpoint_values, cli_env, one_line_error,
                      read_results, run_cli)
from trainer.outputs.export import named_outputs

pytestmark = pytest.mark.slow  # A run per kind of model and a process per loader.

_LOADERS = """
import json, os, sys
import numpy as np, tensorflow as tf, keras
cases = json.loads(sys.argv[1])
for case in cases:
  x = np.load(case["x"])
  export = case["export"]
  served = tf.saved_model.load(export).signatures["serving_default"](
      inputs=tf.constant(x))
  np.savez(case["out"] + "-saved_model_load.npz",
           **{k: v.numpy() for k, v in served.items()})
  layer = keras.layers.TFSMLayer(export, call_endpoint="serving_default")
  np.savez(case["out"] + "-tfsm_layer.npz",
           **{k: np.asarray(v) for k, v in layer(tf.constant(x)).items()})
  path = os.path.join(export, "model.keras")
  if os.path.exists(path):
    model = keras.models.load_model(path)
    outputs = tf.function(lambda x: model(x, training=False))(tf.constant(x))
    if isinstance(outputs, dict):
      flat = {k: np.asarray(v) for k, v in outputs.items()}
    elif isinstance(outputs, (list, tuple)):
      flat = {f"output_{i}": np.asarray(v) for i, v in enumerate(outputs)}
    else:
      flat = {"outputs": np.asarray(outputs)}
    np.savez(case["out"] + "-load_model.npz", **flat)
"""


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
  """{kind: (export dir, inputs .npy, the trained model's outputs, stdout)}."""
  root = tmp_path_factory.mktemp("exports")
  found = {}
  for kind in export_tasks.KINDS:
    model_dir = str(root / kind)
    extra = ["--mixed_precision=mixed_bfloat16"] if kind == "mixed" else []
    process = run_cli("--task=export_tasks:Exportable", f"--task.kind={kind}",
                      "--train_steps=3", "--per_replica_batch_size=16",
                      "--cpu_devices=1", f"--model_dir={model_dir}", *extra,
                      python_path=TESTS)
    assert process.returncode == 0, process.stdout[-2000:] + process.stderr
    x = export_tasks.features(kind, 5, seed=9)
    expected = _predicted(model_dir, x)
    inputs = str(root / f"{kind}-x.npy")
    np.save(inputs, x.astype("S") if x.dtype == object else x)
    found[kind] = (os.path.join(model_dir, "export"), inputs, expected,
                   process.stdout)
  return found


def _predicted(model_dir, x) -> dict:
  """The trained model's serving outputs on `x`, in a graph as a SavedModel runs
  (under mixed precision, eager kernels round bfloat16 otherwise than the
  graph's fused ones)."""
  task, model = trainer.load(model_dir)
  predict = tf.function(lambda x: named_outputs(
      task.serving_outputs(model(task.preprocess(x), training=False))))
  return {k: np.asarray(v, np.float32) for k, v in predict(tf.constant(x)).items()}


def _assert_outputs(got: dict, expected: dict, what: str):
  assert sorted(got) == sorted(expected), what
  for name, values in expected.items():
    np.testing.assert_allclose(np.asarray(got[name], np.float32), values,
                               atol=1e-5, err_msg=f"{what}: {name}")


def test_every_kind_serves_in_a_fresh_process(exports, tmp_path):
  cases = [dict(x=inputs, export=export, out=str(tmp_path / kind))
           for kind, (export, inputs, _, _) in exports.items()]
  loaded = subprocess.run([sys.executable, "-c", _LOADERS, json.dumps(cases)],
                          env=cli_env(), capture_output=True, text=True,
                          timeout=300, check=False)
  assert loaded.returncode == 0, loaded.stderr[-3000:]
  for kind, (_, _, expected, _) in exports.items():
    for loader in ("saved_model_load", "tfsm_layer"):
      with np.load(str(tmp_path / f"{kind}-{loader}.npz")) as got:
        _assert_outputs(dict(got), expected, f"{kind} by {loader}")
    keras_file = tmp_path / f"{kind}-load_model.npz"
    assert keras_file.exists() == (kind != "subclassed"), kind
    if keras_file.exists():
      with np.load(str(keras_file)) as got:
        _assert_outputs(dict(got), expected, f"{kind} by keras.models.load_model")


@pytest.mark.parametrize("kind", export_tasks.KINDS)
def test_saved_model_cli_runs_every_kind(exports, kind, tmp_path):
  export, inputs, expected, _ = exports[kind]
  process = subprocess.run(
      [os.path.join(os.path.dirname(sys.executable), "saved_model_cli"), "run",
       "--dir", export, "--tag_set", "serve", "--signature_def", "serving_default",
       "--inputs", f"inputs={inputs}", "--outdir", str(tmp_path)],
      env=cli_env(), capture_output=True, text=True, timeout=120, check=False)
  assert process.returncode == 0, process.stderr[-3000:]
  got = {name[:-len(".npy")]: np.load(str(tmp_path / name))
         for name in os.listdir(tmp_path) if name.endswith(".npy")}
  _assert_outputs(got, expected, f"{kind} by saved_model_cli")


def test_a_model_keras_cannot_load_is_said_in_one_line(exports):
  stdout = exports["subclassed"][3]
  lines = [line for line in stdout.splitlines() if "model.keras not written" in line]
  assert len(lines) == 1, stdout
  assert ("keras.models.load_model cannot load Subclassed without your code"
          in lines[0]), lines[0]
  # Keras's cause in full (it was cut at 200 characters, mid-word).
  assert ("make sure they are all imported so that the decorator is run before "
          "trying to load them") in lines[0], lines[0]
  assert "the SavedModel is written" in lines[0]
  assert not os.path.exists(os.path.join(exports["subclassed"][0], "model.keras"))


def test_a_failed_export_keeps_the_run_and_a_rerun_only_exports(model_dir):
  flags = ["--task=export_tasks:Exportable", "--train_steps=3", "--cpu_devices=1",
           "--per_replica_batch_size=16", f"--model_dir={model_dir}"]
  failed = run_cli(*flags, "--task.fail_export=true", python_path=TESTS)
  # Any error type (a RuntimeError escaped as a traceback, exit 1).
  one_line_error(failed, "(Task.serving_outputs raised RuntimeError: "
                 "serving_outputs has a bug)", code=8)
  assert read_results(model_dir)["status"] == "unexported"
  trained = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  rerun = run_cli(*flags, python_path=TESTS)
  assert rerun.returncode == 0, rerun.stderr
  assert "nothing to train" in rerun.stdout
  assert read_results(model_dir)["status"] == "completed"
  assert os.path.exists(os.path.join(model_dir, "export", "saved_model.pb"))
  assert os.path.exists(os.path.join(model_dir, "export", "model.keras"))
  again = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  assert all(np.array_equal(trained[k], again[k]) for k in trained)
