"""A full disk, whichever file it hits (a checkpoint, flags.txt, results.json):
one line naming the file, exit 9, every earlier checkpoint kept, and a rerun once
there is space resumes bit-exactly. On a real tmpfs of a few MB, which needs the
right to mount one (root, as in CI): skipped where there is none."""

import os
import subprocess

import pytest

from conftest import assert_bit_identical, one_line_error, read_results, run_cold

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
  assert run_cold(*ARGS, "--train_steps=60", f"--model_dir={run}").returncode == 0
  _fill(small_disk, leave=60_000)  # Less than one checkpoint.
  full = run_cold(*ARGS, "--train_steps=80", f"--model_dir={run}")
  one_line_error(full, f"{run}/checkpoints/ckpt-80: no space left on device; every "
                       "checkpoint written before it is kept", code=9)
  names = os.listdir(os.path.join(run, "checkpoints"))
  assert {"ckpt-20.index", "ckpt-40.index", "ckpt-60.index"} <= set(names)
  assert "ckpt-80.index" not in names
  os.remove(small_disk / "filler")
  resumed = run_cold(*ARGS, "--train_steps=80", f"--model_dir={run}")
  assert resumed.returncode == 0, resumed.stderr
  assert "resuming at step 60" in resumed.stdout
  # The same history without a full disk: 60 steps (evaluated at the end), then
  # extended to 80.
  straight = str(tmp_path / "straight")
  for steps in (60, 80):
    assert run_cold(*ARGS, f"--train_steps={steps}",
                    f"--model_dir={straight}").returncode == 0
  assert_bit_identical(straight, run)
  assert read_results(run)["status"] == "completed"


def test_a_disk_too_full_for_flags_txt_is_one_line(small_disk):
  run = str(small_disk / "run")
  os.makedirs(run)
  _fill(small_disk, leave=0)
  full = run_cold(*ARGS, "--train_steps=20", f"--model_dir={run}")
  one_line_error(full, "no space left on device", code=9)
  assert "Traceback" not in full.stderr
