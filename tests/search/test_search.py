"""The search end to end on the reference models: coarsening, plans, JSON, device counts."""

import numpy as np
import pytest

from tofu_tf.options import Options
from tofu_tf.graph import Role
from tofu_tf.models import build
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.importer.graphdef_io import import_concrete_function
from tofu_tf.search.coarsen import coarsen
from tofu_tf.search.plan import Plan, make_plan
from tofu_tf.search.recursive import level_models, search
from tofu_tf.search.topology import Topology

_GRAPHS = {}


def graph_of(name, optimizer="sgd", batch_size=8):
    key = (name, optimizer, batch_size)
    if key not in _GRAPHS:
        step = build(name, optimizer=optimizer, batch_size=batch_size)
        _GRAPHS[key] = import_concrete_function(step.concrete_function).graph
    return _GRAPHS[key]


def test_coarsening_ties_gradients_and_slots():
    graph = graph_of("mlp", "adam")
    coarse = coarsen(graph, catalog(graph))
    assert coarse.num_groups < len(graph.tensors) / 2
    for op in graph:
        if op.role is Role.BACKWARD and op.type == "MatMul" and op.forward_op:
            fwd = graph.op(op.forward_op)
            # the weight gradient joins the weight's group (through the update math)
            grads = [t for t in op.outputs
                     if graph.tensor(t).shape == graph.tensor(fwd.inputs[1]).shape]
            for g in grads:
                assert coarse.group_of[g] == coarse.group_of[fwd.inputs[1]]
    for v in graph.variables.values():
        if v.slot_of:
            assert coarse.group_of[v.handle] == coarse.group_of[
                graph.variables[v.slot_of].handle]


@pytest.mark.parametrize("n", [2, 3, 4, 6, 7, 8, 12, 16])
def test_every_device_count_plans(n):
    plan = make_plan(graph_of("mlp", batch_size=16), num_devices=n)
    assert plan.num_devices == n and plan.exact
    assert plan.total_bytes == pytest.approx(sum(plan.bytes_per_level))
    assert len(plan.levels) == len(Topology.default(n).levels)


@pytest.mark.parametrize("model", ["mlp", "wresnet", "lstm", "transformer"])
def test_plan_bytes_are_the_level_models_cost(model):
    """The plan's bytes are what the shared accounting says of the chosen states."""
    graph = graph_of(model)
    topology = Topology.default(4)
    result = search(graph, topology, options=Options(joint_choices=0))   # the recursion's
    models = level_models(graph, topology)
    level_model = next(models)
    total, _ = level_model.evaluate(result.levels[0].assignment)
    assert total == pytest.approx(result.levels[0].cost)           # bytes and work
    assert result.levels[0].bytes == pytest.approx(
        sum(moved for _, _, moved in result.levels[0].breakdown))
    assert all(level.exact for level in result.levels)
    # no tensor the problem forbids replicating is stored replicated
    for tensor, state in result.levels[0].states.items():
        assert state in level_model.problem.states(tensor)


def test_plan_round_trips_through_json_and_reads_well():
    plan = make_plan(graph_of("transformer"), num_devices=4)
    again = Plan.from_json(plan.to_json())
    assert again == plan
    text = str(plan)
    assert "level 1: 2-way cut" in text and "heaviest tensor groups" in text


def test_one_cut_beats_every_fixed_rule():
    """The DP optimum is no worse than a few hand-made assignments on the same accounting."""
    graph = graph_of("lstm")
    model = next(level_models(graph, Topology.default(2)))
    from tofu_tf.search.level import solve_level
    best = solve_level(model).bytes
    rng = np.random.default_rng(0)
    for _ in range(20):
        assignment = [int(rng.integers(d)) for d in model.domains]
        assert model.evaluate(assignment)[0] >= best - 1e-6


# Each level is solved exactly, given the levels above it; across levels the recursion is
# myopic (a costlier level 2 can make level 3 cheaper), so on several levels a heuristic
# can win by a little. Bytes alone: transformer at 8 devices, Spartan by 0.8%; with
# repeated work priced (the default): MLP at 8, layer-wise DP by 3.9% (its level 2 costs
# 704 B more, its level 3 1656 B less), transformer at 8, Spartan by 2.2%. The bench
# records every such gap; this test holds the recursion to within MULTI_LEVEL_SLACK of
# every baseline.
MULTI_LEVEL_SLACK = 0.05


@pytest.mark.parametrize("model", ["mlp", "wresnet", "lstm", "transformer"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_plan_is_no_worse_than_any_baseline(model, n):
    from tofu_tf.search.baselines import BASELINES
    graph = graph_of(model)
    topology = Topology.default(n)
    plan = search(graph, topology).objective
    slack = 1.0 if len(topology.levels) == 1 else 1.0 + MULTI_LEVEL_SLACK
    for name, baseline in BASELINES.items():
        assert plan <= baseline(graph, topology).objective * slack, name


def test_plan_states_are_the_searched_states():
    graph = graph_of("lstm")
    topology = Topology.default(4)
    result = search(graph, topology)
    from tofu_tf.search.plan import plan_from_search
    plan = plan_from_search(result, graph)
    for level, searched in enumerate(result.levels):
        for tensor, state in searched.states.items():
            assert plan.state(level, tensor) == str(state)
        assert dict(plan.levels[level].choices) == searched.choices


@pytest.mark.parametrize("model", ["wresnet", "lstm", "transformer"])
@pytest.mark.parametrize("n", [3, 8])
def test_memory_estimate_reads_only_the_device_ops_shapes(model, n):
    """The plan's memory estimate comes from a device problem whose ops keep only their
    shapes; with every local op described it is the same, and so are the shapes."""
    from tofu_tf.search.memory import plan_memory
    from tofu_tf.search.recursive import device_problem
    graph = graph_of(model)
    result = search(graph, Topology.default(n))
    described, shapes = (device_problem(*result.last, describe=flag) for flag in (True, False))
    assert result.memory == plan_memory(graph, described) == plan_memory(graph, shapes)
    assert all(op.sem.computes for op in described.ops if not op.sem.is_opaque)
    for full, light in zip(described.ops, shapes.ops):
        assert (light.sem.input_shapes, light.sem.output_shapes) == \
            (full.sem.input_shapes, full.sem.output_shapes)
        assert not any(light.sem.computes)
