"""The sweep's fork server: warm trials end as cold ones do (exit codes, a clean
stop on SIGTERM, one-line errors), also when the server itself is signalled."""

import os
import re
import signal
import time
import types

import pytest

from conftest import cli_env, read_results
from trainer.sweeps.forkserver import ForkServer

pytestmark = pytest.mark.slow


def _wait(process, timeout=120):
  deadline = time.monotonic() + timeout
  while process.poll() is None and time.monotonic() < deadline:
    time.sleep(0.1)
  return process.returncode


@pytest.fixture
def server():
  started = ForkServer.start(env=cli_env())
  assert started is not None
  yield started
  started.close()


def test_a_sigterm_to_the_server_stops_its_trials_cleanly(server, tmp_path):
  """E.g. `kill -- -PGID` or a cluster scheduler's stop: the server passes the
  SIGTERM on and reports each trial's exit 4 before it ends."""
  model_dir, log = str(tmp_path / "run"), str(tmp_path / "run.log")
  trial = server.spawn(["--dataset=digits", "--model=mlp", "--train_steps=1000000",
                        "--steps_per_loop=10", "--checkpoint_every=1000000",
                        f"--model_dir={model_dir}"], log_path=log)
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline and not (
      os.path.exists(log) and re.search(r"^step \d+/", open(log).read(), re.M)):
    time.sleep(0.1)
  os.kill(server._process.pid, signal.SIGTERM)
  assert _wait(trial) == 4, open(log).read()[-2000:]
  results = read_results(model_dir)
  assert results["status"] == "interrupted" and results["global_step"] > 0
  assert server._process.wait(timeout=30) == 0


def test_a_warm_trial_with_bad_flags_fails_as_a_cold_one(server, tmp_path):
  log = str(tmp_path / "bad.log")
  trial = server.spawn(["--model=nope", f"--model_dir={tmp_path}/bad"], log_path=log)
  assert _wait(trial) == 2
  assert open(log).read() == ("error: flag --model=nope: value should be one of "
                              "<cnn|mlp|resnet>\n")


def test_a_reused_pid_is_not_given_the_earlier_trials_exit():
  # Over a long suite or sweep the kernel reuses pids: the exit of an earlier
  # trial under pid 4242 must not end the wait of a new trial with that pid.
  read_end, write_end = os.pipe()
  process = types.SimpleNamespace(stdout=os.fdopen(read_end))
  server = ForkServer(process)
  with os.fdopen(write_end, "w", buffering=1) as lines:
    lines.write("exited 4242 0\n")
    lines.write("started 4242\n")
    assert server._reply(30) == "started 4242"
    assert server.exit_code(4242) is None
    lines.write("exited 4242 3\n")
    deadline = time.monotonic() + 30
    while server.exit_code(4242) is None and time.monotonic() < deadline:
      time.sleep(0.01)
    assert server.exit_code(4242) == 3
