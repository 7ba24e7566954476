"""Exports of anything a run can train, served by every loader: saved_model_cli
(the session-based loader TensorFlow Serving is built like), tf.saved_model.load
and keras.layers.TFSMLayer in a fresh process, and keras.models.load_model of the
model.keras beside the SavedModel (where Keras can load the model without the
task's code; where not, the run says so in one line). Each serves what training's
preprocess saw: float64 seconds, int32 token ids into a float32 keras.Input, the
pixels a float32 signature declares, a FeatureSpace's lookups."""

import json
import os
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import export_tasks
import trainer
from conftest import (REPO, TESTS, checkpoint_values, cli_env, one_line_error,
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


def _train(model_dir, task=None):
  """Trains `task` (None: the built-in digits classifier) 3 steps in-process;
  returns (the export directory, trainer.load's task and model)."""
  trainer.train(trainer.Config(train_steps=3, per_replica_batch_size=16,
                               model_dir=str(model_dir), summaries=False),
                task=task)
  task, model = trainer.load(str(model_dir))
  return str(model_dir / "export"), task, model


def _saved_model_cli(export, features: dict, out_dir) -> dict:
  """saved_model_cli run (TensorFlow Serving's kind of loader) on arrays
  {signature input name: array}."""
  inputs = []
  for name, array in features.items():
    np.save(str(out_dir / f"{name}.npy"), array)
    inputs.append(f"{name}={out_dir / name}.npy")
  process = subprocess.run(
      [os.path.join(os.path.dirname(sys.executable), "saved_model_cli"), "run",
       "--dir", export, "--tag_set", "serve", "--signature_def", "serving_default",
       "--inputs", ";".join(inputs), "--outdir", str(out_dir / "out")],
      env=cli_env(), capture_output=True, text=True, timeout=120, check=False)
  assert process.returncode == 0, process.stderr[-3000:]
  return {name[:-len(".npy")]: np.load(str(out_dir / "out" / name))
          for name in os.listdir(out_dir / "out")}


def _declared(loaded) -> dict:
  return {name: spec.dtype for name, spec in
          loaded.signatures["serving_default"].structured_input_signature[1].items()}


def test_float64_seconds_reach_preprocess_as_stored(tmp_path):
  """Unix seconds (float64) that preprocess turns into hours: a float32
  signature put them on a 128-second grid (served 4e-4 off trainer.load's)."""
  export, task, model = _train(tmp_path / "run", export_tasks.Timestamps())
  x = export_tasks.timestamps(5, seed=3)
  expected = model(task.preprocess(tf.constant(x))).numpy()
  on_grid = model(task.preprocess(tf.constant(x.astype("float32").astype("float64"))))
  assert np.abs(on_grid - expected).max() > 1e-4  # What float32 would serve.
  np.testing.assert_allclose(
      _saved_model_cli(export, {"inputs": x}, tmp_path)["outputs"], expected,
      atol=1e-6)
  loaded = tf.saved_model.load(export)
  assert _declared(loaded) == {"inputs": tf.float64}
  np.testing.assert_allclose(
      loaded.signatures["serving_default"](inputs=tf.constant(x))["outputs"],
      expected, atol=1e-6)
  np.testing.assert_allclose(loaded.serve(tf.constant(x))["outputs"], expected,
                             atol=1e-6)
  # TFSMLayer casts float inputs to its dtype: float64 passes them as they are.
  layer = keras.layers.TFSMLayer(export, call_endpoint="serving_default",
                                 dtype="float64")
  np.testing.assert_allclose(layer(tf.constant(x))["outputs"], expected, atol=1e-6)
  # serve also takes float32 (Python floats): widened exactly, never narrowed.
  np.testing.assert_allclose(loaded.serve(tf.constant(x, tf.float32))["outputs"],
                             on_grid, atol=1e-6)


def test_digits_serve_the_float_pixels_their_signature_declares(tmp_path):
  """The built-in classifier declares float32 pixels over uint8 storage: 3.7
  was cast to 3 (logits 5.6e-2 off trainer.load's); it is served as 3.7."""
  export, task, model = _train(tmp_path / "run")
  x = np.random.default_rng(4).uniform(0.0, 16.0, size=(3, 8, 8, 1))
  x = x.astype("float32")
  expected = model(task.preprocess(tf.constant(x))).numpy()
  np.testing.assert_allclose(
      _saved_model_cli(export, {"inputs": x}, tmp_path)["logits"], expected,
      atol=1e-5)
  loaded = tf.saved_model.load(export)
  assert _declared(loaded) == {"inputs": tf.float32}
  np.testing.assert_allclose(loaded.serve(tf.constant(x))["logits"], expected,
                             atol=1e-5)
  np.testing.assert_allclose(loaded.serve(tf.constant(x, tf.float64))["logits"],
                             expected, atol=1e-5)
  # Whole pixels are what training saw, stored uint8.
  whole = np.round(x)
  np.testing.assert_allclose(
      loaded.serve(tf.constant(whole))["logits"],
      model(task.preprocess(tf.constant(whole.astype("uint8")))), atol=1e-5)


def test_int32_token_ids_into_a_float32_input_serve(tmp_path):
  """keras-io's Transformer classifier feeds int32 ids to keras.Input((maxlen,))
  (float32): the signature, serve and TFSMLayer refused the ids."""
  export, _, model = _train(tmp_path / "run", export_tasks.TokenIds())
  ids = export_tasks.token_ids(4, seed=3)
  expected = model(ids).numpy()
  loaded = tf.saved_model.load(export)
  for dtype in ("int32", "int64"):
    np.testing.assert_allclose(
        loaded.serve(tf.constant(ids.astype(dtype)))["outputs"], expected, atol=1e-6)
  assert _declared(loaded) == {"inputs": tf.int32}
  np.testing.assert_allclose(
      loaded.signatures["serving_default"](inputs=tf.constant(ids))["outputs"],
      expected, atol=1e-6)
  layer = keras.layers.TFSMLayer(export, call_endpoint="serving_default")
  np.testing.assert_allclose(layer(tf.constant(ids))["outputs"], expected, atol=1e-6)
  np.testing.assert_allclose(
      _saved_model_cli(export, {"inputs": ids}, tmp_path)["outputs"], expected,
      atol=1e-6)
  # An int64 that int32 cannot hold is refused, not wrapped around.
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="feature inputs holds values outside int32"):
    loaded.serve(tf.constant(ids.astype("int64") + 2 ** 32))


def test_a_feature_space_kept_on_the_task_exports(tmp_path):
  """keras-io's structured-data recipe, a FeatureSpace adapted in prepare and
  kept on the task, ended the run with exit 8 telling the user to keep it on
  the task: its lookup tables are in dicts TensorFlow does not track."""
  export, task, model = _train(tmp_path / "run", export_tasks.Featured())
  x = export_tasks.records(4, seed=3)
  expected = model(task.preprocess(
      {name: tf.constant(value) for name, value in x.items()})).numpy()
  loaded = tf.saved_model.load(export)
  assert _declared(loaded) == {"color": tf.string, "size": tf.float64}
  served = loaded.serve({"color": tf.constant(x["color"].astype("S")),
                         "size": tf.constant(x["size"])})
  np.testing.assert_allclose(served["outputs"], expected, atol=1e-6)
  np.testing.assert_allclose(_saved_model_cli(
      export, {"color": x["color"].astype("S"), "size": x["size"]},
      tmp_path)["outputs"], expected, atol=1e-6)


def test_an_iterator_that_preprocess_reads_is_named(tmp_path):
  """A SavedModel cannot hold a tf.data iterator: the one line named no
  attribute and said it was not on the task, where it is."""
  result = run_cli("--task=export_tasks:Iterating", "--train_steps=3",
                   f"--model_dir={tmp_path / 'run'}", python_path=TESTS)
  one_line_error(result, "(Task.offsets (OwnedIterator), which preprocess or a "
                 "serving method uses, cannot be saved in a SavedModel (TensorFlow "
                 "saves no IteratorResource)", code=8)
  line = result.stderr.strip()
  assert "serving must not read it; read it in the input pipeline" in line, line
  assert "neither the model's" not in line, line
  assert read_results(str(tmp_path / "run"))["status"] == "unexported"


with open(os.path.join(REPO, "docs", "options.md")) as _f:
  # Indented in a list item: as the reader sees it, dedented.
  _DOCS_EXAMPLES = [textwrap.dedent(block) for _, block in re.findall(
      r"^( *)```python\n(.*?)^\1```", _f.read(), flags=re.S | re.M)]


def test_the_export_example_in_the_docs_runs_as_written(tmp_path):
  """docs/options.md's `tf.saved_model.load(".../export").serve(...)` failed
  ("referencing variables which have been deleted")."""
  examples = [block for block in _DOCS_EXAMPLES if "tf.saved_model.load" in block]
  assert len(examples) == 1, _DOCS_EXAMPLES
  process = subprocess.run([sys.executable, "-c", examples[0]], cwd=tmp_path,
                           env=cli_env(PYTHONPATH=REPO), capture_output=True,
                           text=True, timeout=300, check=False)
  assert process.returncode == 0, process.stdout[-2000:] + process.stderr[-3000:]
