"""Test set-up: 4 logical CPU devices, split once before TensorFlow initialises.

In-process tests build strategies over the first N of them (the same way
`--cpu_devices=N` does). Runs that need their own TensorFlow state (the CLI, op
determinism, several workers) go through `run_cli` in a subprocess.
"""

import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

NUM_TEST_DEVICES = 4
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * NUM_TEST_DEVICES)
# Initialise now, so no run in this process can re-split the CPU.
assert len(tf.config.list_logical_devices("CPU")) == NUM_TEST_DEVICES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli_env(**extra):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **extra)
  env.pop("TF_CONFIG", None)
  return env


def run_cli(*args, timeout=240, cwd=None, env=None):
  """Runs `python -m trainer.main ARGS` and returns the CompletedProcess."""
  return subprocess.run([sys.executable, "-m", "trainer.main", *args], cwd=cwd or REPO,
                        env=env or cli_env(), capture_output=True, text=True,
                        timeout=timeout, check=False)


def checkpoint_values(checkpoint_dir):
  """{variable key: numpy value} of the latest checkpoint in a directory."""
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(checkpoint_dir))
  return {name: np.asarray(reader.get_tensor(name))  # The run record is bytes.
          for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(
              checkpoint_dir)) if name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


@pytest.fixture
def model_dir(tmp_path):
  return str(tmp_path / "run")
