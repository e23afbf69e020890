"""Baselines on the shared accounting: closed forms, legality, never below the exact DP."""

import pytest

from tofu_tf.models import build
from tofu_tf.op_semantics.analysis import REPLICATED, Split
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.options import Options
from tofu_tf.importer.graphdef_io import import_concrete_function
from tofu_tf.search import baselines
from tofu_tf.search.baselines import BASELINES, data_parallel
from tofu_tf.search.cost import ALL_REDUCE_FACTOR
from tofu_tf.search.recursive import search, variable_tensors
from tofu_tf.search.topology import Level, Topology

MODELS = ["mlp", "wresnet", "lstm", "transformer"]
_CACHE = {}


def graph_and_entries(name, optimizer="sgd", batch_size=8):
    key = (name, optimizer, batch_size)
    if key not in _CACHE:
        step = build(name, optimizer=optimizer, batch_size=batch_size)
        graph = import_concrete_function(step.concrete_function).graph
        _CACHE[key] = graph, catalog(graph, strict=True)
    return _CACHE[key]


def exact_search(name, devices, joint_choices=0):
    """The search's plan: by default the recursion alone (each level exact under the levels
    above, as the baselines plan)."""
    key = ("dp", name, devices, joint_choices)
    if key not in _CACHE:
        graph, entries = graph_and_entries(name)
        _CACHE[key] = search(graph, Topology.default(devices), entries=entries,
                             options=Options(joint_choices=joint_choices))
    return _CACHE[key]


def one_level(k):
    return Topology((Level(k),))


class LegalityCheck:
    """An observer: every stored state of every level is one the level allows."""

    def __init__(self):
        self.levels = []

    def __call__(self, model, result):
        assert len(result.assignment) == len(model.domains)
        for g, index in enumerate(result.assignment):
            assert 0 <= index < model.domains[g]
        for tensor, state in result.states.items():
            assert state.kind != "partial" and state in model.problem.states(tensor), tensor
        self.levels.append((model, result))


# -- data parallel: the closed form ----------------------------------------------------------

def closed_form(graph, k):
    """2 (k-1) bytes per trainable weight (its gradient's ring all-reduce), plus the same
    for the loss scalar: the batch mean is a Partial(mean) stored replicated."""
    weights = sum(v.num_bytes for v in graph.variables.values()
                  if v.trainable and v.slot_of is None)
    loss = graph.tensor(graph.fetches[0])
    assert loss.shape == ()
    return ALL_REDUCE_FACTOR * (k - 1) * (weights + loss.num_bytes)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_mlp_data_parallel_is_the_sum_of_its_gradient_all_reduces(optimizer, k):
    # batch 64 >= 2 n_in n_out / (n_in + n_out) for every dense layer: all-reducing a
    # weight gradient is then no dearer than gathering the layer's activations and
    # computing the whole gradient on every part (which the accounting may also pick).
    graph, entries = graph_and_entries("mlp", optimizer, batch_size=64)
    check = LegalityCheck()
    result = data_parallel(graph, one_level(k), entries=entries, observe=check)
    assert result.total_bytes == closed_form(graph, k)
    (model, level), = check.levels
    for t in variable_tensors(graph, model.coarse):
        assert level.states[t] == REPLICATED
    for name in ("x:0", "y:0", "Relu:0", "MatMul_2:0"):
        assert level.states[name] == Split(0)


def test_small_batch_data_parallel_gathers_activations_instead():
    """At batch 8 the tiny MLP's activations are smaller than its weights: the cheapest
    choice of each weight-gradient MatMul replicates it over gathered activations."""
    graph, entries = graph_and_entries("mlp")
    check = LegalityCheck()
    result = data_parallel(graph, one_level(2), entries=entries, observe=check)
    assert result.total_bytes < closed_form(graph, 2)
    (_, level), = check.levels
    gradients = [op.name for op in graph if op.type == "MatMul" and op.forward_op
                 and graph.tensor(op.outputs[0]).shape == graph.tensor(
                     graph.op(op.forward_op).inputs[1]).shape]
    assert gradients and all(level.choices[op] == "replicate" for op in gradients)


@pytest.mark.parametrize("name", MODELS)
def test_data_parallel_splits_the_batch_and_replicates_variables(name):
    graph, entries = graph_and_entries(name)
    check = LegalityCheck()
    data_parallel(graph, Topology.default(4), entries=entries, observe=check)
    for model, level in check.levels:
        for t in variable_tensors(graph, model.coarse):
            assert level.states[t] == REPLICATED
        feeds = [t for op in graph if op.role.value == "input" for t in op.outputs]
        assert feeds and all(level.states[t] == Split(0) for t in feeds)
        batch = baselines.batch_states(graph, model)
        assert len(batch) > len(feeds)
        assert all(level.states[t] == s for t, s in batch.items())


# -- every baseline against the exact DP ------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("devices", [2, 3, 4])
def test_baselines_are_legal_and_no_cheaper_than_the_exact_dp(name, devices):
    graph, entries = graph_and_entries(name)
    topology = Topology.default(devices)
    exact = exact_search(name, devices)
    best = exact_search(name, devices, Options().joint_choices)
    for label, baseline in BASELINES.items():
        check = LegalityCheck()
        result = baseline(graph, topology, entries=entries, observe=check)
        assert len(check.levels) == len(topology.levels), label
        # the first cut is the same problem for all: the DP is optimal over a superset
        # (bytes plus repeated work, the objective every search shares)
        assert result.levels[0].cost >= exact.levels[0].cost - 1e-6, label
        if len(topology.levels) == 1 or best.joint:   # the least over all levels' plans
            assert result.objective >= best.objective - 1e-6, label


def test_equal_chop_keeps_each_tensor_on_one_dim_at_every_level():
    graph, entries = graph_and_entries("transformer")
    check = LegalityCheck()
    baselines.equal_chop(graph, Topology.default(8), entries=entries, observe=check)
    (first_model, first), *inner = check.levels
    kept = 0
    for model, level in inner:
        for tensor, state in first.states.items():
            if state in model.problem.states(tensor):
                assert level.states[tensor] == state, tensor
                kept += 1
    assert kept > 0.9 * len(first.states) * len(inner)


def test_all_row_greedy_splits_every_tensor_by_its_first_splittable_dim():
    graph, entries = graph_and_entries("wresnet")
    check = LegalityCheck()
    baselines.all_row_greedy(graph, Topology.default(4), entries=entries, observe=check)
    for model, level in check.levels:
        for tensor, state in level.states.items():
            assert state == model.problem.states(tensor)[0]
        assert any(s == Split(0) for s in level.states.values())


def test_spartan_settles_the_largest_group_first_at_its_best_case():
    graph, entries = graph_and_entries("lstm")
    check = LegalityCheck()
    baselines.spartan(graph, one_level(2), entries=entries, observe=check)
    (model, level), = check.levels
    largest = max(range(len(model.domains)), key=lambda g: baselines.group_bytes(model, g))
    factors = [f for _, f in baselines.op_factors(model) if largest in f.scope]
    best_case = sum(baselines._optimistic_marginal(f, largest, {}) for f in factors)
    assert best_case[level.assignment[largest]] == best_case.min()


def test_layer_wise_dp_lays_weights_out_by_their_layer():
    """No free tensor state: a weight's state is a function of the configuration of the
    layer that reads it (OptCNN partitions a layer's parameters with the layer)."""
    graph, entries = graph_and_entries("mlp")
    model = next(iter(_level_models(graph, entries, 2)))
    space = baselines.LayerSpace.build(graph, model)
    weights = {model.coarse.group_of[v.handle] for v in graph.variables.values()}
    owners = {space.owner[g] for g in weights}
    assert len(owners) == len(weights)
    assert len(space.domains) < len(model.domains)       # fewer variables than groups
    for g in weights:
        assert space.layers[space.owner[g]] in {"MatMul", "MatMul_1", "MatMul_2",
                                               "BiasAdd", "BiasAdd_1", "BiasAdd_2"}


def _level_models(graph, entries, k):
    from tofu_tf.search.recursive import level_models
    return level_models(graph, Topology.default(k), entries)
