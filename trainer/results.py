"""MODEL_DIR/results.json: what a run did, written by the chief at every exit."""

import os
import platform
import resource
import time

import psutil
import tensorflow as tf

from trainer import run_dir


def peak_rss_mib() -> float:
  """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def seconds_since_process_start() -> float:
  return time.time() - psutil.Process().create_time()


class Results:
  """Accumulates a run's numbers; `finish` writes them (on the chief)."""

  def __init__(self, config, state):
    self._config = config
    self._state = state
    self._path = os.path.join(config.model_dir, run_dir.RESULTS_FILE)
    previous = run_dir.read_json(self._path) or {}
    self.calls = 0
    self._timed_steps, self._timed_seconds = 0, 0.0
    self.eval_step = None
    self.data = {
        "num_replicas": state.num_replicas,
        "num_workers": state.strategy.extended._num_workers  # pylint: disable=protected-access
        if hasattr(state.strategy.extended, "_num_workers") else 1,
        "per_replica_batch_size": config.per_replica_batch_size,
        "global_batch_size": state.global_batch_size,
        "train_steps": config.train_steps,
        "model_dir": config.model_dir,
        "devices": list(state.strategy.extended.worker_devices),
        "tf_version": tf.__version__,
        "python_version": platform.python_version(),
        "best_eval": previous.get("best_eval"),
    }

  def record_train_call(self, *, step, steps, seconds, loss, accuracy, ledger):
    """Records one loop call (the first, which traces, is left out of the speed)."""
    self.calls += 1
    if self.calls == 1:
      self.data["time_to_first_step_s"] = round(seconds_since_process_start(), 3)
    else:
      self._timed_steps += steps
      self._timed_seconds += seconds
    self.data["train"] = {"loss": loss, "accuracy": accuracy, "step": step}
    self.data["replica_batches"] = {f"replica_{i}": int(n) for i, n in enumerate(ledger)}

  def record_eval(self, step, metrics):
    self.eval_step = step
    self.data["eval"] = dict(metrics, step=step)
    best = self.data.get("best_eval")
    if best is None or metrics["accuracy"] > best["accuracy"]:
      self.data["best_eval"] = dict(metrics, step=step)

  def finish(self, status: str) -> dict:
    """Completes the record with `status` and writes results.json (chief only)."""
    state = self._state
    self.data["status"] = status
    self.data["global_step"] = state.step
    examples = state.train_ledger.read()[1]
    self.data["replica_examples"] = {f"replica_{i}": int(n)
                                     for i, n in enumerate(examples)}
    if self._timed_seconds:
      self.data["steps_per_second"] = self._timed_steps / self._timed_seconds
      self.data["examples_per_second"] = (self.data["steps_per_second"] *
                                          state.global_batch_size)
    self.data["peak_rss_mib"] = round(peak_rss_mib(), 1)
    if state.is_chief:
      run_dir.write_json(self._path, self.data)
    return self.data
