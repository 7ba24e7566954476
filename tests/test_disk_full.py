"""A full disk, whichever file it hits (a checkpoint, flags.txt, results.json):
one line naming the file, exit 9, every earlier checkpoint kept, and a rerun once
there is space resumes bit-exactly. On a real tmpfs of a few MB, which needs the
right to mount one (root, as in CI): skipped where there is none."""

import errno
import os
import subprocess

import pytest
import tensorflow as tf

from conftest import assert_bit_identical, one_line_error, read_results, run_cli
from presets import FAST, train
from trainer.errors import ExitCode, NoSpaceError
from trainer.outputs import run_dir

ARGS = ["--model=mlp", "--checkpoint_every=20", "--deterministic"]


@pytest.fixture
def small_disk(tmp_path):
  """A 6 MB tmpfs, unmounted afterwards."""
  mount = tmp_path / "disk"
  mount.mkdir()
  made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs",
                         str(mount)], capture_output=True, text=True, check=False)
  if made.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
  yield mount
  subprocess.run(["umount", str(mount)], check=False)


def _fill(disk, leave: int):
  """Takes all but `leave` bytes of the disk's free space."""
  free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
  subprocess.run(["fallocate", "-l", str(max(free - leave, 1)),
                  str(disk / "filler")], check=True)


def test_a_full_disk_during_a_save_loses_nothing_and_a_rerun_is_exact(small_disk,
                                                                      tmp_path):
  run = str(small_disk / "run")
  assert run_cli(*ARGS, "--train_steps=60", f"--model_dir={run}").returncode == 0
  _fill(small_disk, leave=60_000)  # Less than one checkpoint.
  full = run_cli(*ARGS, "--train_steps=80", f"--model_dir={run}")
  one_line_error(full, f"{run}/checkpoints/ckpt-80: no space left on device; every "
                       "checkpoint written before it is kept", code=9)
  names = os.listdir(os.path.join(run, "checkpoints"))
  assert {"ckpt-20.index", "ckpt-40.index", "ckpt-60.index"} <= set(names)
  assert "ckpt-80.index" not in names
  os.remove(small_disk / "filler")
  resumed = run_cli(*ARGS, "--train_steps=80", f"--model_dir={run}")
  assert resumed.returncode == 0, resumed.stderr
  assert "resuming at step 60" in resumed.stdout
  # The same history without a full disk: 60 steps (evaluated at the end), then
  # extended to 80.
  straight = str(tmp_path / "straight")
  for steps in (60, 80):
    assert run_cli(*ARGS, f"--train_steps={steps}",
                    f"--model_dir={straight}").returncode == 0
  assert_bit_identical(straight, run)
  assert read_results(run)["status"] == "completed"


def test_a_disk_too_full_for_flags_txt_is_one_line(small_disk):
  run = str(small_disk / "run")
  os.makedirs(run)
  _fill(small_disk, leave=0)
  full = run_cli(*ARGS, "--train_steps=20", f"--model_dir={run}")
  one_line_error(full, "no space left on device", code=9)
  assert "Traceback" not in full.stderr


# Without a small disk: a full disk faked where the file is written.
def _enospc(path):
  return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


def _checkpoint_steps(model_dir):
  return sorted(int(name[len("ckpt-"):-len(".index")]) for name in os.listdir(
      os.path.join(model_dir, "checkpoints")) if name.endswith(".index"))


def test_a_full_disk_at_results_json_is_one_line_and_a_rerun_finishes(model_dir,
                                                                      monkeypatch):
  write_json = run_dir.write_json

  def full_at_results(path, data):
    if os.path.basename(path) == run_dir.RESULTS_FILE:
      raise _enospc(path)
    return write_json(path, data)

  monkeypatch.setattr(run_dir, "write_json", full_at_results)
  with pytest.raises(NoSpaceError) as raised:
    train(*FAST, model_dir=model_dir, train_steps=20, checkpoint_every=10)
  assert str(raised.value).startswith(
      f"{model_dir}/results.json: no space left on device; every checkpoint")
  assert raised.value.exit_code == ExitCode.NO_SPACE
  assert _checkpoint_steps(model_dir)  # Those saved before it are kept.
  monkeypatch.undo()
  results = train(*FAST, model_dir=model_dir, train_steps=20, checkpoint_every=10)
  assert results["status"] == "completed" and results["global_step"] == 20


def test_a_full_disk_during_the_export_is_a_full_disk_not_a_failed_export(
    model_dir, monkeypatch):
  save = tf.saved_model.save

  def full_disk(module, export_dir, **kwargs):
    raise _enospc(os.path.join(export_dir, "variables"))

  monkeypatch.setattr(tf.saved_model, "save", full_disk)
  with pytest.raises(NoSpaceError) as raised:
    train(*FAST, model_dir=model_dir, train_steps=20, checkpoint_every=10)
  assert "export" in str(raised.value) and "no space left on device" in str(
      raised.value)
  assert 20 in _checkpoint_steps(model_dir)
  monkeypatch.setattr(tf.saved_model, "save", save)
  results = train(*FAST, model_dir=model_dir, train_steps=20, checkpoint_every=10)
  assert results["status"] == "completed"
  assert os.path.isdir(os.path.join(model_dir, "export"))
