"""The local launcher names the first worker to die, with its signal or exit code,
whatever order it sees the exits in (fake workers: no TensorFlow, no timing)."""

import io
import os
import sys

import pytest

from trainer.distribute import launcher

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_worker.py")


@pytest.mark.parametrize("victim,name", [(0, "chief (worker 0)"), (1, "worker 1")])
def test_the_first_worker_to_die_is_named_with_its_signal(tmp_path, victim, name):
  out = io.StringIO()
  code = launcher.launch([f"--victim={victim}", f"--dir={tmp_path}"], num_workers=3,
                         grace_seconds=5, out=out, program=(sys.executable, FAKE))
  text = out.getvalue()
  with open(tmp_path / "victim.pid") as f:
    pid = f.read()
  assert f"launch_workers: {name} (pid {pid}) failed: killed by SIGKILL; stopping " \
         "the other workers" in text, text
  assert text.count(" failed: ") == 1, text
  assert code == 128 + 9
