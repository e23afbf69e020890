"""A convolution split on batch or channels only runs on its part with its own padding: no
halo Pad, and no outputs beyond its part (the VALID form of a transposed convolution over a
padded dy computes k - 1 more each side: 9x the work on a 2x2 image at k = 3). Split
spatially, the part needs the VALID form; both give the unpartitioned numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from tofu_tf.api import optimize
from tofu_tf.runtime.session import Runner
from tofu_tf.search.plan import Plan

CASES = {   # op: (choice, a spatial choice)
    "Conv2D": ("o:n", "o:oh"),
    "Conv2DBackpropInput": ("o:ci", "o:h"),
    "Conv2DBackpropFilter": ("o:co", "r:oh"),
}


def _step(op_type: str, size: int, stride: int):
    out = -(-size // stride)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float64, (4, size, size, 8), name="x")
        w = tf.compat.v1.placeholder(tf.float64, (3, 3, 8, 8), name="w")
        dy = tf.compat.v1.placeholder(tf.float64, (4, out, out, 8), name="dy")
        common = dict(strides=[1, stride, stride, 1], padding="SAME")
        if op_type == "Conv2D":
            result = tf.raw_ops.Conv2D(input=x, filter=w, name="op", **common)
        elif op_type == "Conv2DBackpropInput":
            result = tf.raw_ops.Conv2DBackpropInput(input_sizes=[4, size, size, 8], filter=w,
                                                    out_backprop=dy, name="op", **common)
        else:
            result = tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=[3, 3, 8, 8],
                                                     out_backprop=dy, name="op", **common)
        tf.reduce_sum(result * result, name="loss")
    return graph, {"x:0": (4, size, size, 8), "w:0": (3, 3, 8, 8), "dy:0": (4, out, out, 8)}


@pytest.mark.parametrize("op_type", sorted(CASES))
@pytest.mark.parametrize("size,stride", [(2, 1), (8, 2)])
def test_a_channel_or_batch_part_computes_its_part_alone(op_type, size, stride):
    graph, shapes = _step(op_type, size, stride)
    feeds = [f for f in shapes if f.split(":")[0] in
             {i.split(":")[0] for n in graph.as_graph_def().node if n.name == "op"
              for i in n.input}]
    fetches = ["loss:0", "op:0"]
    searched = optimize(graph.as_graph_def(), fetches, feeds=feeds, num_devices=2)
    rng = np.random.default_rng(0)
    values = {f: rng.normal(size=shapes[f]) for f in feeds}
    with tf.compat.v1.Session(graph=graph) as session:
        want = session.run(fetches, values)
    for choice in CASES[op_type]:
        stored = json.loads(searched.plan.to_json())
        stored["levels"][0]["choices"]["op"] = choice
        forced = optimize(graph.as_graph_def(), fetches, feeds=feeds, num_devices=2,
                          plan=Plan.from_json(json.dumps(stored)))
        nodes = {n.name: n for n in forced.graph_def.node}
        kernels = [n for n in forced.graph_def.node if n.op == op_type]
        assert len(kernels) == 2
        work = sum(np.prod([d.size for d in n.attr["_output_shapes"].list.shape[0].dim])
                   for n in kernels)
        padded = any(nodes[i.lstrip("^").split(":")[0]].op in ("Pad", "PadV2")
                     for n in kernels for i in n.input)
        spatial = choice in ("o:oh", "o:h", "r:oh")
        whole = np.prod(want[1].shape)
        if not spatial:        # each part's kernel computes its part: no more in all
            assert work == whole and not padded, (choice, work, whole)
        with Runner(forced, {}) as runner:
            got = runner.run(values)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)
        assert forced.ledger.step_bytes == forced.plan.predicted_bytes


@pytest.mark.parametrize("choice", ["o:n", "o:c"])
def test_a_max_pool_and_its_gradient_split_on_batch_or_channels_keep_their_padding(choice):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float64, (4, 9, 9, 8), name="x")
        y = tf.nn.max_pool2d(x, 3, 2, "SAME", name="pool")
        dx = tf.gradients(tf.reduce_sum(y * y), x)[0]
        tf.identity(dx, name="dx")
    fetches, feeds = ["dx:0", "pool:0"], ["x:0"]
    searched = optimize(graph.as_graph_def(), fetches, feeds=feeds, num_devices=2)
    stored = json.loads(searched.plan.to_json())
    pools = [n.name for n in graph.as_graph_def().node if n.op in ("MaxPool", "MaxPoolGrad")]
    for name in pools:
        stored["levels"][0]["choices"][name] = choice
    forced = optimize(graph.as_graph_def(), fetches, feeds=feeds, num_devices=2,
                      plan=Plan.from_json(json.dumps(stored)))
    nodes = {n.name: n for n in forced.graph_def.node}
    for n in forced.graph_def.node:
        if n.op in ("MaxPool", "MaxPoolGrad"):
            assert n.attr["padding"].s == b"SAME", n.name
            assert not any(nodes[i.lstrip("^").split(":")[0]].op in ("Pad", "PadV2") for i in n.input)
    values = {"x:0": np.random.default_rng(0).normal(size=(4, 9, 9, 8))}
    with tf.compat.v1.Session(graph=graph) as session:
        want = session.run(fetches, values)
    with Runner(forced, {}) as runner:
        got = runner.run(values)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
