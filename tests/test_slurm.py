"""SLURM for real: the trainer's 2-task jobs on a single-node cluster.

tests/slurm_cluster.py starts munged, slurmctld and slurmd in a temporary directory
(`.ci/run` installs slurm-wlm and munge where they are missing); where they cannot
start, every test here skips with the reason. `srun --nodes=1 --ntasks=2` must form
a 2-worker cluster equal to 2 replicas in one process, and a batch job that
`scancel` stops (SIGTERM: the workers save and exit 4) must resume when it is
resubmitted and end bit for bit where an uninterrupted run ends. The tests that
fake SLURM's environment stay (tests/test_config.py).
"""

import os
import re
import shlex
import socket
import sys

import numpy as np
import pytest

import slurm_cluster
from trainer.distribute import devices
from conftest import (REPO, assert_bit_identical, checkpoint_values, cli_env,
                      read_results, run_cli)

pytestmark = pytest.mark.slow  # 4 runs of 2 workers, 1 in-process: ~40 s idle.

TRAIN_STEPS = 60
# Small SGD steps on the MLP, as in tests/test_multi_worker.py.
FLAGS = ["--dataset=digits", "--model=mlp", "--optimizer=sgd", "--learning_rate=0.05",
         "--per_replica_batch_size=16", "--steps_per_loop=10",
         "--checkpoint_every=20", "--deterministic", "--seed=3"]
SLURM_FLAGS = ["--strategy=multi_worker", "--cluster_resolver=slurm",
               "--cpu_devices=1"]
TASKS = ["--nodes=1", "--ntasks=2"]
# TensorFlow's SlurmClusterResolver gives a node's tasks ports 8888, 8889, ...
# (its port_base, which the trainer keeps).
WORKER_PORTS = (8888, 8889)
TIMEOUT = 300  # Seconds any one run or wait may take before the test fails.


@pytest.fixture(scope="module")
def slurm():
  busy = [port for port in WORKER_PORTS if devices.port_in_use(port)]
  if busy:
    pytest.skip(f"port {busy[0]} on 127.0.0.1 is in use: SLURM's workers need "
                f"{WORKER_PORTS[0]}-{WORKER_PORTS[-1]} (SlurmClusterResolver's "
                "port_base)")
  cluster = slurm_cluster.cluster_or_skip()
  yield cluster
  cluster.close()


def job_env(cluster):
  """The CLI runs' environment (conftest.cli_env), pointed at the cluster."""
  return cluster.environ(cli_env())


def trainer_command(*extra):
  return [sys.executable, "-m", "trainer.main", *FLAGS, *SLURM_FLAGS, *extra]


def srun(cluster, *extra):
  """`srun --nodes=1 --ntasks=2 python -m trainer.main ...`: a CompletedProcess."""
  return cluster.run("srun", *TASKS, *trainer_command(*extra), cwd=REPO,
                     env=job_env(cluster), timeout=TIMEOUT)


def test_srun_tasks_form_a_cluster_equal_to_two_replicas(slurm, tmp_path):
  model_dir = str(tmp_path / "slurm")
  result = srun(slurm, f"--train_steps={TRAIN_STEPS}", f"--model_dir={model_dir}")
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  results = read_results(model_dir)
  assert results["status"] == "completed"
  assert results["num_workers"] == 2 and results["num_replicas"] == 2
  assert results["replica_batches"] == {"replica_0": TRAIN_STEPS,
                                        "replica_1": TRAIN_STEPS}
  assert results["replica_examples"] == {"replica_0": TRAIN_STEPS * 16,
                                         "replica_1": TRAIN_STEPS * 16}

  mirrored_dir = str(tmp_path / "mirrored")
  mirrored = run_cli(*FLAGS, "--cpu_devices=2", "--strategy=mirrored",
                     f"--train_steps={TRAIN_STEPS}", f"--model_dir={mirrored_dir}")
  assert mirrored.returncode == 0, mirrored.stderr
  workers = checkpoint_values(os.path.join(model_dir, "checkpoints"))
  replicas = checkpoint_values(os.path.join(mirrored_dir, "checkpoints"))
  model_keys = [k for k in workers if k.startswith("model/")]
  assert len(model_keys) == 4  # Two dense layers: kernel and bias each.
  for key in model_keys:
    np.testing.assert_allclose(workers[key], replicas[key], atol=1e-5, err_msg=key)
  assert int(workers["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == TRAIN_STEPS


def write_batch_script(path):
  """A batch script as a user would write it: `srun` of the trainer, the flags
  given to sbatch after the script passed on."""
  with open(path, "w") as f:
    f.write("\n".join(["#!/bin/bash", *(f"#SBATCH {option}" for option in TASKS),
                       f'srun {shlex.join(trainer_command())} "$@"', ""]))
  return str(path)


def saved_steps(model_dir):
  """The steps of the checkpoints in a run directory, beyond step 0."""
  try:
    names = os.listdir(os.path.join(model_dir, "checkpoints"))
  except FileNotFoundError:
    return []
  return sorted(int(m[1]) for m in (re.fullmatch(r"ckpt-(\d+)\.index", n)
                                    for n in names) if m and int(m[1]) > 0)


def read(path):
  with open(path) as f:
    return f.read()


def test_cancelled_batch_job_resumes_on_resubmission(slurm, tmp_path):
  """scancel sends the job's processes SIGTERM: the workers agree on a step, save
  and exit 4; the resubmitted job resumes there and ends bit for bit where an
  uninterrupted run ends. The first submission is open-ended, so that however fast
  the machine, the cancel lands mid-run; its resubmission trains 20 steps more."""
  script = write_batch_script(tmp_path / "train.sh")
  model_dir, output = str(tmp_path / "run"), str(tmp_path / "job-1.out")
  env = job_env(slurm)
  job = slurm.submit(script, "--train_steps=1000000", f"--model_dir={model_dir}",
                     options=[f"--output={output}"], cwd=REPO, env=env)
  slurm.wait_for(
      "a checkpoint beyond step 0",
      lambda: saved_steps(model_dir) or _ended_early(slurm, job, output),
      timeout=TIMEOUT)
  assert slurm.run("scancel", job).returncode == 0
  assert slurm.wait_until_done(job, timeout=TIMEOUT) == "CANCELLED"
  log = read(output)
  # SLURM signals the tasks one after the other: the chief names SIGTERM when it
  # had the signal by the stop vote, else the stop request another worker had.
  stopped = re.search(r"^(?:SIGTERM: saved a checkpoint at step (\d+)|a stop "
                      r"request at step (\d+): saved a checkpoint)", log, re.M)
  assert stopped, log[-3000:]
  step = int(stopped[1] or stopped[2])
  assert re.search(r"Exited with exit code 4$", log, re.M), log[-3000:]
  assert not re.search(r"exit code (?!4$)", log, re.M), log[-3000:]
  interrupted = read_results(model_dir)
  assert interrupted["status"] == "interrupted"
  assert interrupted["global_step"] == step > 0

  train_steps = f"--train_steps={step + 20}"
  output = str(tmp_path / "job-2.out")
  job = slurm.submit(script, train_steps, f"--model_dir={model_dir}",
                     options=[f"--output={output}"], cwd=REPO, env=env)
  _resumes_as_uninterrupted(slurm, job, output, model_dir, step, tmp_path)


def _resumes_as_uninterrupted(slurm, job, output, model_dir, step, tmp_path):
  """Waits for the job that resumes the run stopped at `step` to complete, then
  asserts it resumed there and ended, at step + 20, bit for bit where an
  uninterrupted srun of that many steps ends."""
  assert slurm.wait_until_done(job, timeout=TIMEOUT) == "COMPLETED", (
      read(output)[-3000:])
  log = read(output)
  assert re.search(rf"resuming at step {step}\b", log), log[-3000:]
  assert read_results(model_dir)["status"] == "completed"
  reference_dir = str(tmp_path / "uninterrupted")
  reference = srun(slurm, f"--train_steps={step + 20}",
                   f"--model_dir={reference_dir}")
  assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
  values = assert_bit_identical(model_dir, reference_dir)
  assert int(values["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == step + 20


def _ended_early(cluster, job, output):
  """Fails the wait at once when the job ended before its first checkpoint."""
  state = cluster.job_state(job)
  if state in slurm_cluster.FINAL_STATES:
    log = read(output) if os.path.exists(output) else "(no output)"
    raise AssertionError(f"job {job} {state} before a checkpoint: {log[-3000:]}")
  return False


def test_a_busy_worker_port_stops_the_job_with_one_line_naming_it(slurm, tmp_path):
  # srun --kill-on-bad-exit: the worker that cannot listen stops the others, which
  # would otherwise wait for it.
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
    # The earlier jobs' connections to 8888 may wait in TIME_WAIT: a listener
    # with SO_REUSEADDR (as gRPC's) binds over them.
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", WORKER_PORTS[0]))
    taken.listen()
    result = slurm.run("srun", "--kill-on-bad-exit=1", *TASKS, *trainer_command(
        "--train_steps=20", f"--model_dir={tmp_path / 'run'}"), cwd=REPO,
                       env=job_env(slurm), timeout=TIMEOUT)
  output = result.stdout + result.stderr
  assert result.returncode != 0, output[-3000:]
  errors = [line for line in output.splitlines() if line.startswith("error:")]
  assert errors == [
      "error: --cluster_resolver=slurm: worker 0's port 8888 (localhost:8888) is "
      "in use by another process on this node; SLURM's resolver gives a node's "
      "tasks ports 8888 and up: stop what listens there (`ss -ltnp 'sport = "
      ":8888'` names it, e.g. a worker of an earlier job) or run on another "
      "node"], output[-3000:]
  assert "Traceback" not in output and re.search(
      r"task 0: Exited with exit code 2$", output, re.M), output[-3000:]
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


def write_requeue_script(path, steps_file):
  """docs/scaling.md's recipe for a time limit: SLURM signals the batch shell
  (--signal=B:USR1@90, here scancel --signal=USR1 --batch), which passes it to
  srun's tasks and waits for them; the job was submitted with --requeue. The
  step count comes from a file, so that the requeued job can be given its end."""
  with open(path, "w") as f:
    f.write("\n".join([
        "#!/bin/bash", *(f"#SBATCH {option}" for option in TASKS),
        "#SBATCH --requeue", "#SBATCH --open-mode=append",
        'trap \'kill -USR1 "$step"\' USR1',
        f'srun {shlex.join(trainer_command())} "$@" '
        f'--train_steps="$(cat {shlex.quote(str(steps_file))})" &',
        'step=$!', 'wait "$step"; status=$?',
        'while kill -0 "$step" 2>/dev/null; do wait "$step"; status=$?; done',
        'exit "$status"', ""]))
  return str(path)


def test_the_requeue_signal_saves_requeues_and_the_job_resumes(slurm, tmp_path):
  """SIGUSR1 (--requeue_signal's default) to the batch shell: every worker stops
  at one step with its checkpoint, the chief requeues the job (scontrol requeue,
  status requeued, exit 4), and the requeued job resumes there and ends bit for
  bit where an uninterrupted run ends."""
  steps_file = tmp_path / "steps"
  steps_file.write_text("1000000")  # Open-ended: the signal lands mid-run.
  script = write_requeue_script(tmp_path / "train.sh", steps_file)
  model_dir, output = str(tmp_path / "run"), str(tmp_path / "job.out")
  job = slurm.submit(script, f"--model_dir={model_dir}",
                     options=[f"--output={output}"], cwd=REPO, env=job_env(slurm))
  slurm.wait_for(
      "a checkpoint beyond step 0",
      lambda: saved_steps(model_dir) or _ended_early(slurm, job, output),
      timeout=TIMEOUT)
  assert slurm.run("scancel", "--signal=USR1", "--batch", job).returncode == 0
  slurm.wait_for("the requeued job", lambda: slurm.job_state(job) == "PENDING",
                 timeout=TIMEOUT)
  requeued = read_results(model_dir)
  step = requeued["global_step"]
  assert requeued["status"] == "requeued" and step > 0, requeued
  log = read(output)
  assert f"SIGUSR1: requeued SLURM job {job} (scontrol requeue {job})" in log, (
      log[-3000:])
  # SLURM holds a requeued job back (BeginTime) for a while: start it now.
  steps_file.write_text(str(step + 20))
  assert slurm.run("scontrol", "update", f"JobId={job}",
                   "StartTime=now").returncode == 0
  _resumes_as_uninterrupted(slurm, job, output, model_dir, step, tmp_path)
