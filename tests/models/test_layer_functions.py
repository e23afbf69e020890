"""Graph-only builds with layer functions: one trace per distinct block, the numbers of the
flat build, and the same planner graph and plan once the importer inlines the calls."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from tofu_tf.errors import TofuError
from tofu_tf.models import build, common
from tofu_tf.models.common import VariableStore
from tofu_tf.importer.graphdef_io import import_graph_def
from tofu_tf.runtime.session import SingleDevice
from tofu_tf.search.plan import make_plan
from tofu_tf.search.topology import Topology

# Sizes with repeated blocks: 3 equal layers; units (3, 3, 3, 3), whose 2nd and 3rd units of a
# stage are alike; 5 time steps of each LSTM layer's cell. Keys of these few calls are
# built op by op by default: the tests that trace them share from two calls (conftest.py).
MODELS = {"transformer": {"layers": 3}, "wresnet": {"depth": 38}, "lstm": {}}


def _step(model: str, layer_functions: bool, **kwargs):
    return build(model, optimizer="adam", graph_only=True, batch_size=4, dtype="float64",
                 layer_functions=layer_functions, **MODELS[model], **kwargs)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_same_numbers_as_the_flat_build(model, share_from_two_calls):
    flat, layered = _step(model, False), _step(model, True)
    assert not flat.graph_def.library.function and layered.graph_def.library.function
    batches = [flat.sample_batch(seed) for seed in range(3)]
    results = []
    for step in (flat, layered):
        with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
            losses = [single.run(dict(zip(step.feeds, batch)))[0] for batch in batches]
            results.append((losses, single.values()))
    (flat_losses, flat_values), (losses, values) = results
    np.testing.assert_allclose(losses, flat_losses, rtol=1e-12)
    assert values.keys() == flat_values.keys()
    # float64: a backward function sums some gradient contributions in another order than
    # the flat tape (residual paths), a few 1e-10 apart after three Adam steps.
    for name, value in values.items():
        np.testing.assert_allclose(value, flat_values[name], rtol=1e-8, atol=1e-10,
                                   err_msg=name)


@pytest.mark.parametrize("model,sizes", [("transformer", ({"layers": 2}, {"layers": 6})),
                                         ("wresnet", ({"depth": 38}, {"depth": 74})),
                                         ("lstm", ({"steps": 3}, {"steps": 9}))])
def test_each_distinct_block_is_traced_once(model, sizes, share_from_two_calls):
    """The function library does not grow with depth (or time steps)."""
    libraries = [build(model, optimizer="sgd", graph_only=True, batch_size=2, **size)
                 .graph_def.library.function for size in sizes]
    assert len(libraries[0]) == len(libraries[1]) > 0


def test_a_block_called_once_is_built_op_by_op():
    """WResNet-14: one unit per stage, each of its own shape."""
    step = build("wresnet", optimizer="sgd", graph_only=True, batch_size=2)
    assert not step.graph_def.library.function


@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_planner_sees_the_flat_graph(model, share_from_two_calls):
    graphs = [import_graph_def(s.graph_def, s.fetches).graph
              for s in (_step(model, False), _step(model, True))]
    flat, layered = graphs
    assert collections.Counter(op.type for op in layered) == \
        collections.Counter(op.type for op in flat)
    assert collections.Counter((t.shape, t.dtype) for t in layered.tensors.values()) == \
        collections.Counter((t.shape, t.dtype) for t in flat.tensors.values())
    # Roles may differ: the flat build's tape names some gradient ops so that they cannot
    # be told from forward ops (GELU's derivative), a backward function's scopes can.
    plans = [make_plan(g, Topology.default(4)) for g in graphs]
    assert plans[1].total_bytes == plans[0].total_bytes


def test_keys_of_fewer_calls_than_the_threshold_are_built_op_by_op():
    """By default a key is shared from MIN_SHARED_CALLS calls: ResNet-50's keys (2, 3 and 5
    calls) are not, a Transformer of that many layers is, one of a layer fewer is not."""
    resnet = build("wresnet", optimizer="sgd", graph_only=True, batch_size=2, depth=50,
                   widen=1, base_width=4, image_size=8, num_classes=4, initializers=False)
    assert not resnet.graph_def.library.function
    layers = [build("transformer", optimizer="sgd", graph_only=True, batch_size=2,
                    layers=n, initializers=False).graph_def.library.function
              for n in (common.MIN_SHARED_CALLS - 1, common.MIN_SHARED_CALLS)]
    assert not layers[0] and layers[1]


def test_dropout_layers_are_not_shared(share_from_two_calls):
    """Each layer draws its masks from its own seeds: no layer function."""
    step = build("transformer", optimizer="sgd", graph_only=True, batch_size=2, dropout=0.1)
    assert not step.graph_def.library.function


def test_a_block_variable_cannot_be_incremented_inside_the_function(share_from_two_calls):
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        store = VariableStore(graph_only=True, seed=0, layer_functions=True)

        def make():
            v = store.get("v", [2], 1.0)
            return lambda x: (v.assign_add(x), x)[1]

        block = store.block("b", ("b",), make, uses=2)
        with pytest.raises(TofuError, match="incremented inside a block"):
            block(tf.zeros([2]))
