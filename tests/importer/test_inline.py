"""Function calls inlined by the importer: same numbers, gradient ops named under their
forward call and linked to the forward ops, side effects kept, Grappler where it must."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops as resource_ops

from tofu_tf.errors import GraphImportError
from tofu_tf.graph import Role
from tofu_tf.importer import _inline
from tofu_tf.importer.graphdef_io import import_graph_def

RNG = np.random.default_rng(3)


def _layered_step(noinline: bool = False):
    """Three calls of one tf.function layer (weights passed as values), a tape gradient
    through them (one backward function, three calls), SGD updates."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float64, [4, 3], name="x")
        handles = [resource_ops.var_handle_op(dtype=tf.float64, shape=[3, 3],
                                              shared_name=f"w{i}", name=f"w{i}")
                   for i in range(3)]
        init = tf.group(*[resource_ops.assign_variable_op(h, tf.constant(
            RNG.normal(size=(3, 3)))) for h in handles], name="init")
        attributes = {"_noinline": True} if noinline else None

        @tf.function(autograph=False, experimental_attributes=attributes)
        def layer(h, w):
            return tf.tanh(tf.matmul(h, w)) + h

        with tf.GradientTape() as tape:
            tape.watch(handles)
            h = x
            for i, handle in enumerate(handles):
                with tf.name_scope(f"layer{i}"):
                    h = layer(h, resource_ops.read_variable_op(handle, tf.float64))
            loss = tf.reduce_sum(h * h, name="loss")
        grads = tape.gradient(loss, handles)
        tf.group(*[resource_ops.assign_sub_variable_op(hd, 0.1 * g)
                   for hd, g in zip(handles, grads)], name="train_op")
    return graph.as_graph_def(), init.name


def _run(graph_def, init: str, steps: int = 3) -> list[float]:
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    feed = {"x:0": np.linspace(-1.0, 1.0, 12).reshape(4, 3)}
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        return [session.run(["loss:0", "train_op"], feed)[0] for _ in range(steps)]


def test_inlined_graph_trains_like_the_calls():
    graph_def, init = _layered_step()
    assert _inline.inlinable(graph_def)
    inlined = _inline.inline_calls(graph_def)
    assert not any(n.op in _inline.CALL_TYPES for n in inlined.node)
    assert not inlined.library.function
    np.testing.assert_array_equal(_run(inlined, init), _run(graph_def, init))


def test_gradient_ops_live_under_their_forward_call_and_link_to_its_ops():
    graph_def, _ = _layered_step()
    imported = import_graph_def(graph_def, ["loss:0", "train_op"])
    assert "inline_seconds" in imported.stats and "grappler_seconds" not in imported.stats
    graph = imported.graph
    for i in range(3):
        forward = graph.op(f"layer{i}/PartitionedCall/MatMul")
        assert forward.role is Role.FORWARD
        grads = [op for op in graph if op.type == "MatMul" and op.role is Role.BACKWARD
                 and op.name.startswith(f"layer{i}/PartitionedCall/gradients/")]
        assert grads and all(op.forward_op == forward.name for op in grads)
    trainable = [v for v in graph.variables.values() if v.trainable]
    assert len(trainable) == 3


def test_nested_calls_and_side_effects_of_a_fetched_call_are_kept():
    graph = tf.Graph()
    with graph.as_default():
        handle = resource_ops.var_handle_op(dtype=tf.float32, shape=[2], shared_name="v",
                                            name="v")
        init = resource_ops.assign_variable_op(handle, tf.zeros([2]), name="init")

        @tf.function(autograph=False)
        def inner(t):
            return t * 2.0

        @tf.function(autograph=False)
        def outer(t, h):
            resource_ops.assign_add_variable_op(h, inner(t))
            return t + 1.0

        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        out = outer(x, handle)
        with tf.control_dependencies([out.op]):
            read = tf.identity(resource_ops.read_variable_op(handle, tf.float32), name="read")
        call = out.op.name
    graph_def = graph.as_graph_def()
    inlined = _inline.inline_calls(graph_def, keep={call})
    stand_in = next(n for n in inlined.node if n.name == call)
    assert stand_in.op == "IdentityN"
    assert any(n.op == "AssignAddVariableOp" for n in inlined.node)
    assert not any(n.op in _inline.CALL_TYPES for n in inlined.node)
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(inlined, name="")
    with tf.compat.v1.Session(graph=g) as session:
        session.run(init.name)
        value, first = session.run([read.name, f"{call}:0"], {"x:0": [1.0, 2.0]})
    np.testing.assert_array_equal(value, [2.0, 4.0])     # the assignment ran first
    np.testing.assert_array_equal(first, [2.0, 3.0])


def test_a_noinline_function_goes_to_grappler():
    graph_def, init = _layered_step(noinline=True)
    assert not _inline.inlinable(graph_def)
    with pytest.raises(GraphImportError, match="_noinline"):
        import_graph_def(graph_def, ["loss:0", "train_op"])
