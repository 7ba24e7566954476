"""Which sweep process a claimed trial of a shared study belongs to, and when it
is an orphan that another process may take over.

A claimed trial records its owner (host, pid, and a token that tells the process
from an earlier one with the same pid) and a heartbeat, which the owner renews
every HEARTBEAT_SECONDS (trainer/sweeps/runner.py). A running trial is an orphan
when it has no owner (it was interrupted: its process let it go), when its owner
on this host no longer runs, or when its owner on another machine has sent no
heartbeat for STALE_SECONDS (trainer/sweeps/study.py puts orphans back in the
queue).
"""

import os
import socket
import time
import uuid

from trainer.sweeps.search import load_optuna

HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 120.0  # A trial of another machine without a heartbeat this long.


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class Owner:
  """This sweep process, as the owner of the trials it claims."""

  def __init__(self):
    # The token tells this process from an earlier one with the same pid.
    self.record = {"host": socket.gethostname(), "pid": os.getpid(),
                   "token": uuid.uuid4().hex}

  def owns(self, frozen) -> bool:
    """Whether a claimed trial, as the storage holds it now (a FrozenTrial), is
    still this process's: running, and not taken over by another sweep process
    (for an orphan) since."""
    return (frozen.state == load_optuna().trial.TrialState.RUNNING and
            frozen.user_attrs.get("owner") == self.record)

  def orphaned(self, trial) -> bool:
    """Whether a running trial's sweep process is gone (or it has no owner: it
    was interrupted)."""
    owner = trial.user_attrs.get("owner")
    if not owner:  # Interrupted: its process let it go.
      return True
    if owner.get("host") == self.record["host"]:
      return owner.get("pid") != self.record["pid"] and not _pid_alive(owner["pid"])
    beat = trial.user_attrs.get("heartbeat", 0.0)
    return time.time() - beat > STALE_SECONDS
