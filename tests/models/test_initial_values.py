"""Graph-only initializers share their Consts and still give the values of
`tf.random.stateless_normal(shape, [seed, index], offset, scale)` and `tf.fill`."""

import numpy as np
import pytest
import tensorflow as tf

from tofu_tf.models.common import VariableStore


def _initialised(store_seed: int, dtype: str, specs):
    """Values of variables made by a graph-only store, after running their initializers."""
    graph = tf.Graph()
    with graph.as_default():
        store = VariableStore(graph_only=True, seed=store_seed, dtype=dtype)
        variables = [store.get(name, shape, scale, offset=offset)
                     for name, shape, scale, offset in specs]
        with tf.compat.v1.Session(graph=graph) as session:
            session.run([v.initializer for v in variables])
            return session.run([v.read_value() for v in variables])


SPECS = [("a", [3, 5], 0.5, 0.0), ("b", [3, 5], 0.5, 1.0), ("c", [7], 0.0, 1.0),
         ("d", [], 0.0, 0.0), ("e", [3, 5], 0.02, 0.0), ("f", [2, 2, 3], 0.0, 0.0)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_values_equal_the_unshared_reference(dtype):
    values = _initialised(3, dtype, SPECS)
    for index, ((_, shape, scale, offset), value) in enumerate(zip(SPECS, values), start=1):
        if scale:
            expected = tf.random.stateless_normal(shape, [3, index], mean=offset,
                                                  stddev=scale, dtype=dtype).numpy()
        else:
            expected = np.full(shape, offset, dtype)
        assert value.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(value, expected)


def test_equal_shapes_and_scalars_share_one_const():
    graph = tf.Graph()
    with graph.as_default():
        store = VariableStore(graph_only=True, seed=0)
        for name, shape, scale, offset in SPECS:
            store.get(name, shape, scale, offset=offset)
    shared = [op for op in graph.get_operations() if op.name.startswith("initial_values/")]
    values = [tf.make_ndarray(op.get_attr("value")).tolist() for op in shared]
    assert len(values) == len({repr((v, op.get_attr("dtype"))) for v, op in zip(values, shared)})
    assert [3, 5] in values and 0.5 in values
