"""`layers.shared_constant`: one Const per graph and (value, dtype), and no graph kept alive."""

import gc
import weakref

import tensorflow as tf

from tofu_tf.models import layers


def _build(values):
    graph = tf.Graph()
    with graph.as_default(), tf.name_scope("scope"):
        tensors = [layers.shared_constant(v, d) for v, d in values]
    return graph, tensors


def test_one_const_per_value_and_dtype_in_each_graph():
    values = [(1.5, tf.float32), ((0, 1, 2), tf.int32), (1.5, tf.float32),
              (1.5, tf.float64), ((0, 1, 2), tf.int32)]
    for _ in range(2):                    # a second graph makes its own
        graph, tensors = _build(values)
        assert [op.type for op in graph.get_operations()] == ["Const"] * 3
        assert tensors[0] is tensors[2] and tensors[1] is tensors[4]
        assert tensors[3].dtype == tf.float64 and tensors[3] is not tensors[0]
        assert all(t.graph is graph for t in tensors)


def test_no_graph_is_kept_alive():
    refs = []
    for _ in range(3):
        graph, tensors = _build([(2.0, tf.float32)])
        refs.append(weakref.ref(graph))
        del graph, tensors
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_eager_gives_plain_constants():
    value = layers.shared_constant(0.25, tf.float64)
    assert value.numpy() == 0.25 and value.dtype == tf.float64
