"""Every Python example in the README runs as written, in a fresh process, from a
directory like the checkout's root (examples/ beside it)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, cli_env

with open(os.path.join(REPO, "README.md")) as _f:
  _BLOCKS = re.findall(r"```python\n(.*?)```", _f.read(), flags=re.S)


def test_the_readme_has_its_examples():
  assert len(_BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(_BLOCKS)))
def test_a_readme_example_runs_as_written(index, tmp_path):
  os.symlink(os.path.join(REPO, "examples"), tmp_path / "examples")
  process = subprocess.run([sys.executable, "-c", _BLOCKS[index]], cwd=tmp_path,
                           env=cli_env(PYTHONPATH=REPO), capture_output=True,
                           text=True, timeout=300, check=False)
  assert process.returncode == 0, process.stdout[-2000:] + process.stderr[-3000:]


def test_ci_runs_exactly_the_readmes_test_command():
  """.ci/run runs the command README's Development section gives (so a missing
  install step there fails CI)."""
  with open(os.path.join(REPO, "README.md")) as f:
    development = f.read().split("## Development", 1)[1]
  command = re.search(r"```\n(pip install -e \"\.\[test\]\".*?)\n```", development)[1]
  with open(os.path.join(REPO, ".ci", "run")) as f:
    lines = [line.strip() for line in f if line.strip()]
  assert lines[-1] == command
