#!/usr/bin/env python
"""Runs a local multi-worker cluster and samples each worker's thread count.

  python scripts/watch_threads.py --num_workers=2 --every=10 -- \
      --model=mlp --optimizer=sgd --per_replica_batch_size=16 --mode=train \
      --train_steps=100000 --model_dir=runs/threads

Every flag after `--` goes to scripts/launch_workers.py's workers. Every `--every`
seconds it prints the chief's last step and each worker's `Threads:` from
/proc/PID/status (Linux); at the end, each worker's first, peak and last count.
A run whose thread count grows with its steps dies once the machine runs out of
threads (docs/faults.md); a flat count is what a run of any length needs.
Exits with the launcher's exit code.
"""

import argparse
import os
import re
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def threads_of(pid: int):
  """The thread count of a live process, or None once it is gone."""
  try:
    with open(f"/proc/{pid}/status") as f:
      return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M)[1])
  except (OSError, TypeError):
    return None


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--num_workers", type=int, default=2)
  parser.add_argument("--every", type=float, default=10.0,
                      help="seconds between printed samples")
  parser.add_argument("worker_flags", nargs="*")
  args = parser.parse_args(argv)
  process = subprocess.Popen(
      [sys.executable, os.path.join(REPO, "scripts", "launch_workers.py"),
       f"--num_workers={args.num_workers}", "--", *args.worker_flags], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  pids, last_step, tail = {}, [0], []

  def read():
    for line in process.stdout:
      tail[:] = (tail + [line])[-5:]
      started = re.search(r"started .*?worker (\d+)\)? \(pid (\d+)\)", line)
      if started:
        pids[int(started[1])] = int(started[2])
      step = re.match(r"\[worker 0\] step (\d+)/", line)
      if step:
        last_step[0] = int(step[1])

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  counts = {}  # worker -> [counts sampled]
  start = time.monotonic()
  next_print = start
  while process.poll() is None:
    for worker, pid in sorted(pids.items()):
      count = threads_of(pid)
      if count:
        counts.setdefault(worker, []).append(count)
    if time.monotonic() >= next_print and counts:
      now = "  ".join(f"worker {w}: {c[-1]:>6,}" for w, c in sorted(counts.items()))
      print(f"{time.monotonic() - start:7.0f} s  step {last_step[0]:>9,}  {now}",
            flush=True)
      next_print += args.every
    time.sleep(0.2)
  reader.join(timeout=10)
  print("".join(tail), end="")
  for worker, sampled in sorted(counts.items()):
    print(f"worker {worker}: threads first {sampled[0]:,}, peak {max(sampled):,}, "
          f"last {sampled[-1]:,} ({len(sampled):,} samples)")
  return process.returncode


if __name__ == "__main__":
  sys.exit(main())
