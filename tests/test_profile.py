"""trainer.outputs.profile: a trace's ops attributed to the parts of a step."""

import pytest
from google.protobuf.message import DecodeError
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from trainer.outputs import profile


@pytest.mark.parametrize("event, part", [
    ("while/body/_1/while/replica_1/step_input/GatherV2:GatherV2", "input"),
    ("while/body/_1/while/step_input/IteratorGetNext:IteratorGetNext", "input"),
    ("while/body/_1/gradient_tape/while/replica_1/step_forward_backward/cnn_1/"
     "conv2d_1/convolution/Conv2DBackpropFilter:_MklNativeConv2DBackpropFilter",
     "forward_backward"),
    ("while/body/_1/while/step_all_reduce/AddN_2:AddN", "all_reduce"),
    ("while/body/_1/while/step_optimizer/adam/update_0_2/Sub_2:Sub", "optimizer"),
    # A copy between devices is a copy, whichever part asked for it.
    ("while/body/_1/while/step_optimizer/adam/IdentityN/_71:_Send", "copies"),
    ("while/LoopCond/_80/_19:_Recv", "copies"),
    ("while/body/_1/while/global_norm/L2Loss_2:L2Loss", "bookkeeping"),
    # A model layer named like a part, inside another part: the outer part.
    ("while/body/_1/while/step_forward_backward/my_step_input/MatMul:MatMul",
     "forward_backward"),
    ("while/step_forward_backward/cnn/step_input/MatMul:MatMul", "forward_backward"),
])
def test_ops_are_attributed_by_name_scope(event, part):
  assert profile.categorize(event) == part


def _trace(path, *, calls, compute=(), data=()):
  """Writes an XSpace: `calls` (start_us, duration_us) of train_loop on the main
  thread, `compute` and `data` events (name, start_us, duration_us) on an executor
  thread and a tf.data thread."""
  space = xplane_pb2.XSpace()
  plane = space.planes.add(name="/host:CPU")
  names = {}

  def add_line(line_name, events):
    line = plane.lines.add(name=line_name, timestamp_ns=1000)
    for name, start_us, duration_us in events:
      if name not in names:
        names[name] = len(names) + 1
        plane.event_metadata[names[name]].name = name
        plane.event_metadata[names[name]].id = names[name]
      line.events.add(metadata_id=names[name], offset_ps=start_us * 10**6,
                      duration_ps=duration_us * 10**6)

  add_line("main.py", [("train_loop", start, duration) for start, duration in calls])
  add_line("tf_Compute/1", compute)
  add_line("tf_data_private_threadpool/3", data)
  path.write_bytes(space.SerializeToString())
  return str(path)


def test_step_breakdown_sums_self_times_inside_loop_calls_per_step(tmp_path):
  trace = _trace(tmp_path / "t.xplane.pb", calls=[(0, 4000), (5000, 4000)], compute=[
      ("ExecutorState::Process", 100, 3000),
      ("step_forward_backward/MatMul:MatMul", 100, 1000),
      ("step_optimizer/adam/Sub:Sub", 2000, 400),
      ("step_input/GatherV2:GatherV2", 2600, 200),
      ("write_summary:WriteSummary", 4100, 800),  # Between calls: not a step's.
      ("ExecutorState::Process", 5100, 2000),
      ("replica_1/step_forward_backward/Relu:Relu", 5100, 600),
      # A _Send that runs the receiving side's op inline: 200 of its own.
      ("x/_5:_Send", 6000, 500),
      ("replica_1/step_optimizer/adam/Mul:Mul", 6100, 300),
      ("global_norm/Sum:Sum", 6600, 100),
      ("cluster_0/end: fusion.2", 7200, 50),  # An XLA event, not an op.
  ], data=[
      ("ExecutorState::Process", 1000, 500),  # tf.data's, not the step's executor.
      ("GatherV2:GatherV2", 1000, 100),  # A pipeline function's op: input.
      ("Iterator::Root::Prefetch", 1600, 300),  # tf.data's span, not an op.
  ])
  breakdown = profile.step_breakdown(trace, steps=4)
  assert breakdown["loop_calls"] == 2
  assert breakdown["wall_ms_per_step"] == 2.0  # 8 ms in train_loop, 4 steps.
  assert breakdown["op_ms_per_step"] == {
      "input": 0.075, "forward_backward": 0.4, "all_reduce": 0.0,
      "optimizer": 0.175, "copies": 0.05, "bookkeeping": 0.025}
  assert breakdown["op_share"]["forward_backward"] == 0.5517  # 1.6 of 2.9 ms.
  # The step executor's spans less their direct children: 1.4 + 0.8 ms, 4 steps.
  assert breakdown["executor_ms_per_step"] == 0.55
  assert breakdown["other_ms_per_step"] == 0.0125  # The XLA event: 50 us.
  assert breakdown["host_ms_between_calls"] == 1.0  # From 4 ms to 5 ms.
  line = profile.describe(breakdown)
  assert line.startswith("profile of 4 steps: 2.000 ms per step in train_loop;")
  assert "forward_backward 0.400" in line and "executor dispatch 0.550;" in line
  assert line.endswith("; host between calls 1.000 ms")


def test_a_corrupt_trace_raises(tmp_path):
  path = tmp_path / "t.xplane.pb"
  path.write_bytes(b"\xff" * 64)
  with pytest.raises(DecodeError):
    profile.step_breakdown(str(path), steps=1)


def test_a_trace_without_a_train_loop_call_is_an_error(tmp_path):
  trace = _trace(tmp_path / "t.xplane.pb", calls=[], compute=[("a/b:MatMul", 0, 5)])
  with pytest.raises(ValueError, match="no train_loop call in the trace"):
    profile.step_breakdown(trace, steps=1)
  with pytest.raises(ValueError, match="steps=0: must be >= 1"):
    profile.step_breakdown(trace, steps=0)
