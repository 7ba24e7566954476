"""Starts a sweep's trial processes: forked warm from the fork server
(trainer/sweeps/forkserver.py, started on first use), else cold, as
`python -m trainer.main ...`, or `python -m trainer.sweeps.gate PREFIX ...` for a
trial with a pruning gate (trainer/sweeps/gate.py), which is the same trainer run
with the gate among its actions. A trial dies with its sweep (PR_SET_PDEATHSIG: a
SIGKILLed sweep's trials get a SIGTERM, save and stop).
"""

import subprocess

from trainer.sweeps import forkserver, trial_run

_DIE_WITH_PARENT = forkserver.die_with_parent_function()


class Launcher:
  """Starts trials warm while the fork server works, cold otherwise."""

  def __init__(self, *, fork_server: bool, say):
    """Creates the launcher.

    Args:
      fork_server: start trials warm, forked from a process that has imported
        TensorFlow, instead of cold.
      say: `say(message)`: a line on the sweep's output.
    """
    self._fork_server = fork_server
    self._say = say
    self._server = None  # The ForkServer, once the first trial starts.

  def spawn(self, run, *, log):
    """Starts a trial's process: run.command, gated at run.gate if it has one.

    Args:
      run: the TrialRun.
      log: the trial's log, open for appending: its stdout and stderr.

    Returns:
      The process: a subprocess.Popen, or a forkserver.WarmProcess.
    """
    command = run.command
    if run.gate is not None:  # The same trainer run, its evaluations gated.
      command = [command[0], "-m", "trainer.sweeps.gate", run.gate.prefix,
                 *command[3:]]
    return self._spawn_warm(run) or subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=trial_run.trial_env(),
        stdin=subprocess.DEVNULL, preexec_fn=_DIE_WITH_PARENT)

  def _spawn_warm(self, run):
    """Forks the trial from the fork server (started on first use); None to start
    it cold: no fork server, or it failed (then every later trial starts cold)."""
    if not self._fork_server:
      return None
    if self._server is None:
      self._server = forkserver.ForkServer.start(env=trial_run.trial_env(),
                                                 preexec_fn=_DIE_WITH_PARENT)
      if self._server is None:
        self._fork_server = False
        return None
    try:
      return self._server.spawn(run.command[3:], log_path=run.log_path,
                                gate=run.gate.prefix if run.gate else None)
    except OSError as e:
      # Its running trials go on (and report their exits); new ones start cold.
      self._say(f"{run.name}: {e}; this and later trials start cold")
      self._server.stop_starting()
      self._fork_server = False
      return None

  def close(self):
    """Ends the fork server, if started, once its trials have ended."""
    if self._server is not None:
      self._server.close()
