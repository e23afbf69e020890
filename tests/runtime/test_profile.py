"""tofu_tf.runtime.profile: a partitioned step's time by device and kind, and its Chrome trace."""

from tofu_tf.api import optimize
from tofu_tf.models import build
from tofu_tf.runtime.profile import StepProfile, node_kind, step_stats, trace_devices, write_chrome_trace
from tofu_tf.runtime.session import Runner, SingleDevice


def test_profile_and_trace_name_every_device(tmp_path):
    step = build("mlp", optimizer="sgd", graph_only=True, batch_size=8)
    feeds = dict(zip(step.feeds, step.sample_batch(0)))
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        values = single.values()
        whole = StepProfile.of(step_stats(single.session, step.fetches, feeds)[0])
    assert len(whole.devices) == 1 and whole.totals()["rewrite"] == 0
    assert whole.totals()["op"] > 0
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=4)
    with Runner(optimized, values) as runner:
        stats, wall = step_stats(runner.session, optimized.fetches, feeds)
    profile = StepProfile.of(stats, optimized.op_nodes)
    assert [d.device for d in profile.devices] == [f"CPU:{i}" for i in range(4)]
    assert all(d.kernel_seconds.get("op", 0) > 0 for d in profile.devices)
    totals = profile.totals()
    assert totals["rewrite"] > 0 and totals["idle"] >= 0 and totals["executor"] >= 0
    assert 0 < profile.wall_seconds <= wall
    assert len(profile.bars()) == 4 and str(profile).startswith("step ")
    path = write_chrome_trace(stats, tmp_path / "step.trace.json.gz")
    shown = trace_devices(path)
    on_device = [{n for n in names if n in optimized.op_nodes} for names in
                 (next(v for k, v in shown.items() if k.endswith(f"CPU:{i} Compute"))
                  for i in range(4))]
    assert all(on_device), shown.keys()


def test_node_kinds():
    ops = frozenset({"MatMul/tofu_1"})
    assert node_kind("MatMul/tofu_1", "MatMul", ops) == "op"
    assert node_kind("slice_3", "Slice", ops) == "rewrite"
    assert node_kind("x/recv", "_Recv", ops) == "transfer"
    assert node_kind("ints_2", "Const", ops) == "source"
    assert node_kind("anything", "Conv2D", None) == "op"
