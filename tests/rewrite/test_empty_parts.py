"""The last part of an uneven split of a reduction may read nothing (2 rows cut 3 ways):
its share of the sum is zero, which TensorFlow's kernel does not promise (a filter
gradient over no rows of dy returns its buffer unwritten). The emitter writes the
reducer's identity instead of running the kernel, and prices no reads for it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from tofu_tf.api import optimize
from tofu_tf.op_semantics.analysis import Split
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.rewrite.partition import partition, stored_box
from tofu_tf.runtime.session import Runner
from tofu_tf.search.plan import Plan
from tofu_tf.search.topology import coordinates


def _filter_gradient_step():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float64, (2, 11, 11, 3), name="x")
        dy = tf.compat.v1.placeholder(tf.float64, (2, 5, 5, 4), name="dy")
        dw = tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=[3, 3, 3, 4],
                                             out_backprop=dy, strides=[1, 2, 2, 1],
                                             padding="VALID", name="dw")
        tf.reduce_sum(dw * dw, name="loss")
    return graph


def test_a_part_reading_no_rows_of_a_reduction_adds_nothing():
    graph = _filter_gradient_step()
    fetches, feeds = ["loss:0", "dw:0"], ["x:0", "dy:0"]
    searched = optimize(graph.as_graph_def(), fetches, feeds=feeds, topology="2x3")
    stored = json.loads(searched.plan.to_json())
    for level in stored["levels"]:          # dy's 5 rows: 3 + 2, then 2 cut 3 ways
        level["choices"]["dw"] = "r:oh"
    forced = optimize(graph.as_graph_def(), fetches, feeds=feeds, topology="2x3",
                      plan=Plan.from_json(json.dumps(stored)))
    rng = np.random.default_rng(0)
    values = {"x:0": rng.normal(size=(2, 11, 11, 3)), "dy:0": rng.normal(size=(2, 5, 5, 4))}
    with tf.compat.v1.Session(graph=graph) as session:
        want = session.run(fetches, values)
    with Runner(forced, {}) as runner:
        got = runner.run(values)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    assert forced.ledger.step_bytes == forced.plan.predicted_bytes
    assert any(node.op == "Fill" and "dw/identity" in node.name
               for node in forced.graph_def.node)


@pytest.mark.parametrize("make", [lambda x: tf.math.exp(x, name="y"),
                                  lambda x: tf.reshape(x, (3, 2, 4), name="y")],
                         ids=["Exp", "Reshape"])
def test_a_smaller_part_of_an_uneven_split_is_cut_as_planned(make):
    """3 rows cut 2x2: the first level's parts hold 2 rows and 1; the second level cuts
    the 1-row part too (1 row and none), not running that part whole on both devices
    (which would fetch what the other stores), and without asking the op's hook to cut
    one row (Reshape's cannot)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float64, (3, 8), name="x")
        y = make(x)
        tf.reduce_sum(y * y, name="loss")
    fetches, feeds = ["loss:0", "y:0"], ["x:0"]
    searched = optimize(graph.as_graph_def(), fetches, feeds=feeds, topology="2x2")
    entries = catalog(searched.graph)
    label = next(s.label for s in entries["y"].strategies if s.outputs[0] == Split(0))
    stored = json.loads(searched.plan.to_json())
    for level in stored["levels"]:
        level["choices"]["y"] = label
    plan = Plan.from_json(json.dumps(stored))
    forced = optimize(graph.as_graph_def(), fetches, feeds=feeds, topology="2x2", plan=plan)
    shape = tuple(forced.graph.tensors["y:0"].shape)
    pieces = partition(forced.graph, entries, plan).ops["y"]
    for device, piece in enumerate(pieces):
        want = stored_box(shape, [Split(0), Split(0)], (2, 2), coordinates(device, (2, 2)))
        assert piece.outputs[0].box == want
    values = {"x:0": np.random.default_rng(0).normal(size=(3, 8))}
    with tf.compat.v1.Session(graph=graph) as session:
        expected = session.run(fetches, values)
    with Runner(forced, {}) as runner:
        got = runner.run(values)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-12)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-12)
    assert forced.ledger.step_bytes == forced.plan.predicted_bytes
