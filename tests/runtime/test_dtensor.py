"""A plan's variable storage as DTensor layouts: applied with DTensor on the logical CPUs,
the step trains as the unpartitioned one does, and every device's DTensor component is the
shard tofu_tf's own emitted step keeps there."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

import tofu_tf
from tofu_tf.errors import TofuError
from tofu_tf.options import Options, VariableStorage
from tofu_tf.runtime.session import box_slices


def _values(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": rng.normal(size=(16, 64)) * 0.3, "b1": np.zeros(64),
            "w2": rng.normal(size=(64, 8)) * 0.3}


def _step(variables):
    w1, b1, w2 = variables

    def step(x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, w1) + b1)
            loss = tf.reduce_mean(tf.square(tf.matmul(h, w2) - y))
        for variable, grad in zip(variables, tape.gradient(loss, variables)):
            variable.assign_sub(0.1 * grad)
        return loss
    return step


def test_variable_layouts_run_under_dtensor():
    """One level of 8 (a layout has one mesh dim per tensor dim; on 2x4 the plan splits
    some variable dim at both levels: see the test below)."""
    values = _values()
    mine = [tf.Variable(values[k], name=k) for k in ("w1", "b1", "w2")]
    partitioned = tofu_tf.function(
        _step(mine), topology="8",
        options=Options(variable_storage=VariableStorage.PARTITIONED))
    rng = np.random.default_rng(1)
    batches = [(rng.normal(size=(8, 16)), rng.normal(size=(8, 8))) for _ in range(3)]
    partitioned(*batches[0])
    partitioned.reload()                       # back to the initial values
    mesh = dtensor.create_mesh([("x", 8)], device_type="CPU")
    layouts = partitioned.dtensor_layouts(mesh)
    assert len(layouts) == 3
    assert any(layout.sharding_specs != [dtensor.UNSHARDED] * layout.rank
               for _, layout in layouts), "the plan splits some variable"

    # DTensor runs the step on its own, the variables in the exported layouts.
    by_name = {variable.name.split(":")[0]: layout for variable, layout in layouts}
    placed = [dtensor.DVariable(dtensor.relayout(dtensor.copy_to_mesh(
        tf.constant(values[k]), dtensor.Layout.replicated(mesh, values[k].ndim)), by_name[k]))
        for k in ("w1", "b1", "w2")]
    whole = [tf.Variable(values[k]) for k in ("w1", "b1", "w2")]
    spmd, reference = tf.function(_step(placed)), tf.function(_step(whole))
    replicated = dtensor.Layout.replicated(mesh, 2)
    for x, y in batches:
        got = spmd(dtensor.copy_to_mesh(tf.constant(x), replicated),
                   dtensor.copy_to_mesh(tf.constant(y), replicated))
        want = reference(x, y)
        np.testing.assert_allclose(dtensor.unpack(got)[0].numpy(), want.numpy(), rtol=1e-9)
        np.testing.assert_allclose(partitioned(x, y).numpy(), want.numpy(), rtol=1e-9)
    for variable, whole_variable in zip(placed, whole):
        np.testing.assert_allclose(_whole(variable, mesh), whole_variable.numpy(), rtol=1e-9)

    # Device d's DTensor component is the region tofu_tf's own shard on device d holds.
    optimized = partitioned.optimized
    for name, layout in optimized.to_dtensor_layouts(mesh).items():
        variable = next(v for v in placed if tuple(v.shape) == optimized.graph.variables[
            name].shape)
        full = _whole(variable, mesh)
        components = dtensor.unpack(variable.read_value())
        for shard in optimized.shards[name]:
            np.testing.assert_array_equal(components[shard.device].numpy(),
                                          full[box_slices(shard.box)])


def _whole(variable, mesh) -> np.ndarray:
    value = variable.read_value()
    replicated = dtensor.Layout.replicated(mesh, value.shape.rank)
    return dtensor.unpack(dtensor.relayout(value, replicated))[0].numpy()


def test_a_mesh_of_another_shape_is_refused():
    values = _values()
    mine = [tf.Variable(values[k], name=k) for k in ("w1", "b1", "w2")]
    partitioned = tofu_tf.function(_step(mine), topology="2x4")
    partitioned(np.zeros((8, 16)), np.zeros((8, 8)))
    mesh = dtensor.create_mesh([("outer", 2), ("inner", 2)],
                               devices=[f"CPU:{i}" for i in range(4)])
    with pytest.raises(TofuError, match="mesh of shape"):
        partitioned.dtensor_layouts(mesh)


def test_a_dim_split_at_two_levels_has_no_layout():
    """The batch of an activation is commonly split at both levels of 2x4: one tensor dim
    over two mesh dims, which a DTensor layout cannot say."""
    values = _values()
    mine = [tf.Variable(values[k], name=k) for k in ("w1", "b1", "w2")]
    partitioned = tofu_tf.function(_step(mine), topology="2x4")
    partitioned(np.zeros((8, 16)), np.zeros((8, 8)))
    plan, graph = partitioned.plan, partitioned.optimized.graph
    twice = [t for t in plan.groups if t in graph.tensors and
             plan.state(0, t) == plan.state(1, t) != "R"]
    assert twice
    with pytest.raises(TofuError, match="split at levels 1 and 2") as caught:
        plan.sharding_spec(twice[0], graph.tensors[twice[0]].shape)
    assert caught.value.node == twice[0]


def test_activation_layouts_name_where_the_emitted_step_stores_each_tensor():
    """Every stored tensor with a layout: each device's DTensor shard of it (the layout's
    block at the device's mesh coordinates) is the region tofu_tf's partition stores
    there; the tensors without one are named with the reason."""
    from tofu_tf.api import optimize, predict
    from tofu_tf.importer.graphdef_io import import_graph_def
    from tofu_tf.models import build
    from tofu_tf.search.topology import coordinates
    step = build("transformer", optimizer="adam", graph_only=True, batch_size=8)
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), topology="2x4")
    mesh = dtensor.create_mesh([("x", 2), ("y", 4)], device_type="CPU")
    layouts, missing = optimized.to_dtensor_activation_layouts(mesh)
    assert len(layouts) > 100 and all(why for why in missing.values())
    assert any(l.sharding_specs != [dtensor.UNSHARDED] * l.rank for l in layouts.values())
    imported = import_graph_def(step.graph_def, step.fetches, feeds=list(step.feeds))
    _, parts = predict(optimized.plan, imported)
    ways = (2, 4)
    for name, layout in layouts.items():
        shape = optimized.graph.tensors[name].shape
        for device in range(8):
            coords = coordinates(device, ways)
            box = []
            for dim, spec in enumerate(layout.sharding_specs):
                if spec == dtensor.UNSHARDED:
                    box.append((0, shape[dim]))
                else:
                    level = mesh.dim_names.index(spec)
                    size = shape[dim] // ways[level]
                    box.append((coords[level] * size, (coords[level] + 1) * size))
            assert tuple(box) == tuple(parts.stored[name][device]), (name, device)
