"""A worker's own failure told to its peers, and a peer's told in one line
(trainer.training.peers): what is reported, how a peer's abort reads, and what
results.json records. Two real workers: tests/test_multi_worker.py."""

import pytest
import tensorflow as tf

from trainer.errors import ConfigError, DivergedError, UserCodeError
from trainer.training import peers


def test_a_peers_failure_is_one_line_naming_it_and_what_it_said():
  own = "/job:worker/replica:0/task:0/device:CPU:0"  # This worker's op, named first.
  reported = tf.errors.AbortedError(None, None, (
      f"{{{{function_node __wrapped__CollectiveBcastSend_device_{own}}}}} Collective "
      "ops is aborted by: Error reported from /job:worker/task:1: Task.prepare "
      "raised ValueError: bad shard\nThe error could be from a previous "
      "operation. [Op:CollectiveBcastSend]"))
  assert peers.peer_failure(reported) == (
      "worker 1 failed: Task.prepare raised ValueError: bad shard")
  # Met inside a task method (the variables' broadcast in Task.build_model): the
  # peer's, not the method's.
  in_method = UserCodeError("Task.build_model", reported)
  in_method.__cause__ = reported  # As errors.user_code raises it.
  assert peers.peer_failure(in_method) == (
      "worker 1 failed: Task.prepare raised ValueError: bad shard")
  lost = tf.errors.UnavailableError(None, None, (
      f"{own} Collective ops is aborted by: Error reported from /job:worker/task:1:"
      " The following tasks are unhealthy (stopped sending heartbeats):\n"
      "/job:worker/replica:0/task:1\nThe tasks have crashed."))
  assert peers.peer_failure(lost) == (
      "worker 1 stopped sending heartbeats (it crashed, was killed or was lost)")
  assert peers.peer_failure(ValueError("Error reported from x")) is None
  assert peers.peer_failure(tf.errors.UnavailableError(None, None, "timed out")) is None


def test_only_a_failure_a_worker_can_meet_alone_is_told_to_the_peers(monkeypatch):
  told = []
  monkeypatch.setattr(peers, "tell_peers", told.append)
  errors = {"own flag": ConfigError("--flag: bad"),
            "a bug": IndexError("list index out of range"),
            "every worker's": DivergedError("loss is nan at step 4"),
            "a collective's": tf.errors.UnavailableError(None, None, "Socket closed"),
            "a peer's": tf.errors.AbortedError(None, None, "Error reported from "
                                               "/job:worker/task:1: x")}
  for error in errors.values():
    # As it was, or (a peer's) as a PeerFailedError.
    with pytest.raises((type(error), peers.PeerFailedError)):
      with peers.failures_shared():
        raise error
  assert told == [errors["own flag"], errors["a bug"]]


def test_a_run_ended_by_a_peer_is_hung_at_its_last_completed_step():
  from trainer.training import run

  class Results:
    def finish(self, status, *, step=None):
      finished.append((str(status), step))

  class Watchdog:
    last_completed_step = 40

  finished = []
  peer = tf.errors.AbortedError(None, None, "Error reported from "
                                "/job:worker/task:1: x")
  for error in (None, DivergedError("nan"), peer,
                UserCodeError("MyAction", ValueError("no"))):
    run._record_failure(Results(), error, Watchdog())
  # Not the global step: a loop call aborted halfway may have counted more.
  assert finished == [("hung", 40), ("failed", None)]


def test_outside_a_cluster_failures_pass_through_as_they_are():
  with pytest.raises(ConfigError, match="^--flag: bad$"):
    with peers.failures_shared():
      raise ConfigError("--flag: bad")
  with pytest.raises(peers.PeerFailedError, match="^worker 1 failed: x; this "):
    with peers.failures_shared():
      raise tf.errors.AbortedError(None, None, "Error reported from "
                                   "/job:worker/task:1: x")
