"""The error catalog: each bad input gives its typed TofuError, naming the node, the op
type and the fix — or, where the input is legal, the same numbers as the unpartitioned
graph. No case may end in a bare TensorFlow traceback or a wrong number."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tofu_tf
from tofu_tf.api import optimize
from tofu_tf.errors import (DynamicShapeError, GraphImportError, KeptWholeWarning,
                            PlanInfeasibleError, RewriteError, TofuError, UnsupportedOpError)
from tofu_tf.models import build
from tofu_tf.runtime.session import Runner


def _graph(build_fn):
    """(GraphDef, fetch names, feeds {name: value}) of a v1 graph built by `build_fn`,
    which returns (fetch tensors, feeds {placeholder: value})."""
    graph = tf.Graph()
    with graph.as_default():
        fetches, feeds = build_fn()
    return (graph.as_graph_def(), [t.name for t in fetches],
            {p.name: v for p, v in feeds.items()})


def _unpartitioned(graph_def, fetches, feeds):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            session.run([op for op in graph.get_operations()
                         if op.type == "AssignVariableOp" and "init" in op.name.lower()])
            return session.run(fetches, feeds)


def _partitioned(graph_def, fetches, feeds, values=None, **kwargs):
    optimized = optimize(graph_def, fetches, feeds=list(feeds), **kwargs)
    with Runner(optimized, values or {}) as runner:
        return runner.run(feeds)


def _named(error: TofuError, node: str, op_type: str | None = None) -> None:
    assert error.node == node and f"'{node}'" in str(error)
    if op_type:
        assert error.op_type == op_type and op_type in str(error)
    assert "Fix:" in str(error)


def _unknown_type():
    x = tf.compat.v1.placeholder(tf.float32, [8, 4], name="x")
    running = tf.raw_ops.CumulativeLogsumexp(x=x * 2.0, axis=tf.constant(0),
                                             name="running")               # no description
    return [tf.identity(tf.matmul(running, tf.ones([4, 6])) + 1.0, name="out")], {
        x: np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)}


def test_an_unknown_op_type_is_kept_whole_and_listed_in_a_warning():
    graph_def, fetches, feeds = _graph(_unknown_type)
    with pytest.warns(KeptWholeWarning, match=r"CumulativeLogsumexp \(1: running\)"):
        got = _partitioned(graph_def, fetches, feeds, num_devices=4)
    np.testing.assert_allclose(got, _unpartitioned(graph_def, fetches, feeds), rtol=1e-6)


def test_strict_makes_an_unknown_op_type_an_error():
    graph_def, fetches, feeds = _graph(_unknown_type)
    with pytest.raises(UnsupportedOpError) as caught:
        optimize(graph_def, fetches, feeds=list(feeds), num_devices=4,
                 options=tofu_tf.Options(strict=True))
    _named(caught.value, "running", "CumulativeLogsumexp")


def test_a_resource_op_without_a_description_is_an_error_even_when_not_strict():
    def build_fn():
        v = tf.Variable(np.ones((8, 4), np.float32), name="v")
        update = tf.raw_ops.ResourceScatterNdUpdate(
            ref=v.handle, indices=tf.constant([[1], [2]]), updates=tf.ones([2, 4]),
            name="scatter_nd")
        with tf.control_dependencies([update]):
            return [tf.identity(v.read_value() * 2.0, name="out")], {}
    graph_def, fetches, _ = _graph(build_fn)
    with pytest.raises(UnsupportedOpError, match="takes a resource") as caught:
        optimize(graph_def, fetches, num_devices=2)
    _named(caught.value, "scatter_nd", "ResourceScatterNdUpdate")


def test_a_reference_variable_is_an_error_naming_resource_variables():
    """TensorFlow 1's reference variables (get_variable without use_resource) are refused
    at import, before an emitted graph would fail on their ref-typed reads."""
    def build_fn():
        x = tf.compat.v1.placeholder(tf.float32, [8, 4], name="x")
        with tf.compat.v1.variable_scope("net", use_resource=False):
            w = tf.compat.v1.get_variable("w", [4, 2])
        loss = tf.reduce_sum(tf.matmul(x, w), name="loss")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        return [loss, train], {}
    graph_def, fetches, _ = _graph(build_fn)
    with pytest.raises(GraphImportError, match="reference variable") as caught:
        optimize(graph_def, fetches, feeds=["x"], num_devices=2)
    _named(caught.value, "net/w", "VariableV2")
    assert "use_resource=True" in str(caught.value)


def test_a_dynamic_dimension_names_the_placeholder():
    def build_fn():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        return [tf.reduce_sum(tf.matmul(x, tf.ones([4, 4])), name="out")], {}
    graph_def, fetches, _ = _graph(build_fn)
    with pytest.raises(DynamicShapeError) as caught:
        optimize(graph_def, fetches, feeds=["x:0"], num_devices=2)
    _named(caught.value, "x", "Placeholder")


def test_control_flow_that_is_not_unrolled_names_the_loop():
    def build_fn():
        x = tf.compat.v1.placeholder(tf.float32, [8, 4], name="x")
        _, y = tf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * 2.0),
                             [tf.constant(0), x], name="loop")
        return [tf.identity(y, name="out")], {}
    graph_def, fetches, _ = _graph(build_fn)
    with pytest.raises(GraphImportError, match="unroll") as caught:
        optimize(graph_def, fetches, feeds=["x:0"], num_devices=2)
    assert caught.value.node and caught.value.op_type and "Fix:" in str(caught.value)


def test_fewer_elements_than_devices_names_the_largest_tensor():
    def build_fn():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        return [tf.identity(tf.matmul(x, tf.ones([3, 2])), name="out")], {}
    graph_def, fetches, _ = _graph(build_fn)
    with pytest.raises(PlanInfeasibleError, match="6 elements, fewer than the 8") as caught:
        optimize(graph_def, fetches, feeds=["x:0"], num_devices=8)
    _named(caught.value, "x", "Placeholder")


@pytest.mark.parametrize("kwargs, match", [
    ({"topology": "2x3", "devices": [f"/device:CPU:{d}" for d in range(8)]},
     "8 device names for a plan over 6 devices"),
    ({"topology": "2x1"}, "every level at least 2 ways"),
    ({"num_devices": 1}, "at least 2 devices"),
    ({"num_devices": 4, "topology": "2x2"}, "exactly one of num_devices and topology"),
    ({"topology": "2xfour"}, "cannot read topology"),
])
def test_topologies_that_do_not_fit_say_how_to_fix_them(kwargs, match):
    graph_def, fetches, feeds = _graph(_unknown_type)
    with pytest.raises(TofuError, match=match) as caught:
        optimize(graph_def, fetches, feeds=list(feeds), **kwargs)
    assert "Fix:" in str(caught.value)


def test_an_infeasible_memory_budget_names_the_smallest_peak():
    step = build("mlp", optimizer="sgd", graph_only=True, batch_size=8)
    with pytest.raises(PlanInfeasibleError, match="raise the budget to at least") as caught:
        optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=4,
                 options=tofu_tf.Options(memory_budget_bytes=1024))
    assert caught.value.best_peak_bytes > 1024 and caught.value.best_plan is not None


@pytest.mark.parametrize("damage, node", [
    ("input", "out"),            # an input names a node that is not there
    ("op", "out"),               # an op type TensorFlow does not know
    ("duplicate", "x"),          # two nodes with one name
])
def test_a_malformed_graphdef_names_the_node(damage, node):
    graph_def, fetches, feeds = _graph(_unknown_type)
    by_name = {n.name: n for n in graph_def.node}
    if damage == "input":
        by_name["out"].input[0] = "no_such_node"
    elif damage == "op":
        by_name["out"].op = "NoSuchOpType"
    else:
        graph_def.node.add().CopyFrom(by_name["x"])
    with pytest.raises(GraphImportError) as caught:
        optimize(graph_def, fetches, feeds=list(feeds), num_devices=2)
    assert caught.value.node == node and "Fix:" in str(caught.value)


def test_a_fetch_that_does_not_exist_is_named():
    graph_def, _, feeds = _graph(_unknown_type)
    with pytest.raises(GraphImportError) as caught:
        optimize(graph_def, ["no_such:0"], feeds=list(feeds), num_devices=2)
    assert caught.value.node == "no_such:0" and "Fix:" in str(caught.value)


def test_integer_tensors_partition_and_string_tensors_stay_whole():
    def build_fn():
        n = tf.compat.v1.placeholder(tf.int32, [8, 6], name="n")
        s = tf.compat.v1.placeholder(tf.string, [8], name="s")
        total = tf.reduce_sum(n * 3 + 1, axis=1) + tf.strings.length(s)
        return [tf.identity(total, name="out")], {
            n: np.arange(48, dtype=np.int32).reshape(8, 6),
            s: np.array([b"a" * i for i in range(8)])}
    graph_def, fetches, feeds = _graph(build_fn)
    with pytest.warns(KeptWholeWarning, match="StringLength"):
        got = _partitioned(graph_def, fetches, feeds, num_devices=4)
    np.testing.assert_array_equal(got, _unpartitioned(graph_def, fetches, feeds))


def test_control_dependencies_keep_their_order():
    """`out` reads the variable after the assignment it depends on has run."""
    def build_fn():
        x = tf.compat.v1.placeholder(tf.float32, [8, 4], name="x")
        v = tf.Variable(np.zeros((8, 4), np.float32), name="v")
        assign = v.assign(x * 2.0)
        with tf.control_dependencies([assign]):
            out = tf.identity(v.read_value() + 1.0, name="out")
        return [out], {x: np.ones((8, 4), np.float32)}
    graph_def, fetches, feeds = _graph(build_fn)
    got = _partitioned(graph_def, fetches, feeds, values={"v": np.zeros((8, 4), np.float32)},
                       num_devices=4)
    np.testing.assert_array_equal(got[0], np.full((8, 4), 3.0, np.float32))


def test_a_search_past_its_time_limit_stops_with_the_fix():
    step = build("transformer", optimizer="adam", graph_only=True, batch_size=8)
    with pytest.raises(PlanInfeasibleError, match="time limit of 1e-06 s") as caught:
        optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=8,
                 options=tofu_tf.Options(search_time_limit_s=1e-6))
    assert "search_time_limit_s" in str(caught.value)
