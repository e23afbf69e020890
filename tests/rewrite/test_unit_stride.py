"""A 1x1 filter's gradient at strides > 1 is emitted as the stride-1 gradient of the input's
strided subsample (emit._unit_stride: oneDNN's strided kernel is wrong for few input
channels, tests/robustness/test_onednn.py). The rewrite must be exact, for the split
shapes that reach it: channels, batch, and the spatial rows (whose local input starts
where the strides land)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from tofu_tf.api import optimize
from tofu_tf.runtime.session import Runner
from tofu_tf.search.plan import Plan

FILTER_GRADIENTS = ("Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter")


def _step(op_type: str, size: int, channels: int, padding: str):
    out = -(-size // 2) if padding == "SAME" else (size - 1) // 2 + 1
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float64, (2, size, size, channels), name="x")
        dy = tf.compat.v1.placeholder(tf.float64, (2, out, out, channels), name="dy")
        kernel = getattr(tf.raw_ops, op_type)
        dw = kernel(input=x, filter_sizes=[1, 1, channels, 1 if "Depthwise" in op_type
                                           else channels],
                    out_backprop=dy, strides=[1, 2, 2, 1], padding=padding, name="dw")
        tf.reduce_sum(dw * dw, name="loss")
    return graph, (2, size, size, channels), (2, out, out, channels)


@pytest.mark.parametrize("op_type", FILTER_GRADIENTS)
@pytest.mark.parametrize("size,padding,choice", [(8, "SAME", "o:ci"), (7, "VALID", "o:ci"),
                                                 (9, "SAME", "r:oh"), (8, "VALID", "r:n")])
def test_strided_1x1_filter_gradient_runs_at_unit_stride_and_exactly(op_type, size, padding,
                                                                     choice):
    if "Depthwise" in op_type:
        choice = {"o:ci": "o:c"}.get(choice, choice)
    graph, x_shape, dy_shape = _step(op_type, size, 12, padding)
    fetches, feeds = ["loss:0", "dw:0"], ["x:0", "dy:0"]
    searched = optimize(graph.as_graph_def(), fetches, feeds=feeds, num_devices=4)
    stored = json.loads(searched.plan.to_json())
    for level in stored["levels"]:
        level["choices"]["dw"] = choice
    forced = optimize(graph.as_graph_def(), fetches, feeds=feeds, num_devices=4,
                      plan=Plan.from_json(json.dumps(stored)))
    kernels = [n for n in forced.graph_def.node if n.op == op_type]
    assert len(kernels) == 4
    assert all(list(n.attr["strides"].list.i) == [1, 1, 1, 1] for n in kernels)
    rng = np.random.default_rng(0)
    values = {"x:0": rng.normal(size=x_shape), "dy:0": rng.normal(size=dy_shape)}
    with tf.compat.v1.Session(graph=graph) as session:
        want = session.run(fetches, values)
    with Runner(forced, {}) as runner:
        got = runner.run(values)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)
    assert forced.ledger.step_bytes == forced.plan.predicted_bytes
