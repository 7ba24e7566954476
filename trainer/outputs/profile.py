"""Where a train step's time goes, read from a TensorFlow profiler trace.

The train loop names its parts with `tf.name_scope` (PARTS below); every op the
trace records inside a `train_loop` call is attributed to the outermost part its
name contains, to "copies" if it hands a tensor between devices (_Send/_Recv),
and to "bookkeeping" otherwise: the batch assertion, the ledger and metric sums,
the gradient norm, the step counter and the loop's control flow. Ops on tf.data's
own threads (a distributed iterator's pipeline functions) are "input". Times are
self times: an event's time less the events nested in it on its thread (a _Send
may run the receiving side's ops inline), so nothing is counted twice.

Only ops the host's executor runs are seen (the host planes of the trace): on a
GPU, kernels run on the device planes, which TensorBoard's Profile tab shows. Under
--jit_compile the compiled forward and backward pass runs as XLA's own events, not
ops: it is in "other", not in forward_backward.

Op time is summed over threads: the replicas of a split CPU run their ops side by
side, so the parts can add up to more than the wall time of a step.

  >>> breakdown = step_breakdown("MODEL_DIR/train/plugins/profile/RUN/HOST.xplane.pb",
  ...                            steps=40)  # doctest: +SKIP
  >>> breakdown["op_ms_per_step"]["forward_backward"]  # doctest: +SKIP
  2.41
"""

import bisect
import glob
import os
import statistics

# Name scopes of a train step (trainer.training.train_loop), in the order they run.
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
STEP_MARKER = "train"  # The profiler's step marker around each loop call.
# Host work between loop calls that is not the loop's: traced under these names
# (by the Evaluate and Checkpoint actions), timed apart.
HOST_WORK = ("evaluation", "checkpoint")
EXECUTOR = "ExecutorState::"  # The executor's own spans (Process, ProcessAsync).


def categorize(op_event_name: str) -> str:
  """The part of a step an op belongs to, from its trace event name
  ("while/body/_1/while/replica_1/step_input/GatherV2:GatherV2")."""
  name, _, op_type = op_event_name.rpartition(":")
  if op_type.lstrip("_").startswith(("Send", "Recv", "HostSend", "HostRecv")):
    return COPIES
  for component in (name or op_type).split("/"):  # The outermost scope decides.
    if component in PARTS:
      return PARTS[component]
  return BOOKKEEPING


def is_op(event_name: str) -> bool:
  """Whether a trace event is an op ("name:Type"; not "Iterator::Map" or an
  XLA cluster's "end: fusion.2")."""
  return event_name.count(":") == 1 and " " not in event_name


def latest_trace(log_dir: str):
  """The newest `*.xplane.pb` under LOG_DIR/plugins/profile, or None."""
  paths = glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb"))
  return max(paths, key=os.path.getmtime) if paths else None


def _self_times(plane):
  """(name, start_ps, self_ps, line name) of every event of an XPlane, where
  self_ps is its duration less that of the events directly nested in it."""
  names = {key: meta.name for key, meta in plane.event_metadata.items()}
  for line in plane.lines:
    base = line.timestamp_ns * 1000
    events = sorted((base + e.offset_ps, -e.duration_ps, names.get(e.metadata_id, ""))
                    for e in line.events)  # Outer events first at a tie.
    open_events = []  # [end, self time, name, start] of enclosing events.
    for start, negative_duration, name in events:
      while open_events and open_events[-1][0] <= start:
        end, own, outer_name, outer_start = open_events.pop()
        yield outer_name, outer_start, own, line.name
      if open_events:
        open_events[-1][1] += negative_duration  # The parent's self time shrinks.
      open_events.append([start - negative_duration, -negative_duration, name, start])
    while open_events:
      end, own, outer_name, outer_start = open_events.pop()
      yield outer_name, outer_start, own, line.name


def _sum_self_times(host, in_a_call) -> tuple:
  """({category: op time}, {category: op count}, executor time, other time) of the
  events on the host's executor and tf.data threads inside loop calls."""
  op_ps = dict.fromkeys(CATEGORIES, 0)
  op_counts = dict.fromkeys(CATEGORIES, 0)
  executor_ps = other_ps = 0
  for plane in host:
    for name, start, own, line in _self_times(plane):
      if not line.startswith("tf_") or not in_a_call(start):
        continue
      if line.startswith("tf_data"):  # tf.data's threads: its pipeline's ops.
        if is_op(name):
          op_ps[INPUT_PART] += own
          op_counts[INPUT_PART] += 1
      elif is_op(name):
        op_ps[categorize(name)] += own
        op_counts[categorize(name)] += 1
      elif name.startswith(EXECUTOR):
        executor_ps += own
      else:
        other_ps += own
  return op_ps, op_counts, executor_ps, other_ps


def _events(planes, names) -> list:
  """(start ps, duration ps) of every event named one of `names`, in time order."""
  return sorted((line.timestamp_ns * 1000 + e.offset_ps, e.duration_ps)
                for plane in planes for line in plane.lines for e in line.events
                if plane.event_metadata[e.metadata_id].name in names)


def _gaps_between(calls, host_work):
  """The gaps between consecutive calls in which no `host_work` event started
  (the host's own time between calls), and the summed length of the others (an
  evaluation or a checkpoint ran there)."""
  gaps, apart = [], 0
  for a, b in zip(calls, calls[1:]):
    gap_start, gap_end = a[0] + a[1], b[0]
    if any(gap_start <= start < gap_end for start, _ in host_work):
      apart += gap_end - gap_start
    else:
      gaps.append(gap_end - gap_start)
  return gaps, apart


def step_breakdown(trace_path: str, *, steps: int) -> dict:
  """Per-step times of the train loop calls recorded in an XPlane trace.

  Args:
    trace_path: a `.xplane.pb` file written by the TensorFlow profiler.
    steps: the train steps those loop calls ran.

  Returns:
    {"steps", "loop_calls", "wall_ms_per_step" (time inside train_loop calls),
    "op_ms_per_step": {category: ms}, "op_share": {category: fraction of op time},
    "ops_per_step": {category: ops run per step},
    "executor_ms_per_step" (the executor's own time around the ops: dispatch),
    "other_ms_per_step" (the rest of the executor threads' time: under
    --jit_compile, XLA's compiled forward and backward pass),
    "host_ms_between_calls" (median time from the end of a call to the start of
    the next: host work; None for a single call), "host_ms_evaluation_and_
    checkpoint" (the gaps in which an evaluation or a checkpoint ran, in all:
    not in the median)}.

  Raises:
    ValueError: the trace holds no train_loop call, or `steps` < 1.
    OSError, google.protobuf.message.DecodeError: the file cannot be read.
  """
  from tensorflow.tsl.profiler.protobuf import xplane_pb2
  if steps < 1:
    raise ValueError(f"steps={steps}: must be >= 1")
  space = xplane_pb2.XSpace()
  with open(trace_path, "rb") as f:
    space.ParseFromString(f.read())
  host = [p for p in space.planes if p.name.startswith("/host:")]
  calls = _events(host, {LOOP_FUNCTION})
  if not calls:
    raise ValueError(f"{trace_path}: no {LOOP_FUNCTION} call in the trace")
  call_starts = [start for start, _ in calls]

  def in_a_call(time_ps):
    i = bisect.bisect_right(call_starts, time_ps) - 1
    return i >= 0 and time_ps < calls[i][0] + calls[i][1]

  op_ps, op_counts, executor_ps, other_ps = _sum_self_times(host, in_a_call)
  total = sum(op_ps.values()) or 1
  per_step_ms = lambda ps: round(ps / 1e9 / steps, 4)
  gaps, apart = _gaps_between(calls, _events(host, HOST_WORK))
  return {"steps": steps, "loop_calls": len(calls),
          "wall_ms_per_step": per_step_ms(sum(d for _, d in calls)),
          "op_ms_per_step": {k: per_step_ms(v) for k, v in op_ps.items()},
          "op_share": {k: round(v / total, 4) for k, v in op_ps.items()},
          # Ops run per step: a part's ops may take less than the times' 0.1 us.
          "ops_per_step": {k: round(v / steps, 2) for k, v in op_counts.items()},
          "executor_ms_per_step": per_step_ms(executor_ps),
          "other_ms_per_step": per_step_ms(other_ps),
          "host_ms_between_calls": (round(statistics.median(gaps) / 1e9, 4)
                                    if gaps else None),
          "host_ms_evaluation_and_checkpoint": round(apart / 1e9, 4)}


def describe(breakdown: dict) -> str:
  """One line: "profile of 40 steps: 1.21 ms per step; op time per step: ..."."""
  parts = ", ".join(f"{k} {v:.3f}" for k, v in breakdown["op_ms_per_step"].items())
  return (f"profile of {breakdown['steps']} steps: {breakdown['wall_ms_per_step']:.3f} "
          f"ms per step in {LOOP_FUNCTION}; op time per step (ms, summed over "
          f"threads): {parts}; executor dispatch "
          f"{breakdown['executor_ms_per_step']:.3f}; other "
          f"{breakdown['other_ms_per_step']:.3f}" + (
              "" if breakdown["host_ms_between_calls"] is None else
              f"; host between calls {breakdown['host_ms_between_calls']:.3f} ms")
          + ("" if not breakdown.get("host_ms_evaluation_and_checkpoint") else
             f" (evaluations and checkpoints apart: "
             f"{breakdown['host_ms_evaluation_and_checkpoint']:.1f} ms)"))
