"""The exact checks: the ILP equals the DP and brute force on random cuts and on every
reference model's first cut; the joint optimum of all levels bounds the recursive plan."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tofu_tf.errors import PlanInfeasibleError, TofuError
from tofu_tf.models import build
from tofu_tf.op_semantics.analysis import REPLICATED, Split
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.options import Options, VariableStorage
from tofu_tf.importer.graphdef_io import import_concrete_function
from tofu_tf.search import dp
from tofu_tf.search.coarsen import CoarseGraph
from tofu_tf.search.exact import (JointMethod, Linearisation, ilp_level, ilp_minimum,
                                  ilp_search, joint_model, joint_optimum, recursion_under,
                                  state_tree)
from tofu_tf.search.level import LevelModel, solve_level
from tofu_tf.search.problem import Problem, TensorSpec
from tofu_tf.search.recursive import level_models, search
from tofu_tf.search.topology import Topology

REFERENCE = [("mlp", "sgd"), ("wresnet", "sgd"), ("lstm", "sgd"), ("transformer", "sgd"),
             ("mlp", "adam")]
_GRAPHS = {}


def graph_of(name, optimizer="sgd"):
    if (name, optimizer) not in _GRAPHS:
        step = build(name, optimizer=optimizer, batch_size=8)
        graph = import_concrete_function(step.concrete_function).graph
        _GRAPHS[name, optimizer] = graph, catalog(graph, strict=True)
    return _GRAPHS[name, optimizer]


def first_cut(name, optimizer="sgd", devices=4, options=Options()) -> LevelModel:
    graph, entries = graph_of(name, optimizer)
    return next(level_models(graph, Topology.default(devices), entries, options=options))


# -- random cuts ---------------------------------------------------------------------------

@st.composite
def random_cuts(draw, forbidden: bool = False):
    """A LevelModel with random groups, ops, choices and vectors (problem=None). With
    `forbidden`, later choices may have +inf states (the first choice stays finite)."""
    domains = draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
    members = tuple(tuple(f"t{g}_{j}" for j in range(draw(st.integers(1, 2))))
                    for g in range(len(domains)))
    group_of = {t: g for g, names in enumerate(members) for t in names}
    vectors = {}
    for o in range(draw(st.integers(1, 6))):
        choices = []
        for c in range(draw(st.integers(1, 4))):
            tensors = draw(st.lists(st.sampled_from(sorted(group_of)), max_size=3))
            choices.append([(t, _vector(draw, domains[group_of[t]], forbidden and c > 0))
                            for t in tensors])
        vectors[f"op{o}"] = choices
    coarse = CoarseGraph(group_of, members, tuple(float(g) for g in range(len(domains))), {})
    return LevelModel(None, coarse, vectors, domains)


def _vector(draw, size: int, forbidden: bool) -> np.ndarray:
    values = np.array(draw(st.lists(st.integers(0, 50), min_size=size, max_size=size)),
                      dtype=np.float64)
    if forbidden:
        mask = draw(st.lists(st.booleans(), min_size=size, max_size=size))
        values[np.array(mask, dtype=bool)] = np.inf
    return values


def brute_force(model: LevelModel) -> float:
    """min over every assignment, through the op tables broadcast over all groups."""
    total = np.zeros(model.domains)
    for op in model.vectors:
        scope, table, *_ = model.op_table(op)
        total = total + table.reshape([model.domains[g] if g in scope else 1
                                       for g in range(len(model.domains))])
    return float(total.min())


def _check_ilp_against_dp(model: LevelModel) -> None:
    factors, constant = model.factors()
    best = dp.solve(model.domains, factors)
    assert best.exact
    truth = brute_force(model)
    assert math.isclose(best.cost + constant, truth, rel_tol=1e-9, abs_tol=1e-9)
    for form in Linearisation:
        found = ilp_minimum(model, form=form)
        assert found.optimal
        assert math.isclose(found.cost, truth, rel_tol=1e-9, abs_tol=1e-6)
        assert math.isclose(model.evaluate(found.assignment)[0], truth, rel_tol=1e-9,
                            abs_tol=1e-9)


@settings(max_examples=220, deadline=None)
@given(random_cuts())
def test_ilp_equals_dp_and_brute_force(model):
    _check_ilp_against_dp(model)


@settings(max_examples=80, deadline=None)
@given(random_cuts(forbidden=True))
def test_ilp_with_forbidden_states_equals_dp_and_brute_force(model):
    _check_ilp_against_dp(model)


def _bytes_and_transfers(model: LevelModel, assignment) -> tuple[float, int]:
    total, transfers = 0.0, 0
    for op in model.vectors:
        scope, table, _, moves = model.op_table(op)
        index = tuple(assignment[g] for g in scope)
        total += table[index]
        transfers += int(moves[index])
    return total, transfers


@settings(max_examples=150, deadline=None)
@given(random_cuts())
def test_byte_ties_go_to_the_fewest_transfers(model):
    """The ranked DP keeps the least bytes exactly and, among the assignments with those
    bytes, makes the fewest transfers (brute force over every assignment)."""
    everything = [_bytes_and_transfers(model, a)
                  for a in itertools.product(*(range(d) for d in model.domains))]
    least = min(b for b, _ in everything)
    fewest = min(t for b, t in everything if b == least)
    factors, _ = model.factors(ranked=True)
    solution = dp.solve(model.domains, factors)
    assert _bytes_and_transfers(model, solution.assignment) == (least, fewest)
    assert model.evaluate(solution.assignment)[0] == least


def test_a_bias_all_reduced_beats_split_gather_and_reduce_scatter():
    """Both move 2 (k - 1) x its bytes over a cut; stored R it is one transfer, not two."""
    bias = np.array([0.0, 0.0])          # states: S(0), R
    gather = np.array([4.0, 0.0])        # the forward op reads it whole
    reduce = np.array([4.0, 8.0])        # its gradient: reduce-scatter or all-reduce
    coarse = CoarseGraph({"b": 0, "g": 0}, (("b", "g"),), (0.0,), {})
    model = LevelModel(None, coarse, {"add": [[("b", gather)]], "grad": [[("g", reduce)]],
                                      "read": [[("b", bias)]]}, [2])
    assert model.factors()[0][0].table.tolist() == [8.0, 8.0]
    assert dp.solve([2], model.factors(ranked=True)[0]).assignment == (1,)


# -- reference models: one cut -------------------------------------------------------------

@pytest.mark.parametrize("name,optimizer", REFERENCE)
def test_first_cut_dp_equals_ilp(name, optimizer):
    model = first_cut(name, optimizer)
    by_dp, by_ilp = solve_level(model), ilp_level(model)
    assert by_ilp.exact and by_dp.exact
    assert math.isclose(by_dp.cost, by_ilp.cost, rel_tol=1e-9)
    print(f"{name}/{optimizer} 4 devices, level 1: DP {by_dp.cost:.0f} B in "
          f"{by_dp.seconds:.3f} s, ILP {by_ilp.cost:.0f} B in {by_ilp.seconds:.3f} s")


# Every term of the objective on: bytes, repeated work, and a latency per transfer large
# enough to change the plans of the tiny models (this_cpu's own is 2.56 MB).
PRICED = Options(flop_bytes=1.0, transfer_bytes=4096.0)


@pytest.mark.parametrize("name", ["mlp", "wresnet", "lstm", "transformer"])
def test_dp_equals_ilp_with_work_and_transfers_priced(name):
    model = first_cut(name, options=PRICED)
    by_dp, by_ilp = solve_level(model), ilp_level(model)
    assert by_dp.work > 0 or by_dp.latency > 0
    assert math.isclose(by_dp.cost, by_ilp.cost, rel_tol=1e-9)
    # the fewest-bytes assignment costs no less in the priced model
    plain = solve_level(first_cut(name, options=Options(flop_bytes=0.0)))
    assert model.evaluate(plain.assignment)[0] >= by_dp.cost - 1e-6


@pytest.mark.parametrize("name", ["mlp", "lstm"])
def test_product_linearisation_agrees(name):
    model = first_cut(name)
    found = ilp_minimum(model, form=Linearisation.PRODUCT)
    assert found.optimal
    assert math.isclose(found.cost, solve_level(model).cost, rel_tol=1e-9)


def _frustrated_triangle() -> LevelModel:
    """Three groups of two states and three ops, one per pair of groups, each costing 1
    where its two groups take the same state (choice c prefers state c in the first group
    and the other state in the second). Some pair must agree: the optimum is 1; the
    marginal LP relaxation costs 0 (every x, y and z one half)."""
    domains = [2, 2, 2]
    members = tuple((f"t{g}",) for g in range(3))
    group_of = {f"t{g}": g for g in range(3)}
    prefer = [np.array([0.0, 1.0]), np.array([1.0, 0.0])]
    vectors = {f"op{a}{b}": [[(f"t{a}", prefer[c]), (f"t{b}", prefer[1 - c])]
                             for c in range(2)]
               for a, b in ((0, 1), (1, 2), (0, 2))}
    coarse = CoarseGraph(group_of, members, (0.0, 1.0, 2.0), {})
    return LevelModel(None, coarse, vectors, domains)


def test_the_lp_bound_proves_an_integral_relaxation_and_the_mip_the_rest():
    """Where the marginal LP's optimum is integral, its states are the optimum (their
    cost meets the LP's bound); where it is fractional, HiGHS's MIP finds the optimum."""
    model = first_cut("wresnet")
    found = ilp_minimum(model)
    assert found.optimal and found.relaxed
    assert math.isclose(found.cost, solve_level(model).cost, rel_tol=1e-9)
    triangle = _frustrated_triangle()
    assert brute_force(triangle) == 1.0
    found = ilp_minimum(triangle)
    assert found.optimal and not found.relaxed and found.cost == 1.0


def test_ilp_search_solves_every_level_exactly():
    graph, entries = graph_of("mlp", "adam")
    by_ilp = ilp_search(graph, Topology.default(4))
    by_dp = search(graph, Topology.default(4), entries=entries,
                   options=Options(joint_choices=0))
    assert all(level.exact for level in by_ilp.levels)
    assert math.isclose(by_ilp.levels[0].cost, by_dp.levels[0].cost, rel_tol=1e-9)


def test_ilp_out_of_time_raises():
    with pytest.raises(PlanInfeasibleError, match="HiGHS"):
        ilp_level(first_cut("mlp"), time_limit=0.0)


# -- joint optimum of all levels -----------------------------------------------------------

def _recursive_and_joint(name, optimizer, devices, method=JointMethod.DP):
    graph, entries = graph_of(name, optimizer)
    topology = Topology.default(devices)
    result = search(graph, topology, entries=entries, options=Options(joint_choices=0))
    joint = joint_model(graph, topology, entries=entries)
    # the joint pieces, built per op, price the recursive plan exactly as the recursion does
    assert math.isclose(joint.plan_cost(result), result.objective, rel_tol=1e-9)
    best = joint.solve(method)
    gap = result.objective - best.cost
    print(f"{name}/{optimizer} {devices} devices ({topology}): recursive "
          f"{result.objective:.0f} B, joint {best.cost:.0f} B, gap {gap:.0f} B "
          f"({gap / result.objective:.2%}), joint solved in {best.seconds:.2f} s")
    return result, best


@pytest.mark.parametrize("name,optimizer", REFERENCE)
def test_joint_optimum_bounds_the_recursive_plan(name, optimizer):
    result, best = _recursive_and_joint(name, optimizer, 4)
    assert best.cost <= result.objective * (1 + 1e-9)


def test_joint_dp_and_ilp_agree():
    result, best = _recursive_and_joint("mlp", "sgd", 4, JointMethod.BOTH)
    graph, _ = graph_of("mlp")
    assert joint_optimum(graph, Topology.default(4), JointMethod.ILP) == pytest.approx(
        best.cost, rel=1e-9)


def test_joint_optimum_of_three_levels():
    result, best = _recursive_and_joint("mlp", "sgd", 8)
    assert len(result.levels) == 3
    assert best.cost <= result.objective * (1 + 1e-9)


@pytest.mark.parametrize("name,devices", [("mlp", 4), ("lstm", 4), ("wresnet", 4), ("mlp", 8)])
def test_recursion_under_the_joint_first_level(name, devices):
    """The recursion under the joint optimum's level-1 states lies between the joint
    optimum and the recursive plan: level 1 fixed by its own cost is where the gap is."""
    graph, entries = graph_of(name)
    topology = Topology.default(devices)
    own = search(graph, topology, entries=entries,
                 options=Options(variable_storage=VariableStorage.REPLICABLE, joint_choices=0))
    joint = joint_model(graph, topology, entries=entries)
    # the projection gives the recursive plan's own level-1 states back
    assert joint.first_level(joint.plan_leaves(own))[0] == own.levels[0].assignment
    best = joint.solve()
    under = recursion_under(graph, topology, joint.first_level(best.leaves), entries=entries)
    assert best.cost * (1 - 1e-9) <= under.objective <= own.objective * (1 + 1e-9)
    assert under.levels[0].cost >= own.levels[0].cost * (1 - 1e-9)   # level 1 is exact
    if devices == 4:       # two levels: the second is exact under any first
        assert under.objective == pytest.approx(best.cost, rel=1e-9)


def test_joint_problem_too_large_raises():
    graph, entries = graph_of("mlp")
    with pytest.raises(TofuError, match="joint choices"):
        joint_model(graph, Topology.default(4), entries=entries, max_joint_choices=10)


def test_state_tree_leaves_follow_part_shapes():
    base = Problem(2, [], {}, replicable=frozenset({"w"}))
    tree = state_tree(TensorSpec("x", (4, 6), "float32"), base, (2, 2))
    assert tree.states == (Split(0), Split(1))
    assert tree.size == 4 and tree.leaf((1, 0)) == 2
    replicable = state_tree(TensorSpec("w", (4, 1), "float32"), base, (2, 2))
    assert replicable.states == (Split(0), REPLICATED)
    assert [child.size for child in replicable.children] == [2, 2]
    assert list(itertools.accumulate(c.size for c in replicable.children)) == [2, 4]
