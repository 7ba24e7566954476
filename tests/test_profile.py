"""trainer.training.profile: a trace's ops attributed to the parts of a step."""

import pytest
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from trainer.training import profile


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
    # A model layer merely named like a part is not that part.
    ("while/body/_1/while/step_forward_backward/my_step_input/MatMul:MatMul",
     "forward_backward"),
])
def test_ops_are_attributed_by_name_scope(event, part):
  assert profile.categorize(event) == part


def _trace(path, *, calls, ops, executor=(), data_ops=()):
  """Writes an XSpace: `calls` (start_us, duration_us) of train_loop on the main
  thread, `ops` (name, start_us, duration_us) on an executor thread, `data_ops`
  on a tf.data thread."""
  space = xplane_pb2.XSpace()
  plane = space.planes.add(name="/host:CPU")
  names = {}

  def add(line, name, start_us, duration_us):
    if name not in names:
      names[name] = len(names) + 1
      plane.event_metadata[names[name]].name = name
      plane.event_metadata[names[name]].id = names[name]
    line.events.add(metadata_id=names[name], offset_ps=start_us * 10**6,
                    duration_ps=duration_us * 10**6)

  main = plane.lines.add(name="main.py", timestamp_ns=1000)
  for start, duration in calls:
    add(main, "train_loop", start, duration)
  executor_line = plane.lines.add(name="tf_Compute/1", timestamp_ns=1000)
  for name, start, duration in ops:
    add(executor_line, name, start, duration)
  for start, duration in executor:
    add(executor_line, "ExecutorState::Process", start, duration)
  data_line = plane.lines.add(name="tf_data_private_threadpool/3", timestamp_ns=1000)
  for name, start, duration in data_ops:
    add(data_line, name, start, duration)
  path.write_bytes(space.SerializeToString())
  return str(path)


def test_step_breakdown_sums_ops_inside_loop_calls_per_step(tmp_path):
  trace = _trace(tmp_path / "t.xplane.pb", calls=[(0, 4000), (5000, 4000)], ops=[
      ("step_forward_backward/MatMul:MatMul", 100, 1000),
      ("replica_1/step_forward_backward/Relu:Relu", 5100, 600),
      ("step_optimizer/adam/Sub:Sub", 2000, 400),
      ("step_input/GatherV2:GatherV2", 3000, 200),
      ("x/_5:_Send", 6000, 100),
      ("global_norm/Sum:Sum", 7000, 100),
      ("write_summary:WriteSummary", 4500, 999),  # Between calls: not a step's.
  ], executor=[(100, 3000), (5100, 2000)], data_ops=[
      ("GatherV2:GatherV2", 1000, 100),  # A pipeline function's op: input.
      ("Iterator::Root::Prefetch", 1000, 3000),  # tf.data's span, not an op.
  ])
  breakdown = profile.step_breakdown(trace, steps=4)
  assert breakdown["loop_calls"] == 2
  assert breakdown["wall_ms_per_step"] == 2.0  # 8 ms in train_loop, 4 steps.
  assert breakdown["op_ms_per_step"] == {
      "input": 0.075, "forward_backward": 0.4, "all_reduce": 0.0, "optimizer": 0.1,
      "copies": 0.025, "bookkeeping": 0.025}
  assert breakdown["op_share"]["forward_backward"] == 0.64  # 1.6 of 2.5 ms.
  # The executor's 5 ms around 2.4 ms of ops inside the calls: 2.6 ms / 4 steps.
  assert breakdown["executor_ms_per_step"] == 0.65
  assert breakdown["host_ms_between_calls"] == 1.0  # From 4 ms to 5 ms.
  line = profile.describe(breakdown)
  assert line.startswith("profile of 4 steps: 2.000 ms per step in train_loop;")
  assert "forward_backward 0.400" in line and "executor dispatch 0.650" in line
  assert line.endswith("; host between calls 1.000 ms")


def test_a_trace_without_a_train_loop_call_is_an_error(tmp_path):
  trace = _trace(tmp_path / "t.xplane.pb", calls=[], ops=[("a/b:MatMul", 0, 5)])
  with pytest.raises(ValueError, match="no train_loop call in the trace"):
    profile.step_breakdown(trace, steps=1)
  with pytest.raises(ValueError, match="steps=0: must be >= 1"):
    profile.step_breakdown(trace, steps=0)
