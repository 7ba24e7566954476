"""A real single-node SLURM for tests: munged, slurmctld and slurmd in a temp dir.

`SlurmCluster.start()` writes a munge key and a slurm.conf into a new temporary
directory (every state, log, pid and socket file lives there too), starts the three
daemons as the current user in the foreground (so they are this process's children,
stopped by their pids), and returns once the node shows idle in `sinfo`. Clients run
through `SlurmCluster.run`, whose environment points SLURM_CONF at that slurm.conf.
Nothing outside the temporary directory is read or written but the binaries.

Where SLURM cannot run here (a binary missing, a daemon that exits or never gets
ready) it raises `SlurmUnavailable` with a one-line reason that ends with the
daemon's log tail; `cluster_or_skip()` turns that into a pytest skip:

  @pytest.fixture(scope="module")
  def slurm():
    cluster = slurm_cluster.cluster_or_skip()
    yield cluster
    cluster.close()

Every wait polls for an event (a socket, `scontrol ping`, the node's state, a job's
state) with a deadline; none sleeps a fixed time in place of one.
"""

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("munge", "srun", "sbatch", "scancel", "squeue", "sinfo", "scontrol")
NODE = "localhost"
# Job states after which a job runs nothing any more (squeue --states=all).
FINAL_STATES = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED",
                "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"}
# Seconds between SIGTERM and SIGKILL when a job is cancelled (slurm.conf KillWait):
# what a trainer has to agree on a step and save.
KILL_WAIT_SECONDS = 60
_POLL_SECONDS = 0.1
_TAIL_LINES = 3


class SlurmUnavailable(Exception):
  """SLURM cannot run on this machine; the message is one line that says why."""


class SlurmCluster:
  """A running single-node SLURM cluster; `start()` makes one.

  Attributes:
    root: the temporary directory of every config, state, log, pid and socket file.
    conf: the path of slurm.conf.
    env: the environment for SLURM's clients (and so for the jobs they start):
      this process's, without SLURM_* variables of an enclosing job, with SLURM_CONF.
    cpus: the CPUs the node offers.
  """

  def __init__(self, root: str, *, cpus: int):
    self.root = root
    self.conf = os.path.join(root, "slurm.conf")
    self.cpus = cpus
    self.env = self.environ(os.environ)
    self._daemons = {}  # name: Popen, in start order.

  @classmethod
  def start(cls, *, timeout: float = 60.0, cpus: int | None = None) -> "SlurmCluster":
    """Starts munged, slurmctld and slurmd; returns once the node is idle.

    Args:
      timeout: the most seconds each daemon may take to get ready.
      cpus: the node's CPUs (default: the cores this process may run on, at least 2,
        so that two tasks fit on a one-core machine too).

    Raises:
      SlurmUnavailable: a binary is missing or a daemon did not get ready; nothing
        is left running and the temporary directory is removed.
    """
    missing = [name for name in DAEMONS + CLIENTS if shutil.which(name) is None]
    if missing:
      raise SlurmUnavailable(
          f"{', '.join(missing)} not found on PATH (apt-get install slurm-wlm munge)")
    cpus = cpus or max(2, len(os.sched_getaffinity(0)))
    for attempt in range(2):
      cluster = cls(tempfile.mkdtemp(prefix="slurm-"), cpus=cpus)
      try:
        cluster._start(timeout)
        return cluster
      except SlurmUnavailable as e:
        cluster.close()
        # The free ports were taken by someone else before a daemon bound them:
        # once more with new ones.
        if attempt or "Address already in use" not in str(e):
          raise
      except BaseException:
        cluster.close()
        raise

  def _start(self, timeout):
    # munged refuses a socket whose directory others cannot traverse, and one that
    # others can write to: the root and the socket's folder are 0755.
    os.chmod(self.root, 0o755)
    for folder in ("munge", "state", "spool"):
      os.mkdir(self._path(folder), 0o755)
    key = self._path("munge", "munge.key")
    with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
      f.write(os.urandom(1024))
    ctld_port, slurmd_port = _free_ports(2)
    with open(self.conf, "w") as f:
      f.write(self._slurm_conf(ctld_port, slurmd_port))

    self._spawn("munged", "munged", "--foreground", f"--socket={self._socket}",
                f"--key-file={key}", f"--pid-file={self._path('munge', 'munged.pid')}",
                f"--seed-file={self._path('munge', 'munged.seed')}",
                f"--log-file={self._path('munged.log')}")
    self._wait_ready("munged", timeout, lambda: self.run(
        "munge", "--no-input", f"--socket={self._socket}", timeout=15
        ).returncode == 0)
    self._spawn("slurmctld", "slurmctld", "-D", "-f", self.conf)
    self._wait_ready("slurmctld", timeout,
                     lambda: " is UP" in self.run("scontrol", "ping",
                                                  timeout=15).stdout)
    self._spawn("slurmd", "slurmd", "-D", "-f", self.conf, "-N", NODE)
    self._wait_ready("slurmd", timeout, lambda: self.node_state() == "idle",
                     status=lambda: f"node {self.node_state(reason=True)!r}")

  def environ(self, base) -> dict:
    """`base` (an environment) for SLURM's clients here: without the SLURM_*
    variables of an enclosing job, which would make srun join that job, and with
    SLURM_CONF naming this cluster's slurm.conf."""
    env = {k: v for k, v in base.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = self.conf
    return env

  @property
  def _socket(self):
    return self._path("munge", "munge.socket")

  def _path(self, *names):
    return os.path.join(self.root, *names)

  def _slurm_conf(self, ctld_port, slurmd_port):
    user = _user()
    return "\n".join([
        "ClusterName=trainertest",
        f"SlurmctldHost={NODE}",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        # As root the daemons run as root; as anyone else, as that user (whose jobs
        # are then the only ones it can run).
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={self._socket}",
        f"StateSaveLocation={self._path('state')}",
        f"SlurmdSpoolDir={self._path('spool')}",
        f"SlurmctldPidFile={self._path('slurmctld.pid')}",
        f"SlurmdPidFile={self._path('slurmd.pid')}",
        f"SlurmctldLogFile={self._path('slurmctld.log')}",
        f"SlurmdLogFile={self._path('slurmd.log')}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"TmpFS={self.root}",
        # No cgroups: processes are tracked by their parents (/proc), and tasks are
        # not bound to cores, so containers without cgroup delegation work.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "MailProg=/bin/true",
        # One node whose tasks get single CPUs, first come first served.
        "SchedulerType=sched/builtin",
        # A batch job starts at the scheduler's next tick (1 s), not up to 3 s on.
        "SchedulerParameters=batch_sched_delay=0",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        # The node is what this file says, whatever slurmd detects (a container's
        # CPU limit is not the host's core count).
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        f"KillWait={KILL_WAIT_SECONDS}",
        # Finished jobs stay visible to squeue and scontrol this long.
        "MinJobAge=3600",
        "InactiveLimit=0",
        f"NodeName={NODE} NodeHostname={NODE} NodeAddr=127.0.0.1 CPUs={self.cpus} "
        "State=UNKNOWN",
        f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])

  def _spawn(self, name, *command):
    log = open(self._path(f"{name}.out"), "wb")
    try:
      # Its own session: a terminal's Ctrl-C reaches the tests, not the daemons.
      self._daemons[name] = subprocess.Popen(
          command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
          env=self.env, cwd=self.root, start_new_session=True)
    finally:
      log.close()

  def _wait_ready(self, name, timeout, ready, *, status=None):
    """Polls `ready()` until it is true; raises SlurmUnavailable, naming `name`,
    `status()` and the log tail, when a daemon exits or the deadline passes first."""
    deadline = time.monotonic() + timeout
    while True:
      for daemon, process in self._daemons.items():
        if process.poll() is not None:
          raise SlurmUnavailable(f"{daemon} exited with {process.returncode}: "
                                 f"{self.log_tail(daemon)}")
      try:
        if ready():
          return
      except subprocess.TimeoutExpired:
        pass  # A client that got no answer: not ready yet.
      if time.monotonic() > deadline:
        raise SlurmUnavailable(
            f"{name} not ready after {timeout:.0f} s"
            + (f" ({status()})" if status else "") + f": {self.log_tail(name)}")
      time.sleep(_POLL_SECONDS)

  def log_tail(self, name: str, *, lines: int = _TAIL_LINES) -> str:
    """The last lines of a daemon's log (its log file, else its output), as one
    line."""
    text = ""
    for suffix in (".log", ".out"):
      try:
        with open(self._path(name + suffix), errors="replace") as f:
          text = f.read().strip()
      except FileNotFoundError:
        continue
      if text:
        break
    tail = [line.strip() for line in text.splitlines()[-lines:]]
    return " | ".join(tail) if tail else "(no log)"

  def run(self, *command: str, timeout: float = 60.0,
          **kwargs) -> subprocess.CompletedProcess:
    """Runs a client (srun, sbatch, squeue, ...) against this cluster.

    Returns:
      The CompletedProcess, stdout and stderr as text (unless kwargs redirect them).
    """
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("cwd", self.root)
    kwargs.setdefault("env", self.env)
    return subprocess.run(command, text=True, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL, **kwargs)

  def node_state(self, *, reason: bool = False) -> str:
    """The node's state as sinfo's %t shows it (idle, alloc, mix, down*, ...),
    and with `reason`, why it is down or drained."""
    return self.run("sinfo", "--noheader", f"--nodes={NODE}",
                    "--format=%t %E" if reason else "--format=%t", timeout=15
                    ).stdout.strip()

  def submit(self, script: str, *args: str, options: tuple = (), **kwargs) -> str:
    """`sbatch --parsable OPTIONS SCRIPT ARGS` (kwargs as for `run`).

    Returns:
      The job id.

    Raises:
      AssertionError: sbatch refused the job.
    """
    result = self.run("sbatch", "--parsable", *options, script, *args, **kwargs)
    assert result.returncode == 0, f"sbatch: {result.stderr.strip()}"
    return result.stdout.strip().split(";")[0]  # "ID" or "ID;CLUSTER".

  def job_state(self, job_id: str) -> str:
    """The job's state (PENDING, RUNNING, CANCELLED, COMPLETED, ...) or '' when
    the controller does not know it."""
    result = self.run("squeue", "--noheader", "--states=all", f"--jobs={job_id}",
                      "--format=%T")
    return result.stdout.strip() if result.returncode == 0 else ""

  def wait_for(self, what: str, condition, *, timeout: float):
    """Polls `condition()` until it returns something true, and returns that.

    Raises:
      AssertionError: the deadline passed, or a daemon exited; the message names
        `what` and the daemons' log tails.
    """
    deadline = time.monotonic() + timeout
    while True:
      value = condition()
      if value:
        return value
      dead = [n for n, p in self._daemons.items() if p.poll() is not None]
      if dead or time.monotonic() > deadline:
        raise AssertionError(
            f"{what}: " + (f"{', '.join(dead)} exited" if dead else
                           f"not after {timeout:.0f} s") + "; " +
            "; ".join(f"{n}: {self.log_tail(n)}" for n in self._daemons))
      time.sleep(_POLL_SECONDS)

  def wait_until_done(self, job_id: str, *, timeout: float) -> str:
    """Waits for the job to reach a final state (COMPLETED, CANCELLED, FAILED, ...)
    and returns it."""
    def final_state():
      state = self.job_state(job_id)
      return state if state in FINAL_STATES else None
    return self.wait_for(f"job {job_id} to finish", final_state, timeout=timeout)

  def close(self):
    """Cancels every job, stops the daemons (SIGTERM, then SIGKILL) and removes
    the temporary directory. Safe to call twice, and after a failed start."""
    if "slurmd" in self._daemons and self._daemons["slurmd"].poll() is None:
      # A failed test may leave a job running: its processes get SIGTERM, then
      # SIGKILL after KillWait, from slurmd, which must outlive them for that.
      self.run("scancel", f"--user={_user()}", timeout=30)
      try:
        self.wait_for("every job to end",
                      lambda: not self.run("squeue", "--noheader").stdout.strip(),
                      timeout=KILL_WAIT_SECONDS + 30)
      except AssertionError:
        pass  # Stopping the daemons below is all that is left to do.
    for name in reversed(list(self._daemons)):
      process = self._daemons.pop(name)
      if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
          process.wait(timeout=30)
        except subprocess.TimeoutExpired:
          process.kill()
          process.wait()
    shutil.rmtree(self.root, ignore_errors=True)


def _user():
  """This process's user name (from its uid: $USER may name another)."""
  return pwd.getpwuid(os.getuid()).pw_name


def _free_ports(count):
  """Ports free on 127.0.0.1 now (held together, so they differ)."""
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind(("127.0.0.1", 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def cluster_or_skip(**kwargs) -> SlurmCluster:
  """`SlurmCluster.start(**kwargs)`, or a pytest skip with the one-line reason."""
  try:
    return SlurmCluster.start(**kwargs)
  except SlurmUnavailable as e:
    reason = re.sub(r"\s+", " ", str(e))[:500]  # One line, whatever a log holds.
    pytest.skip(f"no SLURM here: {reason}")
