"""MultiWorkerMirroredStrategy through the local launcher (worker processes on
127.0.0.1).

One uninterrupted 2-worker run (module fixture) is the reference: it must match a
2-replica mirrored run, leave only the chief's files, and equal bit for bit a run
whose worker was killed and the cluster relaunched.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import (REPO, TESTS, assert_close, checkpoint_values, cli_env,
                      read_results, run_cli, run_cold, run_workers, user_env)

pytestmark = pytest.mark.slow  # Clusters of processes: about 45 s in all.

TRAIN_STEPS = 600
# Small SGD steps on the MLP: equal-weight comparison is meaningful and fast.
FLAGS = ["--dataset=digits", "--model=mlp", "--optimizer=sgd", "--learning_rate=0.05",
         "--per_replica_batch_size=16", f"--train_steps={TRAIN_STEPS}",
         "--checkpoint_every=100", "--steps_per_loop=10", "--deterministic",
         "--seed=3", "--cpu_devices=1"]
CHIEF_FILES = {"checkpoints", "eval", "export", "export_best", "flags.txt",
               "results.json",
               "train"}


def launcher_command(model_dir, *extra, num_workers=2):
  return [sys.executable, os.path.join(REPO, "scripts", "launch_workers.py"),
          f"--num_workers={num_workers}", "--grace_seconds=5", "--", *FLAGS,
          f"--model_dir={model_dir}", *extra]


def launch(model_dir, *extra, num_workers=2):
  """FLAGS and `extra` on a cluster of `num_workers` warm workers (run_workers:
  what a cluster computes; the tests of the launcher itself start it)."""
  return run_workers(*FLAGS, f"--model_dir={model_dir}", *extra,
                     num_workers=num_workers)


def launch_task(model_dir, *flags, num_workers=2):
  """`flags` alone (no preset flags; tests/ on the path, for
  --task=user_tasks:NAME) on `num_workers` warm workers of one replica each."""
  return run_workers(*flags, "--cpu_devices=1", f"--model_dir={model_dir}",
                     num_workers=num_workers, python_path=TESTS)


def assert_read_as_one_process_straight(
    tmp_path, *, one_process, two_workers, steps):
  """Per-pipeline data on 2 workers straight, and through a run that grows and
  shrinks (one process for a third of `steps`, 2 workers for the next, one
  process again), trains on the examples of one process straight: the same
  weights (1e-5), and no note that the data differ.

  Args:
    tmp_path: where the runs go.
    one_process: `(model_dir, *flags) -> CompletedProcess` of one process with 2
      replicas.
    two_workers: the same on 2 workers of one replica (the same global batch).
    steps: the runs' steps.
  """
  def ran(process):
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    assert "note: the run's data" not in process.stdout
    return process.stdout

  straight, workers, grown = (str(tmp_path / name) for name in
                              ("straight", "workers", "grown"))
  ran(one_process(straight, f"--train_steps={steps}"))
  ran(two_workers(workers, f"--train_steps={steps}"))
  assert_close(straight, workers)
  ran(one_process(grown, f"--train_steps={steps // 3}"))
  grew = ran(two_workers(grown, f"--train_steps={2 * steps // 3}"))
  assert "resuming on 2 replicas on 2 workers (was 2 replicas)" in grew
  shrank = ran(one_process(grown, f"--train_steps={steps}"))
  assert "resuming on 2 replicas (was 2 replicas on 2 workers)" in shrank
  assert_close(straight, grown)
  assert read_results(grown)["global_step"] == steps


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  """An uninterrupted 2-worker run: (model_dir, CompletedProcess)."""
  model_dir = str(tmp_path_factory.mktemp("mw") / "run")
  result = launch(model_dir, "--mode=train_and_eval")
  assert result.returncode == 0, result.stdout[-3000:]
  return model_dir, result


def test_two_workers_match_two_mirrored_replicas(reference_run, tmp_path):
  model_dir, _ = reference_run
  mirrored_dir = str(tmp_path / "mirrored")
  mirrored = [f for f in FLAGS if f != "--cpu_devices=1"]
  result = run_cli(*mirrored, "--cpu_devices=2", "--strategy=mirrored",
                   f"--model_dir={mirrored_dir}")
  assert result.returncode == 0, result.stderr
  workers = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  replicas = checkpoint_values(os.path.join(mirrored_dir, "checkpoints"))
  model_keys = [k for k in workers if k.startswith("model/")]
  assert len(model_keys) == 4  # Two dense layers: kernel and bias each.
  assert set(workers) == set(replicas)
  for key in model_keys:
    np.testing.assert_allclose(workers[key], replicas[key], atol=1e-5, err_msg=key)
  assert int(workers["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == TRAIN_STEPS


def test_ledger_covers_every_replica_of_every_worker(reference_run):
  model_dir, result = reference_run
  with open(os.path.join(model_dir, "results.json")) as f:
    results = json.load(f)
  assert results["status"] == "completed"
  assert results["num_workers"] == 2 and results["num_replicas"] == 2
  assert results["global_batch_size"] == 32
  assert results["replica_batches"] == {"replica_0": TRAIN_STEPS,
                                        "replica_1": TRAIN_STEPS}
  assert results["replica_examples"] == {"replica_0": TRAIN_STEPS * 16,
                                         "replica_1": TRAIN_STEPS * 16}
  # Eval counts the 360 test digits once over both workers, not once per worker.
  assert results["eval"]["examples"] == 360
  assert re.search(r"^\[worker 0\] step 600/600", result.stdout, re.M)
  assert not re.search(r"^\[worker 1\] (step|eval)", result.stdout, re.M)


def test_only_the_chief_writes_files(reference_run):
  model_dir, _ = reference_run
  assert set(os.listdir(model_dir)) == CHIEF_FILES
  # Worker 1 saved its (collective) checkpoints into checkpoints/.worker-1 and
  # removed it at the end.
  assert not [n for n in os.listdir(os.path.join(model_dir, "checkpoints"))
              if n.startswith(".")]
  with open(os.path.join(model_dir, "flags.txt")) as f:
    assert "--strategy=multi_worker\n" in f.read()


def start_launcher(model_dir, *extra, tmpdir, until):
  """Starts the launcher; returns (process, output so far) once a line matches."""
  process = subprocess.Popen(
      launcher_command(model_dir, *extra), cwd=REPO, env=cli_env(TMPDIR=str(tmpdir)),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines = []
  for line in process.stdout:
    lines.append(line)
    if re.match(until, line):
      break
  return process, "".join(lines)


def test_two_workers_continue_in_one_process(reference_run, tmp_path):
  """The 2-worker reference run (steps 0-600), cut back to its checkpoint of step
  500 and continued by one process with 2 replicas, ends where it ended."""
  reference, _ = reference_run
  model_dir = str(tmp_path / "run")
  shutil.copytree(reference, model_dir)
  checkpoints = os.path.join(model_dir, "checkpoints")
  for name in os.listdir(checkpoints):
    if name.startswith("ckpt-600"):
      os.remove(os.path.join(checkpoints, name))
  flags = [f for f in FLAGS if f != "--cpu_devices=1"]
  result = run_cli(*flags, "--cpu_devices=2", "--strategy=mirrored",
                   "--mode=train_and_eval", f"--model_dir={model_dir}")
  assert result.returncode == 0, result.stderr
  assert ("at step 500, resuming on 2 replicas (was 2 replicas on 2 workers), global "
          "batch 32 unchanged") in result.stdout
  assert_close(reference, model_dir)
  results = read_results(model_dir)
  assert results["num_workers"] == 1 and results["global_step"] == 600


def test_killed_worker_stops_cluster_and_relaunch_resumes(reference_run, tmp_path):
  reference_dir, _ = reference_run
  model_dir = str(tmp_path / "run")
  process, output = start_launcher(model_dir, "--mode=train_and_eval", tmpdir=tmp_path,
                                   until=r"\[worker 0\] step 2\d\d/")  # ckpt-100 saved.
  try:
    worker_pid = int(re.search(r"started worker 1 \(pid (\d+)\)", output)[1])
    os.kill(worker_pid, signal.SIGKILL)
    output += process.stdout.read()
    assert process.wait(timeout=60) != 0
  finally:
    process.kill()
  assert f"worker 1 (pid {worker_pid}) failed: killed by SIGKILL" in output
  # The chief either noticed the lost peer first (docs/faults.md: "hung" in
  # results.json, exit 7) or was stopped by the launcher before writing anything:
  # which, depends on the machine's load. It never says the run completed.
  if os.path.exists(os.path.join(model_dir, "results.json")):
    assert read_results(model_dir)["status"] == "hung"

  result = launch(model_dir, "--mode=train_and_eval")
  assert result.returncode == 0, result.stdout[-3000:]
  assert re.search(r"resuming at step [1-9]\d*", result.stdout)
  _assert_same_model(model_dir, reference_dir)



def _assert_same_model(model_dir, reference_dir):
  """The model weights of two runs' latest checkpoints are equal, bit for bit."""
  resumed = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  reference = checkpoint_values(os.path.join(reference_dir, "checkpoints"))
  for key in [k for k in reference if k.startswith("model/")]:
    np.testing.assert_array_equal(resumed[key], reference[key], err_msg=key)


def test_stopped_worker_is_a_hang_the_launcher_names_and_a_relaunch_resumes(tmp_path):
  """SIGSTOP worker 1 mid-run: the chief's collective fails within --hang_timeout
  naming the peer and the step (exit 7), the launcher names the stopped worker,
  and relaunching the same command resumes from the last checkpoint."""
  model_dir = str(tmp_path / "run")
  process, output = start_launcher(model_dir, "--train_steps=100000",
                                   "--hang_timeout=20s", tmpdir=tmp_path,
                                   until=r"\[worker 0\] step [2-9]\d\d/")
  try:
    worker_pid = int(re.search(r"started worker 1 \(pid (\d+)\)", output)[1])
    os.kill(worker_pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    output += process.stdout.read()
    assert process.wait(timeout=60) == 7, output[-3000:]
    assert time.monotonic() - stopped_at < 20 + 10  # The timeout, and a margin.
  finally:
    process.kill()
    with contextlib.suppress(ProcessLookupError):  # The launcher killed it.
      os.kill(worker_pid, signal.SIGKILL)
  hang = re.search(r"\[worker 0\] error: hang on worker-0: .* at step \d+ failed in a "
                   r"collective waiting for worker 1 .*; last completed step (\d+)",
                   output)
  assert hang, output[-3000:]
  assert (f"worker 1 (pid {worker_pid}) is stopped (process state T): it is the "
          "worker the others hung waiting for") in output
  assert os.path.exists(os.path.join(model_dir, "hang-worker-0.txt"))
  results = read_results(model_dir)
  assert results["status"] == "hung" and results["global_step"] == int(hang[1])
  relaunched = launch(model_dir, f"--train_steps={int(hang[1]) + 20}")
  assert relaunched.returncode == 0, relaunched.stdout[-3000:]
  assert re.search(r"resuming at step [1-9]\d*", relaunched.stdout)
  assert read_results(model_dir)["status"] == "completed"

def test_sigterm_to_launcher_stops_every_worker_at_one_step(tmp_path):
  model_dir = str(tmp_path / "run")
  process, output = start_launcher(model_dir, "--train_steps=100000", tmpdir=tmp_path,
                                   until=r"\[worker 0\] step \d+/")
  try:
    process.send_signal(signal.SIGTERM)
    output += process.stdout.read()
    assert process.wait(timeout=60) == 4, output[-2000:]
  finally:
    process.kill()
  stopped = re.search(r"\[worker 0\] SIGTERM: saved a checkpoint at step (\d+)", output)
  assert stopped, output[-2000:]
  with open(os.path.join(model_dir, "results.json")) as f:
    results = json.load(f)
  assert results["status"] == "interrupted"
  assert results["global_step"] == int(stopped[1])
  assert set(results["replica_batches"].values()) == {int(stopped[1])}


def test_worker_flag_errors_reach_the_launcher(tmp_path):
  result = subprocess.run(launcher_command(str(tmp_path / "run"), "--dataset=nope"),
                          cwd=REPO, env=cli_env(TMPDIR=str(tmp_path)),
                          capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 2
  # Whichever worker parses its flags first: the launcher then stops the other,
  # which may not have got to its own line (a loaded machine starts it slower).
  assert re.search(r"^\[worker [01]\] error: flag --dataset=nope", result.stdout,
                   re.M), result.stdout
  assert "Traceback" not in result.stdout
  assert not os.path.exists(tmp_path / "run")


def test_launcher_rejects_bad_worker_count():
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "launch_workers.py"),
       "--num_workers=0", "--", "--model_dir=x"], cwd=REPO, env=cli_env(),
      capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 2
  assert "--num_workers=0: must be at least 1" in result.stderr


def test_multi_worker_needs_tf_config_and_model_dir(tmp_path):
  result = run_cli("--strategy=multi_worker", f"--model_dir={tmp_path / 'run'}")
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: --strategy=multi_worker needs TF_CONFIG (or --cluster_resolver=slurm); "
      "see docs/scaling.md"]
  result = run_cli("--strategy=multi_worker")
  assert result.returncode == 2
  assert "needs --model_dir" in result.stderr
  env = cli_env()
  env["TF_CONFIG"] = "{not json"  # cli_env drops any TF_CONFIG of the caller.
  bad = run_cold("--strategy=multi_worker", f"--model_dir={tmp_path / 'run'}", env=env)
  assert bad.returncode == 2 and "TF_CONFIG: must be JSON" in bad.stderr
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("task", ["regression", "user_tasks:Quadratic",
                                  "user_tasks:StreamQuadratic",
                                  "layer_tasks:BatchNormTask"])
def test_two_workers_match_two_replicas_for_other_tasks(tmp_path, task):
  """The regression task, a user task (subclassed model, custom loss), a tf.data
  task (each worker reads its shard of every global batch) and BatchNormalization
  (the statistics of the global batch, over both workers) hold the multi-worker
  guarantees too: equal weights, every eval example counted once."""
  flags = [f"--task={task}", "--optimizer=sgd", "--learning_rate=0.05",
           "--per_replica_batch_size=8", "--train_steps=40", "--steps_per_loop=10",
           "--mode=train_and_eval", "--deterministic"]
  workers_dir, mirrored_dir = str(tmp_path / "workers"), str(tmp_path / "mirrored")
  launched = launch_task(workers_dir, *flags)
  assert launched.returncode == 0, launched.stdout[-3000:]
  mirrored = run_cli(*flags, "--cpu_devices=2", f"--model_dir={mirrored_dir}",
                     python_path=TESTS)
  assert mirrored.returncode == 0, mirrored.stderr
  workers = checkpoint_values(os.path.join(workers_dir, "checkpoints"))
  replicas = checkpoint_values(os.path.join(mirrored_dir, "checkpoints"))
  model_keys = [k for k in workers if k.startswith("model/")]
  assert model_keys and set(workers) == set(replicas)
  for key in model_keys:
    np.testing.assert_allclose(workers[key], replicas[key], atol=1e-5, err_msg=key)
  with open(os.path.join(workers_dir, "results.json")) as f:
    results = json.load(f)
  assert results["num_workers"] == 2
  assert results["eval"]["examples"] == {
      "regression": 89, "layer_tasks:BatchNormTask": 203}.get(task, 77)
  assert results["replica_batches"] == {"replica_0": 40, "replica_1": 40}


def test_a_pipeline_function_reads_one_process_s_examples_on_2_workers_and_growing(
    tmp_path):
  """A task's pipeline function, ordered over input shards that one process and
  2 workers both read (test_records.py: the steps' examples)."""
  flags = ["--task=user_tasks:PipelineQuadratic", "--optimizer=sgd",
           "--learning_rate=0.05", "--global_batch_size=16", "--steps_per_loop=5",
           "--checkpoint_every=10", "--summaries=false", "--deterministic",
           "--mode=train"]
  assert_read_as_one_process_straight(
      tmp_path, steps=30,
      one_process=lambda model_dir, *extra: run_cli(
          *flags, "--cpu_devices=2", f"--model_dir={model_dir}", *extra,
          python_path=TESTS),
      two_workers=lambda model_dir, *extra: launch_task(
          model_dir, *flags, *extra))


def test_a_worker_failing_alone_stops_the_others_in_one_line(tmp_path):
  """Worker 1's Task.prepare raises (its own bad files, say): it tells the
  cluster, and worker 0, waiting in its first collective, stops with one line
  naming worker 1 and its error (exit 7), not a traceback blaming its own
  Task.build_model, and not after a heartbeat timeout or --hang_timeout. Two
  workers by hand (the launcher would stop worker 0 itself)."""
  from trainer.distribute import launcher
  ports = launcher.free_ports(2)
  model_dir = str(tmp_path / "run")
  env = cli_env(PYTHONPATH=os.pathsep.join([TESTS, REPO]))
  workers = [subprocess.Popen(
      [sys.executable, "-m", "trainer.main", "--strategy=multi_worker",
       "--task=user_tasks:PrepareFailsOffChief", "--cpu_devices=1",
       "--train_steps=20", f"--model_dir={model_dir}"], cwd=REPO,
      env=dict(env, TF_CONFIG=launcher.tf_config(ports, index)),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for index in range(2)]
  try:
    (_, chief_err), (_, worker_err) = [w.communicate(timeout=240) for w in workers]
  finally:
    for worker in workers:
      worker.kill()
  error = "Task.prepare raised RuntimeError: this worker's shard list is empty"
  assert workers[1].returncode == 1, worker_err[-3000:]
  assert worker_err.strip().splitlines()[-1].startswith(f"error: {error}")
  assert workers[0].returncode == 7, chief_err[-3000:]
  assert chief_err.strip().splitlines()[-1] == (
      f"error: worker 1 failed: {error}; this worker stopped with it, and the "
      "checkpoints written so far are kept. Mend that worker and rerun the same "
      "command on every worker")
  assert "Traceback" not in chief_err


def test_a_peer_stuck_in_set_up_is_a_hang_named_by_phase(tmp_path):
  """Worker 1's Task.prepare blocks while its process lives: the variables'
  first broadcast waits for it. Within --hang_timeout both workers report a
  hang of the set-up (each its hang file) and exit 7; before, the cluster
  waited for ever, writing nothing and saying nothing."""
  from trainer.distribute import launcher
  ports = launcher.free_ports(2)
  model_dir = tmp_path / "run"
  env = cli_env(PYTHONPATH=os.pathsep.join([TESTS, REPO]))
  workers = [subprocess.Popen(
      [sys.executable, "-m", "trainer.main", "--strategy=multi_worker",
       "--task=user_tasks:PrepareHangsOffChief", "--cpu_devices=1",
       "--train_steps=20", "--hang_timeout=10s", f"--model_dir={model_dir}"],
      cwd=REPO, env=dict(env, TF_CONFIG=launcher.tf_config(ports, index)),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for index in range(2)]
  try:
    errors = [w.communicate(timeout=240)[1] for w in workers]
  finally:
    for worker in workers:
      worker.kill()
  for index, (worker, error) in enumerate(zip(workers, errors)):
    assert worker.returncode == 7, error[-3000:]
    line = next(line for line in error.splitlines() if line.startswith("error:"))
    assert line.startswith(f"error: hang on worker-{index}: set-up made no "
                           "progress for "), line
    assert "before the first step" in line
    assert (model_dir / f"hang-worker-{index}.txt").exists()


def _threads(pid):
  """The thread count of a live process, from /proc (None once it is gone)."""
  try:
    with open(f"/proc/{pid}/status") as f:
      return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M)[1])
  except (OSError, TypeError):
    return None


def test_worker_thread_counts_stay_bounded_over_a_long_run(tmp_path):
  """Each collective used to arm a timer thread living for the 10-minute
  collective timeout: ~3.5 threads per step on 2 workers, so a run of a few
  thousand steps ran the machine out of threads (the hand-written
  MultiWorkerMirroredStrategy loop stays at ~120). 2,000 steps here would have
  reached ~7,000 threads per worker."""
  model_dir = str(tmp_path / "run")
  process, output = start_launcher(model_dir, "--train_steps=2000",
                                   "--checkpoint_every=1000", "--steps_per_loop=100",
                                   tmpdir=tmp_path, until=r"\[worker 0\] step \d+/")
  pids = [int(p) for p in re.findall(r"started .*worker \d\)? \(pid (\d+)\)", output)]
  assert len(pids) == 2, output
  rest = []
  reader = threading.Thread(target=lambda: rest.append(process.stdout.read()))
  reader.start()
  peak = dict.fromkeys(pids, 0)
  try:
    while process.poll() is None:  # Sampled until the run ends, whatever its pace.
      for pid in pids:
        peak[pid] = max(peak[pid], _threads(pid) or 0)
      time.sleep(0.05)
    reader.join(timeout=60)
  finally:
    process.kill()
  output += "".join(rest)
  assert process.returncode == 0, output[-3000:]
  assert read_results(model_dir)["global_step"] == 2000
  assert all(0 < count <= 240 for count in peak.values()), peak


def test_workers_at_different_speeds_agree_on_the_automatic_loop_length(tmp_path):
  """--steps_per_loop=0 sizes each loop call from its time; worker 1 spends 0.2 s
  more per call than the chief, so each timed its calls differently and they
  proposed different lengths: the worker with the shorter call waited in the
  stop vote, the other in its next step's all-reduce, for ever. Now the vote
  after each call agrees on the fewest steps proposed."""
  model_dir = str(tmp_path / "run")
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "launch_workers.py"),
       "--num_workers=2", "--grace_seconds=5", "--", "--task=user_tasks:SlowOffChief",
       "--optimizer=sgd", "--learning_rate=0.01", "--per_replica_batch_size=8",
       "--train_steps=1500", "--steps_per_loop=0", "--checkpoint_every=1000",
       "--mode=train", "--hang_timeout=30s", "--cpu_devices=1",
       f"--model_dir={model_dir}"], cwd=REPO, env=user_env(TMPDIR=str(tmp_path)),
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stdout[-3000:]
  results = read_results(model_dir)
  assert results["status"] == "completed" and results["global_step"] == 1500
  assert results["replica_batches"] == {"replica_0": 1500, "replica_1": 1500}


def test_sigterm_to_one_worker_stops_every_worker_at_one_step_and_resumes(
    reference_run, tmp_path):
  """A cloud preempts one machine, not the cluster: SIGTERM to worker 1 alone
  (not the launcher) makes every worker agree on a step in the stop vote, save
  and exit 4; relaunching resumes there and ends bit for bit where an
  uninterrupted run ends."""
  reference_dir, _ = reference_run
  model_dir = str(tmp_path / "run")
  process, output = start_launcher(model_dir, "--mode=train_and_eval",
                                   tmpdir=tmp_path,
                                   until=r"\[worker 0\] step [1-9]\d\d/")
  try:
    worker_pid = int(re.search(r"started worker 1 \(pid (\d+)\)", output)[1])
    os.kill(worker_pid, signal.SIGTERM)
    output += process.stdout.read()
    assert process.wait(timeout=120) == 4, output[-3000:]
  finally:
    process.kill()
  # Only the chief prints; it names the other worker's request.
  stopped = re.search(r"^\[worker 0\] a stop request at step (\d+): saved a "
                      "checkpoint", output, re.M)
  assert stopped, output[-3000:]
  step = int(stopped[1])
  assert "stopped at the step the workers agreed on (exit 4" in output
  assert "failed" not in output, output[-3000:]
  results = read_results(model_dir)
  assert results["status"] == "interrupted" and results["global_step"] == step
  relaunched = launch(model_dir, "--mode=train_and_eval")
  assert relaunched.returncode == 0, relaunched.stdout[-3000:]
  assert re.search(rf"resuming at step {step}\b", relaunched.stdout)
  _assert_same_model(model_dir, reference_dir)
