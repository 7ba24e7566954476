"""Test set-up: 4 logical CPU devices, split once before TensorFlow initialises.

In-process tests build strategies over the first N of them (the same way
`--cpu_devices=N` does). Runs that need their own TensorFlow state (the CLI, op
determinism, several workers) go through `run_cli` in a subprocess.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402 (after the environment is set)
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_TEST_DEVICES = 4
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * NUM_TEST_DEVICES)
# Initialise now, so no run in this process can re-split the CPU.
assert len(tf.config.list_logical_devices("CPU")) == NUM_TEST_DEVICES

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)


def cli_env(**extra):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **extra)
  env.pop("TF_CONFIG", None)
  return env


def pytest_collection_modifyitems(items):
  """Files with slow tests (clusters, sweeps, SLURM) first: the test processes
  (`pytest -n 3 --dist loadfile`) take files in this order, so the long files
  start early and the short ones fill the end, instead of one long file
  running alone at the end."""
  slow_files = {item.path for item in items if item.get_closest_marker("slow")}
  items.sort(key=lambda item: item.path not in slow_files)


_fork_server = []  # The session's ForkServer, once run_cli has started it.


@pytest.fixture(scope="session", autouse=True)
def _close_fork_server():
  yield
  for server in _fork_server:
    if server is not None:
      server.close()


def _warm_server():
  """The session's fork server (started on first use), or None where there is
  no os.fork."""
  if not _fork_server:
    from trainer.sweeps.forkserver import ForkServer
    _fork_server.append(ForkServer.start(env=cli_env(), cwd=REPO))
  return _fork_server[0]


def user_env(**extra):
  """cli_env with tests/ on PYTHONPATH: `--task=user_tasks:NAME` imports."""
  return cli_env(PYTHONPATH=os.pathsep.join([TESTS, REPO]), **extra)


def spawn_cli(*args, log_path, err_path=None, python_path=None, env=None):
  """Starts `python -m trainer.main ARGS` warm (see run_cli) without waiting: a
  process with poll(), kill(), send_signal() and wait(); its stdout goes to
  log_path (and stderr, unless err_path is given); `env`'s variables are set
  in its environment."""
  server = _warm_server()
  if server is None:
    pytest.skip("no fork server on this platform")
  return server.spawn(list(args), log_path=log_path, err_path=err_path,
                      python_path=python_path and os.pathsep.join([python_path,
                                                                   REPO]),
                      env=env)


def run_cli(*args, python_path=None, timeout=240):
  """Runs `python -m trainer.main ARGS` warm, forked from the sweep's fork server
  (trainer/sweeps/forkserver.py: TensorFlow imported once), which runs it as a
  cold process would (tests/test_forkserver.py checks that): the suite saves
  minutes of imports. `python_path` (e.g. TESTS, for `--task=user_tasks:NAME`)
  goes on PYTHONPATH. Returns the CompletedProcess."""
  with tempfile.TemporaryDirectory() as scratch:
    out, err = os.path.join(scratch, "out"), os.path.join(scratch, "err")
    process = spawn_cli(*args, log_path=out, err_path=err, python_path=python_path)
    try:
      code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      process.kill()
      raise
    with open(out) as f_out, open(err) as f_err:
      return subprocess.CompletedProcess(["trainer.main", *args], code, f_out.read(),
                                         f_err.read())


def run_workers(*args, num_workers=2, python_path=None, timeout=300):
  """Runs `python -m trainer.main ARGS --strategy=multi_worker` as a cluster of
  `num_workers` warm workers on 127.0.0.1 (forked as run_cli's, each with the
  TF_CONFIG scripts/launch_workers.py gives it): for tests of what a cluster
  computes.
  The launcher itself (its ports, output, a worker's death) is tested through
  launch_workers.py in tests/test_multi_worker.py and tests/test_launcher.py.

  Returns:
    A CompletedProcess: the chief's exit code (a failed worker's, if one
    failed), and every worker's output, each line prefixed `[worker i]`.
  """
  from trainer.distribute import launcher
  ports = launcher.free_ports(num_workers)
  with tempfile.TemporaryDirectory() as scratch:
    logs = [os.path.join(scratch, f"worker-{i}") for i in range(num_workers)]
    workers = [spawn_cli(*args, "--strategy=multi_worker", log_path=log,
                         python_path=python_path, env={
        "TF_CONFIG": launcher.tf_config(ports, i)}) for i, log in enumerate(logs)]
    deadline = time.monotonic() + timeout
    try:
      # A worker that fails leaves the others waiting in a collective for ever.
      while None in (codes := [w.poll() for w in workers]) and not any(codes):
        if time.monotonic() > deadline:
          raise subprocess.TimeoutExpired(["trainer.main", *args], timeout)
        time.sleep(0.05)
    finally:
      for worker in workers:
        if worker.poll() is None:
          worker.kill()
          worker.wait()
    failed = [code for code in codes if code]  # Not the ones killed here.
    output = ""
    for i, log in enumerate(logs):
      with open(log) as f:
        output += "".join(f"[worker {i}] {line}" for line in f)
    return subprocess.CompletedProcess(["trainer.main", *args],
                                       failed[0] if failed else 0, output, "")


def run_cold(*args, env=None, cwd=None, timeout=240):
  """Runs `python -m trainer.main ARGS` as a new Python process (its own
  environment, e.g. a TF_CONFIG, or working directory). Returns the
  CompletedProcess."""
  return subprocess.run([sys.executable, "-m", "trainer.main", *args],
                        cwd=cwd or REPO, env=env or cli_env(), capture_output=True,
                        text=True, timeout=timeout, check=False)


def run_replay(*args, timeout=240):
  """Runs `python -m trainer.replay ARGS` as a new Python process."""
  return subprocess.run([sys.executable, "-m", "trainer.replay", *args], cwd=REPO,
                        env=cli_env(), capture_output=True, text=True,
                        timeout=timeout, check=False)


def checkpoint_values(checkpoint_dir):
  """{variable key: numpy value} of the latest checkpoint in a directory."""
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(checkpoint_dir))
  return {name: np.asarray(reader.get_tensor(name))  # The run record is bytes.
          for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(
              checkpoint_dir)) if name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def float_values(model_dir):
  """The floating-point variables of a run's latest checkpoint."""
  return {k: v for k, v in checkpoint_values(f"{model_dir}/checkpoints").items()
          if v.dtype.kind == "f"}


def assert_bit_identical(run_a, run_b) -> dict:
  """Asserts two runs' latest checkpoints hold the same variables, bit for bit
  (but the save counter); returns run_a's values."""
  a = checkpoint_values(os.path.join(run_a, "checkpoints"))
  b = checkpoint_values(os.path.join(run_b, "checkpoints"))
  assert a.keys() == b.keys()
  for key in set(a) - {"save_counter/.ATTRIBUTES/VARIABLE_VALUE", RECORD}:
    assert np.array_equal(a[key], b[key]), key
  # The run record says the same, but for the flags (--model_dir differs).
  assert _record(a) == _record(b)
  return a


RECORD = "record/.ATTRIBUTES/VARIABLE_VALUE"


def _record(values) -> dict:
  record = json.loads(values[RECORD].item().decode())
  record.pop("flags", None)
  return record


def read_results(model_dir) -> dict:
  with open(os.path.join(model_dir, "results.json")) as f:
    return json.load(f)


def read_scalars(directory) -> dict:
  """{tag: [(step, value)]} of the event files in `directory`, none dropped."""
  from tensorboard.backend.event_processing import event_accumulator
  accumulator = event_accumulator.EventAccumulator(
      directory, size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  return {tag: [(e.step, float(tf.make_ndarray(e.tensor_proto)))
                for e in accumulator.Tensors(tag)]
          for tag in accumulator.Tags()["tensors"]
          if accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"}


def read_layout(directory):
  """The custom-scalars layout in the event files of `directory` (a Layout
  proto), or None."""
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.plugins.custom_scalar import layout_pb2, metadata
  accumulator = event_accumulator.EventAccumulator(
      directory, size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  if metadata.CONFIG_SUMMARY_TAG not in accumulator.Tags()["tensors"]:
    return None
  [event] = accumulator.Tensors(metadata.CONFIG_SUMMARY_TAG)[-1:]
  return layout_pb2.Layout.FromString(tf.make_ndarray(event.tensor_proto).item())


@pytest.fixture
def model_dir(tmp_path):
  return str(tmp_path / "run")


def assert_close(run_a, run_b, atol=1e-5):
  """Asserts two runs' latest float variables differ by at most `atol`."""
  a, b = float_values(run_a), float_values(run_b)
  assert a.keys() == b.keys()
  for key in a:
    assert np.max(np.abs(a[key] - b[key])) <= atol, key


def one_line_error(process, fragment, code=2):
  """Asserts the process failed with `code` and one `error:` line holding
  `fragment`, and no traceback."""
  assert process.returncode == code, process.stdout[-2000:] + process.stderr
  lines = process.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), process.stderr
  assert "Traceback" not in process.stdout + process.stderr
  assert fragment in lines[0], lines[0]
