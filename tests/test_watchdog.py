"""The hang watchdog: its default limit, what it reports, and a hung run that
exits 7 with every thread's stack and resumes when rerun."""

import os
import subprocess
import sys

from conftest import REPO, TESTS, cli_env, read_results, run_cli
from trainer.training import watchdog



def test_default_limit_is_ten_minutes_or_twenty_median_calls():
  assert watchdog.default_limit([]) == 600
  assert watchdog.default_limit([1.0, 2.0, 500.0]) == 600  # A slow first call.
  assert watchdog.default_limit([40.0, 45.0, 50.0]) == 900


def test_a_collective_error_names_the_peer_and_what_happened():
  message = ("Graph execution error:\n\nCollective ops is aborted by: Error reported "
             "from /job:worker/task:1: The following tasks are unhealthy (stopped "
             "sending heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have "
             "crashed.")
  assert watchdog.peer_of(message) == "worker 1"
  assert "tasks are unhealthy" in watchdog._gist(message)
  assert watchdog.peer_of("Graph execution error: timed out") is None


def test_a_hung_loop_call_exits_7_with_stacks_and_a_rerun_resumes(model_dir):
  # 12 steps of 8 examples arrive, then none: the third loop call (steps 11-15)
  # waits forever.
  args = ["--task=user_tasks:HangsAt", "--per_replica_batch_size=8", "--shuffle=false",
          "--optimizer=sgd", "--steps_per_loop=5", "--checkpoint_every=5",
          "--train_steps=30", f"--model_dir={model_dir}"]
  hung = run_cli(*args, "--hang_timeout=8s", python_path=TESTS)
  assert hung.returncode == 7, hung.stdout + hung.stderr
  first = hung.stderr.strip().splitlines()[0]
  assert first.startswith("error: hang on worker-0: loop call at step 10 made no "
                          "progress for 8s (--hang_timeout 8s); last completed step 10")
  report = open(os.path.join(model_dir, "hang-worker-0.txt")).read()
  assert report.startswith("hang on worker-0: loop call at step 10")
  # Every thread's stack: the main thread waits in the loop call.
  assert "Thread MainThread:" in report and "in _dispatch" in report
  results = read_results(model_dir)
  assert results["status"] == "hung" and results["global_step"] == 10
  resumed = run_cli(*args, "--task.hang_after=1000000", python_path=TESTS)
  assert resumed.returncode == 0, resumed.stderr
  assert "resuming at step 10" in resumed.stdout
  assert read_results(model_dir)["status"] == "completed"


_PROGRESS_SCRIPT = """
import sys, time
from trainer.training.watchdog import HangWatchdog
watchdog = HangWatchdog(limit=1.0, directory=sys.argv[1], worker="worker-0",
                        on_hang=lambda step: print("on_hang", step, flush=True))
with watchdog:
  with watchdog.guard("replay", step=3):
    for _ in range(6):  # 2.4 s in all, each part well within the limit.
      time.sleep(0.4)
      watchdog.progressed()
  print("replay survived", flush=True)
  watchdog.completed(9)
  with watchdog.guard("checkpoint", step=9):
    time.sleep(30)
"""


def test_progress_renews_the_deadline_and_a_stalled_phase_still_exits_7(tmp_path):
  result = subprocess.run([sys.executable, "-c", _PROGRESS_SCRIPT, str(tmp_path)],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=120, check=False)
  assert result.returncode == 7, result.stdout + result.stderr
  # results.json (on_hang) is written before stderr, which may be a full pipe.
  assert result.stdout.splitlines() == ["replay survived", "on_hang 9"]
  assert "hang on worker-0: checkpoint at step 9 made no progress" in result.stderr
  assert (tmp_path / "hang-worker-0.txt").read_text().startswith(
      "hang on worker-0: checkpoint at step 9")


_FULL_STDERR_SCRIPT = """
import sys, threading, time
from trainer.training import watchdog
watchdog._STDERR_SECONDS = 1.0
# Fill stderr's pipe (nobody reads it), so the report's own write blocks.
threading.Thread(target=lambda: sys.stderr.write("x" * 10**6), daemon=True).start()
dog = watchdog.HangWatchdog(limit=0.5, directory=sys.argv[1], worker="worker-0",
                            on_hang=lambda step: print("on_hang", step, flush=True))
with dog:
  dog.completed(5)
  with dog.guard("checkpoint", step=5):
    time.sleep(60)
"""


def test_a_hang_report_exits_7_even_when_stderr_is_a_full_pipe(tmp_path):
  process = subprocess.Popen([sys.executable, "-c", _FULL_STDERR_SCRIPT, str(tmp_path)],
                             cwd=REPO, env=cli_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  try:
    assert process.wait(timeout=60) == 7
  finally:
    process.kill()
  assert process.stdout.read() == "on_hang 5\n"
  assert (tmp_path / "hang-worker-0.txt").read_text().startswith(
      "hang on worker-0: checkpoint at step 5 made no progress")
