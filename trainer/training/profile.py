"""Where a train step's time goes, read from a TensorFlow profiler trace.

The train loop names its parts with `tf.name_scope` (PARTS below); every op the
trace records inside a `train_loop` call is attributed to the first part its name
contains, to "copies" if it moves a tensor between devices (_Send/_Recv), and to
"bookkeeping" otherwise: the batch assertion, the ledger and metric sums, the
gradient norm, the step counter and the loop's control flow. Ops on tf.data's own
threads (a distributed iterator's pipeline functions) are "input".

Op time is summed over threads: the replicas of a split CPU run their ops side by
side, so the parts can add up to more than the wall time of a step.

  >>> breakdown = step_breakdown("MODEL_DIR/train/plugins/profile/RUN/HOST.xplane.pb",
  ...                            steps=40)  # doctest: +SKIP
  >>> breakdown["op_ms_per_step"]["forward_backward"]  # doctest: +SKIP
  2.41
"""

import glob
import os
import statistics

# Name scopes of a train step (trainer.training.steps), in the order they run.
INPUT = "step_input"
FORWARD_BACKWARD = "step_forward_backward"
ALL_REDUCE = "step_all_reduce"
OPTIMIZER = "step_optimizer"
PARTS = {INPUT: "input", FORWARD_BACKWARD: "forward_backward",
         ALL_REDUCE: "all_reduce", OPTIMIZER: "optimizer"}
INPUT_PART = PARTS[INPUT]
COPIES, BOOKKEEPING = "copies", "bookkeeping"
CATEGORIES = tuple(PARTS.values()) + (COPIES, BOOKKEEPING)
LOOP_FUNCTION = "train_loop"  # The tf.function whose calls the trace times.
EXECUTOR = "ExecutorState::Process"  # The executor's span around the ops it runs.


def categorize(op_event_name: str) -> str:
  """The part of a step an op belongs to, from its trace event name
  ("while/body/_1/while/replica_1/step_input/GatherV2:GatherV2")."""
  name, _, op_type = op_event_name.rpartition(":")
  if op_type.lstrip("_").startswith(("Send", "Recv", "HostSend", "HostRecv")):
    return COPIES
  components = (name or op_type).split("/")
  for scope, part in PARTS.items():
    if scope in components:
      return part
  return BOOKKEEPING


def latest_trace(log_dir: str):
  """The newest `*.xplane.pb` under LOG_DIR/plugins/profile, or None."""
  paths = glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb"))
  return max(paths, key=os.path.getmtime) if paths else None


def _events(plane):
  """(name, start_ps, duration_ps, line name) of every event of an XPlane."""
  names = {key: meta.name for key, meta in plane.event_metadata.items()}
  for line in plane.lines:
    for event in line.events:
      yield (names.get(event.metadata_id, ""),
             line.timestamp_ns * 1000 + event.offset_ps, event.duration_ps, line.name)


def step_breakdown(trace_path: str, *, steps: int) -> dict:
  """Per-step times of the train loop calls recorded in an XPlane trace.

  Args:
    trace_path: a `.xplane.pb` file written by the TensorFlow profiler.
    steps: the train steps those loop calls ran.

  Returns:
    {"steps", "loop_calls", "wall_ms_per_step" (time inside train_loop calls),
    "op_ms_per_step": {category: ms}, "op_share": {category: fraction of op time},
    "executor_ms_per_step" (the executor's time around the ops: dispatch),
    "host_ms_between_calls" (median time from the end of a call to the start of
    the next: host work; None for a single call)}.

  Raises:
    ValueError: the trace holds no train_loop call, or `steps` < 1.
  """
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  if steps < 1:
    raise ValueError(f"steps={steps}: must be >= 1")
  space = xplane_pb2.XSpace()
  with open(trace_path, "rb") as f:
    space.ParseFromString(f.read())
  host = [p for p in space.planes if p.name.startswith("/host:")]
  events = [e for plane in host for e in _events(plane)]
  calls = [(start, start + duration) for name, start, duration, _ in events
           if name == LOOP_FUNCTION]
  if not calls:
    raise ValueError(f"{trace_path}: no {LOOP_FUNCTION} call in the trace")
  op_ps = dict.fromkeys(CATEGORIES, 0)
  executor_ps = executed_ps = 0  # The executor's spans, and its ops' time in them.
  for name, start, duration, line in events:
    if not line.startswith("tf_") or not any(a <= start < b for a, b in calls):
      continue
    if name == EXECUTOR:
      executor_ps += duration
    elif name.count(":") == 1:  # An op: "name:Type" ("Iterator::Map" is not).
      if line.startswith("tf_data"):  # tf.data's threads run only input ops.
        op_ps[INPUT_PART] += duration
      else:
        op_ps[categorize(name)] += duration
        executed_ps += duration
  total = sum(op_ps.values()) or 1
  per_step_ms = lambda ps: round(ps / 1e9 / steps, 4)
  calls.sort()
  gaps = [b[0] - a[1] for a, b in zip(calls, calls[1:])]
  return {"steps": steps, "loop_calls": len(calls),
          "wall_ms_per_step": per_step_ms(sum(b - a for a, b in calls)),
          "op_ms_per_step": {k: per_step_ms(v) for k, v in op_ps.items()},
          "op_share": {k: round(v / total, 4) for k, v in op_ps.items()},
          # What the executor spends around the ops (dispatch, scheduling).
          "executor_ms_per_step": per_step_ms(max(executor_ps - executed_ps, 0)),
          # The host's work after a call (reading its outputs, actions), median.
          "host_ms_between_calls": (round(statistics.median(gaps) / 1e9, 4)
                                    if gaps else None)}


def describe(breakdown: dict) -> str:
  """One line: "profile of 40 steps: 1.21 ms per step; op time per step: ..."."""
  parts = ", ".join(f"{k} {v:.3f}" for k, v in breakdown["op_ms_per_step"].items())
  return (f"profile of {breakdown['steps']} steps: {breakdown['wall_ms_per_step']:.3f} "
          f"ms per step in {LOOP_FUNCTION}; op time per step (ms, summed over "
          f"threads): {parts}; executor dispatch "
          f"{breakdown['executor_ms_per_step']:.3f}" + (
              "" if breakdown["host_ms_between_calls"] is None else
              f"; host between calls {breakdown['host_ms_between_calls']:.3f} ms"))
