"""The emitted order: each device's ops chained in the order the estimate assumes."""

from __future__ import annotations

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tofu_tf.api import optimize
from tofu_tf.models import build
from tofu_tf.options import Options
from tofu_tf.rewrite.memory import estimate
from tofu_tf.rewrite.schedule import UNCHAINED, execution_order, sequence_devices


def _graph_def(build_fn) -> graph_pb2.GraphDef:
    graph = tf.Graph()
    with graph.as_default():
        build_fn()
    return graph.as_graph_def()


def test_execution_order_keeps_a_topological_graph_order_and_runs_only_what_is_fetched():
    def body():
        a = tf.constant(1.0, name="a")
        b = tf.add(a, a, name="b")
        tf.multiply(a, 3.0, name="unused")
        tf.negative(b, name="c")
    graph_def = _graph_def(body)
    names = [graph_def.node[i].name for i in execution_order(graph_def, ["c"])]
    assert names == ["a", "b", "c"]
    assert len(execution_order(graph_def)) == len(graph_def.node)


def test_a_constant_placed_after_its_reader_does_not_hold_the_reader_back():
    """The executor starts every node without inputs at once; a constant the emitter made
    for a late node and reused for an early one must not delay the early one, and with it
    everything after it (which would let unrelated late nodes run first: their buffers
    then stay live across the peak)."""
    graph_def = graph_pb2.GraphDef()
    for name, op, inputs in [("x", "Placeholder", []), ("early", "Slice", ["x", "k"]),
                             ("after_early", "Neg", ["early"]),
                             ("late", "Neg", ["x"]), ("k", "Const", [])]:
        node = graph_def.node.add(name=name, op=op)
        node.input.extend(inputs)
    names = [graph_def.node[i].name for i in execution_order(graph_def, ["after_early",
                                                                        "late"])]
    assert names == ["x", "k", "early", "after_early", "late"]


@pytest.mark.parametrize("model", ["mlp", "lstm", "transformer"])
def test_the_plans_estimate_is_the_emitted_steps_under_the_lookaheads_plan(model):
    """The plan's estimate (search/memory.py, the planner graph's order) and the emitted
    step's (its execution order) agree for plans whose emitted graph reuses a constant
    made for a late node in an early one (the lookahead's LSTM plan at 8: the early node
    waited for it, the Adam updates ran ahead and held their buffers across the peak)."""
    step = build(model, optimizer="adam", graph_only=True, batch_size=8,
                 layer_functions=False)
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                         num_devices=8, options=Options(lookahead=True))
    largest = max(m.peak_bytes for m in
                  estimate(optimized.graph_def, optimized.fetches).values())
    assert abs(optimized.plan.peak_bytes - largest) <= 0.15 * largest, (
        optimized.plan.peak_bytes, largest)


def test_sequence_devices_chains_each_device_in_execution_order():
    step = build("mlp", optimizer="adam", graph_only=True, batch_size=8)
    free = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=4,
                    options=Options(sequential=False))
    chained = sequence_devices(free.graph_def, free.fetches)
    order = execution_order(chained, free.fetches)
    by_name = {node.name: node for node in chained.node}
    previous: dict[str, str] = {}
    chained_nodes = 0
    for i in order:
        node = chained.node[i]
        if node.op in UNCHAINED:
            continue
        before = previous.get(node.device)
        if before is not None:
            inputs = {name.lstrip("^").split(":")[0] for name in node.input}
            assert before in inputs, (node.name, before)
            chained_nodes += 1
        previous[node.device] = node.name
    assert chained_nodes > 100 and len(previous) == 4
    # The chain follows the order the estimate uses: the estimate does not change.
    assert estimate(chained, free.fetches) == estimate(free.graph_def, free.fetches)
    # And the emitter's default graph is this chained graph.
    emitted = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=4,
                       plan=free.plan)
    assert emitted.graph_def == chained
    assert all(by_name[n.name].device == n.device for n in emitted.graph_def.node)


def test_merge_barriers_separate_the_pairs_onednn_merges_on_cpus_only():
    from tofu_tf.rewrite.schedule import merge_barriers
    names = ["x", "w", "conv", "other", "bias", "dy", "dw", "db", "pad", "conv2"]
    ops = ["Placeholder", "Placeholder", "Conv2D", "Relu", "BiasAdd", "Placeholder",
           "Conv2DBackpropFilter", "BiasAddGrad", "Pad", "Conv2D"]
    inputs = [[], [], ["x", "w"], ["x"], ["conv", "w", "^other"], [], ["x", "w", "dy"],
              ["dy:0"], ["x", "w"], ["pad", "w"]]
    cpu = ["/device:CPU:0"] * len(names)
    assert merge_barriers(names, ops, cpu, inputs) == [(4, 0), (7, 0), (9, 0)]
    assert merge_barriers(names, ops, ["/device:GPU:0"] * len(names), inputs) == []
    inputs[6] = ["x", "w", "x"]               # the filter gradient reads another tensor
    assert merge_barriers(names, ops, cpu, inputs) == [(4, 0), (9, 0)]
