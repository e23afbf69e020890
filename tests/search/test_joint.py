"""The search over all levels at once: on graphs whose joint problem fits
`Options.joint_choices`, the plan moves exactly the joint optimum's bytes, which HiGHS
proves independently (ILP over the joint choices), and never more than the recursion's.
Past it, at three levels, Options.lookahead (each level fixed by its two-level optimum)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tofu_tf.errors import PlanInfeasibleError, TofuError
from tofu_tf.importer.graphdef_io import import_graph_def
from tofu_tf.models import build
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.options import Options
from tofu_tf.search import ilp, joint, level, recursive
from tofu_tf.search import problem as problem_module
from tofu_tf.search.exact import JointMethod, joint_optimum, lookahead_search
from tofu_tf.search.joint import (JointTooLarge, JointTooWide, joint_model,
                                  least_joint_choices)
from tofu_tf.search.level import LevelModel, level_models, solve_level
from tofu_tf.search.problem import entry_vectors
from tofu_tf.search.recursive import NoLookahead, search
from tofu_tf.search.topology import Topology
from tofu_tf.tools.fuzz import HypothesisChooser, random_step
from tests.rewrite.equivalence import compare

_GRAPHS = {}
# HiGHS's time on one joint ILP; past it the optimum comes from the exact DP over product
# domains (a random graph's joint problem can take HiGHS minutes on a loaded machine).
ILP_SECONDS = 20.0


def graph_of(name):
    if name not in _GRAPHS:
        step = build(name, optimizer="sgd", batch_size=8, graph_only=True)
        graph = import_graph_def(step.graph_def, step.fetches).graph
        _GRAPHS[name] = graph, catalog(graph)
    return _GRAPHS[name]


def _check(graph, entries, topology, options=Options()):
    plan = search(graph, topology, entries=entries, options=options)
    recursion = search(graph, topology, entries=entries, options=Options(joint_choices=0))
    assert plan.joint
    try:
        optimum = joint_optimum(graph, topology, JointMethod.ILP, time_limit=ILP_SECONDS)
    except PlanInfeasibleError:   # HiGHS out of time: the exact DP over product domains
        optimum = joint_optimum(graph, topology, JointMethod.DP)
    assert plan.objective == optimum                  # whole bytes: tolerance 0
    assert plan.objective <= recursion.objective
    assert plan.levels[0].cost >= recursion.levels[0].cost   # level 1 exact alone
    return plan, recursion


# Every tiny reference model at every multi-level topology whose joint problem fits the
# default Options.joint_choices (WResNet at 2x2x2 does not: 42722 chains, a 12 s walk;
# see bench/results/search.md, the gap table).
DEFAULT_JOINT = [("mlp", "2x2"), ("mlp", "2x4"), ("mlp", "2x2x2"), ("lstm", "2x2"),
                 ("lstm", "2x4"), ("lstm", "2x2x2"), ("transformer", "2x2"),
                 ("transformer", "2x4"), ("transformer", "2x2x2"), ("wresnet", "2x2"),
                 ("wresnet", "2x4")]


# Where the recursion plans the joint optimum by itself (with repeated work priced).
RECURSION_OPTIMAL = {("lstm", "2x2")}


@pytest.mark.parametrize("name,topology", DEFAULT_JOINT)
def test_the_plan_is_the_joint_ilp_optimum(name, topology):
    graph, entries = graph_of(name)
    plan, recursion = _check(graph, entries, Topology.parse(topology))
    # where the recursion falls short, the joint search is what closes the gap
    assert (plan.objective < recursion.objective) == (
        (name, topology) not in RECURSION_OPTIMAL)


def test_past_a_smaller_limit_the_lookahead_plans_the_transformers_joint_optimum():
    """The Transformer at 2x2x2: 12894 chains, op tables of 179 chains x 250047 entries;
    past a limit of 10000, each level fixed by its optimum with the level below (3467
    chains: Options.lookahead) plans the joint optimum all the same."""
    graph, entries = graph_of("transformer")
    topology = Topology.parse("2x2x2")
    smaller = Options(joint_choices=10_000)
    ahead = search(graph, topology, entries=entries,
                   options=dataclasses.replace(smaller, lookahead=True))
    assert not ahead.joint
    plan = search(graph, topology, entries=entries)
    assert plan.joint and ahead.objective == plan.objective
    assert search(graph, topology, entries=entries, options=smaller).objective > plan.objective


def test_the_lookaheads_plan_trains_like_the_unpartitioned_step():
    """The Transformer at 2x2x2, where the lookahead's plan is not the recursion's."""
    compare("transformer", "adam", dtype="float64", topology="2x2x2",
            options=Options(lookahead=True))


@pytest.mark.parametrize("name", ["mlp", "lstm"])
def test_the_lookahead_closes_most_of_the_recursions_gap(name):
    """At 2x2x2 each level fixed by its two-level optimum: never below the joint optimum
    (its windows leave the third level out), below the recursion by most of their gap
    (bytes alone: MLP 23784 -> 22696 B, the optimum; LSTM 409496 -> 405656 against
    405528)."""
    graph, entries = graph_of(name)
    topology, options = Topology.parse("2x2x2"), Options(flop_bytes=0.0)
    recursion = search(graph, topology, entries=entries,
                       options=dataclasses.replace(options, joint_choices=0))
    ahead = lookahead_search(graph, topology, entries=entries, options=options)
    optimum = joint_optimum(graph, topology, options=options)
    assert optimum <= ahead.objective
    assert ahead.objective - optimum < (recursion.objective - optimum) / 2


def test_with_work_and_transfers_priced_the_plan_is_the_joint_optimum():
    graph, entries = graph_of("mlp")
    topology, options = Topology.parse("2x2"), Options(flop_bytes=1.0, transfer_bytes=4096.0)
    plan = search(graph, topology, entries=entries, options=options)
    assert plan.joint and plan.total_work + sum(l.latency for l in plan.levels) > 0
    assert plan.objective == joint_optimum(graph, topology, JointMethod.ILP, options=options)


def test_where_the_joint_dp_is_too_wide_highs_plans_the_joint_optimum():
    """With shared reads the views' groups widen the LSTM's joint DP at 2x4 past its
    table bound; HiGHS proves the joint optimum instead (Options.joint_ilp_seconds), and
    the plan moves its bytes: less than the DP alone would plan."""
    graph, entries = graph_of("lstm")
    topology = Topology.parse("2x4")
    options = Options(shared_reads=True, flop_bytes=0.0)
    with pytest.raises(JointTooWide):
        joint_model(graph, topology, entries=entries, options=options)
    plan = search(graph, topology, entries=entries, options=options)
    dp_alone = search(graph, topology, entries=entries,
                      options=dataclasses.replace(options, joint_ilp_seconds=0.0))
    optimum = joint_optimum(graph, topology, JointMethod.ILP, time_limit=ILP_SECONDS,
                            options=options)
    assert plan.joint and not dp_alone.joint
    assert plan.objective == optimum < dp_alone.objective


@pytest.mark.parametrize("topology", ["2x2", "2x4"])
def test_with_views_highs_plans_the_transformers_own_joint_optimum(topology):
    """The Transformer's joint ILP with views, at the default flop price, has about
    150000 columns (within joint.ILP_VARIABLES): the plan is the optimum of the views'
    own account, below the plan without views priced with them."""
    graph, entries = graph_of("transformer")
    options = Options(shared_reads=True)
    plan = search(graph, Topology.parse(topology), entries=entries, options=options)
    repriced = search(graph, Topology.parse(topology), entries=entries,
                      options=dataclasses.replace(options, joint_ilp_seconds=0.0))
    optimum = joint_optimum(graph, Topology.parse(topology), JointMethod.ILP,
                            time_limit=ILP_SECONDS, options=options)
    assert plan.joint and plan.objective == optimum < repriced.objective


def test_a_joint_ilp_stopped_by_the_clock_is_told_and_not_taken(caplog):
    """HiGHS's node limit decides whether the joint ILP's answer is taken (the same on any
    machine); where the time limit stops it first, the search says the plan depends on
    the machine, and plans as without the ILP."""
    graph, entries = graph_of("lstm")
    topology = Topology.parse("2x4")
    options = Options(shared_reads=True, flop_bytes=0.0)
    dp_alone = search(graph, topology, entries=entries,
                      options=dataclasses.replace(options, joint_ilp_seconds=0.0))
    with caplog.at_level("WARNING"):
        clocked = search(graph, topology, entries=entries,
                         options=dataclasses.replace(options, joint_ilp_seconds=1e-3))
    assert "Options.joint_ilp_seconds" in caplog.text
    assert not clocked.joint and clocked.objective == dp_alone.objective


def test_the_joint_ilp_stops_by_the_searchs_time_limit(monkeypatch):
    """Options.search_time_limit_s bounds HiGHS too: the joint ILP is given no more than
    what is left of it (not joint_ilp_seconds, 60 s by default)."""
    graph, entries = graph_of("lstm")
    given = []
    optimum = recursive.joint.optimum

    def spy(build, ilp_seconds=0.0):
        given.append(ilp_seconds)
        return optimum(build, ilp_seconds)
    monkeypatch.setattr(recursive.joint, "optimum", spy)
    options = Options(shared_reads=True, flop_bytes=0.0, search_time_limit_s=30.0)
    search(graph, Topology.parse("2x4"), entries=entries, options=options)
    assert given and all(0 < seconds <= 30.0 for seconds in given)


def test_a_bad_ilp_time_limit_is_a_typed_error():
    with pytest.raises(TofuError, match="Options.joint_ilp_seconds"):
        Options(joint_ilp_seconds=-1.0)


def test_past_the_limit_the_recursion_plans():
    graph, entries = graph_of("mlp")
    topology = Topology.parse("2x2")
    small = search(graph, topology, entries=entries, options=Options(joint_choices=100))
    recursion = search(graph, topology, entries=entries, options=Options(joint_choices=0))
    assert not small.joint and not recursion.joint
    assert small.objective == recursion.objective


def _no_walk(*args, **kwargs):
    raise AssertionError("walked")


def test_an_op_table_past_its_bound_is_told_before_it_is_built(monkeypatch):
    graph, entries = graph_of("mlp")
    monkeypatch.setattr(joint, "_walk_ops", _no_walk)
    with pytest.raises(JointTooLarge, match="more than 1000 in all"):
        joint_model(graph, Topology.parse("2x2"), entries=entries, max_op_table=1000)


def test_op_tables_past_their_bound_in_all_are_told_before_the_walk(monkeypatch):
    """Each op's table within its bound, all of them past max_table_work: the DP would
    take too long (the ILP needs no tables)."""
    graph, entries = graph_of("transformer")
    topology = Topology.parse("2x2x2")
    model = joint_model(graph, topology, entries=entries).model
    largest = max(len(model.vectors[op]) * model.min_table(op)[1].size for op in model.vectors)
    monkeypatch.setattr(joint, "_walk_ops", _no_walk)
    with pytest.raises(JointTooLarge, match=f"entries in all .*more than {largest};"):
        joint_model(graph, topology, entries=entries, max_table_work=largest)


def test_an_ilp_past_its_bound_by_estimate_is_told_before_the_walk(monkeypatch):
    """Where the DP's tables are too wide, the search tries HiGHS on at most
    joint.ILP_VARIABLES columns: one estimated past ILP_ESTIMATE_SLACK times that is not
    walked (the estimate is within 5% of the columns)."""
    graph, entries = graph_of("lstm")
    model = joint_model(graph, Topology.parse("2x4"), entries=entries,
                        method=JointMethod.ILP).model
    columns = ilp._build(model, ilp.Linearisation.MARGINAL).num_columns
    joint_model(graph, Topology.parse("2x4"), entries=entries, method=JointMethod.ILP,
                max_ilp_columns=columns)
    monkeypatch.setattr(joint, "_walk_ops", _no_walk)
    with pytest.raises(JointTooLarge, match=f"more than {int(columns / 1.5)}"):
        joint_model(graph, Topology.parse("2x4"), entries=entries, method=JointMethod.ILP,
                    max_ilp_columns=int(columns / 1.5))


@pytest.mark.parametrize("name", ["mlp", "lstm", "transformer", "wresnet"])
@pytest.mark.parametrize("topology", ["2x2", "2x4", "2x2x2"])
def test_the_bound_a_search_skips_by_is_within_the_joint_models_own(name, topology):
    """The search skips a joint problem whose least_joint_choices is past its limit without
    building it: joint_model must then refuse it too, or the skip would drop a plan."""
    graph, entries = graph_of(name)
    least = least_joint_choices(graph, entries, Topology.parse(topology).ways)
    with pytest.raises(JointTooLarge, match=rf"more than {least - 1}\b"):
        joint_model(graph, Topology.parse(topology), entries=entries,
                    max_joint_choices=least - 1)


def test_one_level_is_the_recursion():
    graph, entries = graph_of("mlp")
    plan = search(graph, Topology.parse("8"), entries=entries)
    assert not plan.joint and len(plan.levels) == 1


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data(), st.sampled_from(["2x2", "2x3", "2x2x2"]))
def test_random_graphs_plan_the_joint_optimum(data, topology):
    case = random_step(HypothesisChooser(data), max_ops=5)
    graph = import_graph_def(case.graph_def, case.fetches).graph
    entries, topology = catalog(graph), Topology.parse(topology)
    try:           # graphs whose joint problem the search solves by default
        joint_model(graph, topology, entries=entries,
                    max_joint_choices=Options().joint_choices)
    except JointTooLarge:
        assume(False)
    _check(graph, entries, topology)


@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data(), st.sampled_from(["2x2", "2x3", "2x2x2"]))
def test_random_graphs_lookahead_is_bounded_by_the_joint_optimum(data, topology):
    """Two levels are one window: the lookahead is the joint optimum there; at three it
    is a plan of the joint problem, so never below its optimum."""
    case = random_step(HypothesisChooser(data), max_ops=5)
    graph = import_graph_def(case.graph_def, case.fetches).graph
    entries, topology = catalog(graph), Topology.parse(topology)
    try:
        optimum = joint_optimum(graph, topology, max_joint_choices=Options().joint_choices)
        ahead = lookahead_search(graph, topology, entries=entries)
    except (JointTooLarge, NoLookahead):
        assume(False)
    if len(topology.levels) == 2:
        assert ahead.objective == optimum
    else:
        assert ahead.objective >= optimum


def _same_models(a, b):
    assert a.keys == b.keys and a.model.domains == b.model.domains
    for op, chains in a.model.vectors.items():
        assert [[group for group, _ in chain] for chain in chains] == \
            [[group for group, _ in chain] for chain in b.model.vectors[op]]
        for chain, other in zip(chains, b.model.vectors[op]):
            assert all(np.array_equal(v, w) for (_, v), (_, w) in zip(chain, other))


@pytest.mark.parametrize("name,topology", [("lstm", "2x2"), ("transformer", "2x2"),
                                           ("mlp", "2x2x2")])
def test_a_walk_shared_among_processes_builds_the_sequential_model(name, topology,
                                                                    monkeypatch):
    graph, entries = graph_of(name)
    alone = joint_model(graph, Topology.parse(topology), entries=entries)
    monkeypatch.setattr(joint, "PARALLEL_CHAINS", 0)
    monkeypatch.setattr(joint, "_cores", lambda: 3)
    _same_models(joint_model(graph, Topology.parse(topology), entries=entries), alone)


def test_a_walking_process_that_dies_has_its_share_walked_by_the_caller(monkeypatch):
    graph, entries = graph_of("lstm")
    alone = joint_model(graph, Topology.parse("2x2"), entries=entries)
    monkeypatch.setattr(joint, "PARALLEL_CHAINS", 0)
    chains, caller = joint._Walk.chains, os.getpid()

    def dying(self, *args):
        if os.getpid() != caller:
            os._exit(1)
        return chains(self, *args)
    monkeypatch.setattr(joint._Walk, "chains", dying)
    monkeypatch.setattr(joint, "_cores", lambda: 2)
    _same_models(joint_model(graph, Topology.parse("2x2"), entries=entries), alone)


def test_a_walking_processs_error_reaches_the_caller(monkeypatch):
    graph, entries = graph_of("lstm")
    monkeypatch.setattr(joint, "PARALLEL_CHAINS", 0)
    monkeypatch.setattr(joint, "_cores", lambda: 2)
    chains, caller = joint._Walk.chains, os.getpid()

    def failing(self, model, op, *args):
        if os.getpid() != caller:
            raise JointTooLarge(f"walked {op.name} elsewhere", fix="none")
        return chains(self, model, op, *args)
    monkeypatch.setattr(joint._Walk, "chains", failing)
    with pytest.raises(JointTooLarge, match="elsewhere"):
        joint_model(graph, Topology.parse("2x2"), entries=entries)


def _each_entry_alone(problem, op, choice) -> list[tuple[np.ndarray, np.ndarray]]:
    """A choice's (bytes, transfers) per entry, each entry through `_finish` on its own
    boxes: nothing remembered, nothing keyed."""
    rank = max([len(t.shape) for t in problem.tensors.values()] + [1])
    batch = problem_module._Batch(rank, problem.k)
    staged = [problem_module._stage(entry, batch)
              for entry in problem_module._entries(problem, op, choice)]
    volumes, pairs = batch.run()
    return [problem_module._finish(problem, entry, volumes, pairs, rank, {})
            for entry in staged]


@pytest.mark.parametrize("name", ["wresnet", "transformer"])
@pytest.mark.parametrize("shared_reads", [False, True])
def test_cost_and_entry_vectors_are_each_entry_alone_each_distinct_entry_once(
        name, shared_reads):
    """The level's costing (cost_vectors, each distinct entry once across the search's
    levels) and the walk's (entry_vectors, its own memo) give every op's vectors as each
    entry costed alone does, at an uneven cut and the level below it (halos, partial
    results reduced above, views)."""
    graph, entries = graph_of(name)
    models = level_models(graph, Topology.parse("3x2"), entries,
                          options=Options(shared_reads=shared_reads))
    first = next(models)
    memo, made = {}, 0
    for model in (first, models.send(solve_level(first))):
        problem, vectors = model.problem, model.vectors
        for op in problem.ops:
            choices = problem.choices[op.name]
            found = entry_vectors(problem, op, choices, memo)
            made += sum(map(len, found))
            for choice, row, named, counts in zip(choices, found, vectors[op.name],
                                                  vectors.transfers(op.name)):
                alone = _each_entry_alone(problem, op, choice)
                assert len(row) == len(named) == len(alone)
                for (moved, transfers), (_, v), (_, n), (a, b) in zip(row, named, counts,
                                                                       alone):
                    assert np.array_equal(moved, a) and np.array_equal(transfers, b)
                    assert np.array_equal(v, a) and np.array_equal(n, b)
    assert len(memo) < made / 2
    assert len(first.problem.cache.entries) < made / 2


@pytest.mark.parametrize("name,topology,transfer_bytes,folds", [
    ("transformer", "2x2", 0.0, True), ("mlp", "2x2x2", 0.0, False),
    ("mlp", "2x2x2", 4096.0, False), ("wresnet", "2x2", 1000.5, True)])
def test_a_joint_models_min_tables_and_best_choices_are_its_full_tables(
        name, topology, transfer_bytes, folds):
    """The joint model's DP reads each op's min table alone (LevelModel.min_table: folded
    chain by chain over a large table, in chunks over a small one) and finds an op's
    choice at one cell (best_choice): equal, bit for bit, to the full table with its
    argmin (least bytes, then fewest transfers, then the first) at every cell, with a
    transfer price too (a fractional one: the sums must be taken in the same order)."""
    graph, entries = graph_of(name)
    built = joint_model(graph, Topology.parse(topology), entries=entries).model
    fast = LevelModel(None, built.coarse, built.vectors, built.domains,
                      transfer_bytes=transfer_bytes)
    full = dataclasses.replace(fast, _tables={}, _shared={}, _mins={}, _sums={})
    folded = 0
    for op in built.vectors:
        scope, table = fast.min_table(op)
        full_scope, full_table, argmin, _ = full.op_table(op)
        assert scope == full_scope and np.array_equal(table, full_table), op
        folded += table.ndim > 1 and table.size >= level._ROW_CELLS
        cells = list(np.ndindex(table.shape))
        for index in cells if len(cells) <= 4096 else cells[::len(cells) // 4096]:
            assert fast.best_choice(op, index) == argmin[index], (op, index)
    assert bool(folded) == folds
