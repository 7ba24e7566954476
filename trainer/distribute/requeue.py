"""SLURM's time limit: save, requeue the job, resume when it starts again.

A SLURM job that reaches its time limit is killed. The usual recipe asks SLURM
for a signal shortly before (`#SBATCH --signal=B:USR1@90`); the run stops on it
as on SIGTERM (every worker agrees on a step and saves its checkpoint), then the
chief requeues the job (`scontrol requeue $SLURM_JOB_ID`), and when SLURM starts
it again the same command resumes from that checkpoint. docs/scaling.md has the
batch script.

Example:

  requeued, line = requeue_job(os.environ)
  # (True, "requeued SLURM job 42 (scontrol requeue 42): ...")
"""

import subprocess

_TIMEOUT_SECONDS = 60.0  # scontrol asks slurmctld, which may be busy.


def requeue_job(environ) -> tuple:
  """Requeues the SLURM batch job this process runs in.

  Args:
    environ: the process's environment (SLURM_JOB_ID names the job).

  Returns:
    (whether it was requeued, one line saying so or why not).
  """
  job = environ.get("SLURM_JOB_ID")
  if not job:
    return False, "not requeued: this is no SLURM job (SLURM_JOB_ID is not set)"
  command = ["scontrol", "requeue", job]
  try:
    done = subprocess.run(command, capture_output=True, text=True,
                          timeout=_TIMEOUT_SECONDS, check=False)
  except FileNotFoundError:
    return False, (f"not requeued: scontrol, which requeues SLURM job {job}, is "
                   "not on PATH")
  except subprocess.TimeoutExpired:
    return False, (f"not requeued: `scontrol requeue {job}` did not answer within "
                   f"{_TIMEOUT_SECONDS:.0f} s")
  if done.returncode:
    said = (done.stderr or done.stdout).strip().splitlines()
    return False, (f"not requeued: `scontrol requeue {job}` failed ("
                   f"{said[-1] if said else f'exit {done.returncode}'}; a batch job "
                   "submitted with --requeue can be)")
  return True, (f"requeued SLURM job {job} (scontrol requeue {job}): it resumes from "
                "this checkpoint when SLURM starts it again")
