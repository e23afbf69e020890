"""LazyGraph: a GraphDef in a session without a Python Operation per node."""

import numpy as np
import pytest
import tensorflow as tf

from tofu_tf._tf_graph import LazyGraph


def _graph_def():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="Placeholder")
        w = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4), name="ReadVariableOp")
        tf.nn.relu(tf.matmul(x, w) - 5.0, name="out")
    return graph.as_graph_def()


def test_runs_names_lazily_and_new_ops_take_other_names():
    graph_def = _graph_def()
    graph = LazyGraph(graph_def)
    assert len(graph.get_operations()) == 1        # the rest is wrapped when named
    with graph.as_default():
        extra = tf.compat.v1.placeholder(tf.float32, [2, 4])     # default name "Placeholder"
        shifted = graph.get_tensor_by_name("out:0") + extra
    assert extra.op.name != "Placeholder"
    assert {t.op.name for t in graph.get_tensor_by_name("out:0").op.inputs} == {"sub"}
    x = np.ones((2, 3), np.float32)
    want = np.maximum(x @ np.arange(12, dtype=np.float32).reshape(3, 4) - 5.0, 0.0) + 1.0
    with tf.compat.v1.Session(graph=graph) as session:
        got = session.run(shifted, {"Placeholder:0": x, extra: np.ones((2, 4), np.float32)})
    np.testing.assert_allclose(got, want)


def test_a_graph_of_one_named_fetch_runs():
    graph_def = _graph_def()
    with tf.compat.v1.Session(graph=LazyGraph(graph_def)) as session:
        assert session.run("ReadVariableOp:0").shape == (3, 4)


def test_an_unknown_name_is_a_key_error():
    graph = LazyGraph(_graph_def())
    with pytest.raises(KeyError):
        graph.get_operation_by_name("missing")
