"""The elimination DP is exact: brute force on random factor graphs."""

import itertools

import numpy as np
from hypothesis import given, settings, strategies as st

from tofu_tf.search.dp import Factor, _Eliminator, evaluate, largest_table, solve


@st.composite
def factor_graphs(draw):
    n = draw(st.integers(1, 6))
    domains = [draw(st.integers(1, 4)) for _ in range(n)]
    factors = []
    for _ in range(draw(st.integers(0, 8))):
        size = draw(st.integers(1, min(n, 3)))
        scope = tuple(draw(st.permutations(range(n)))[:size])
        table = np.array(draw(st.lists(st.integers(0, 50),
                                       min_size=int(np.prod([domains[v] for v in scope])),
                                       max_size=int(np.prod([domains[v] for v in scope])))),
                         dtype=float).reshape([domains[v] for v in scope])
        factors.append(Factor(scope, table))
    order = draw(st.permutations(range(n)))
    return domains, factors, list(order)


def _brute_force(domains, factors):
    return min(evaluate(factors, a) for a in itertools.product(*[range(d) for d in domains]))


@settings(max_examples=250, deadline=None)
@given(factor_graphs())
def test_dp_equals_brute_force(case):
    domains, factors, order = case
    solution = solve(domains, factors, order)
    assert solution.exact
    assert abs(solution.cost - _brute_force(domains, factors)) < 1e-9
    assert abs(evaluate(factors, solution.assignment) - solution.cost) < 1e-9


@settings(max_examples=100, deadline=None)
@given(factor_graphs())
def test_fallback_reports_a_consistent_assignment(case):
    domains, factors, order = case
    solution = solve(domains, factors, order, max_table=2, beam=1)
    assert abs(evaluate(factors, solution.assignment) - solution.cost) < 1e-9
    assert solution.cost >= _brute_force(domains, factors) - 1e-9
    if solution.restricted_steps == 0:
        assert solution.exact


def _sizes_from_tables(elim: _Eliminator) -> list[int]:
    """Each variable's combined-table size, recounted from the live tables."""
    sizes = []
    for v in range(len(elim.allowed)):
        members = {v} | {u for tid in elim.touching[v] for u in elim.tables[tid].scope}
        sizes.append(int(np.prod([len(elim.allowed[u]) for u in members], dtype=object)))
    return sizes


@settings(max_examples=150, deadline=None)
@given(factor_graphs(), st.sampled_from([2, 4, 2 ** 22]))
def test_tracked_sizes_equal_recounted_sizes(case, max_table):
    """The sizes kept up to date table by table are those recounted from scratch, after
    every elimination (restricted or not)."""
    domains, factors, order = case
    elim = _Eliminator(domains, factors, max_table, beam=1)
    assert elim.sizes == _sizes_from_tables(elim)
    for v in order:
        elim.eliminate(v)
        assert elim.sizes == _sizes_from_tables(elim)


def test_chain_of_thousands_stays_small():
    """A long chain with a skip every few links: the tables stay tiny and the DP exact."""
    n, rng = 3000, np.random.default_rng(0)
    domains = [4] * n
    factors = [Factor((i, i + 1), rng.integers(0, 9, (4, 4)).astype(float)) for i in range(n - 1)]
    factors += [Factor((i, i + 3), rng.integers(0, 9, (4, 4)).astype(float))
                for i in range(0, n - 3, 5)]
    solution = solve(domains, factors)
    assert solution.exact and solution.max_table <= 4 ** 4
    assert abs(evaluate(factors, solution.assignment) - solution.cost) < 1e-6


def test_wide_factors_past_numpy_dimension_limit():
    """Two factors of 51 variables meet at one variable: fixed (one-state) variables add no
    axis, so combining them never needs more than 64 dimensions."""
    domains = [1] * 100 + [2]
    rng = np.random.default_rng(1)
    left = Factor(tuple(range(50)) + (100,), rng.integers(0, 9, [1] * 50 + [2]).astype(float))
    right = Factor(tuple(range(50, 100)) + (100,),
                   rng.integers(0, 9, [1] * 50 + [2]).astype(float))
    solution = solve(domains, [left, right])
    assert solution.exact
    assert solution.cost == float((left.table + right.table).min())
    assert abs(evaluate([left, right], solution.assignment) - solution.cost) < 1e-9


@st.composite
def choice_terms(draw):
    shape = [draw(st.integers(1, 4)) for _ in range(draw(st.integers(0, 3)))]
    small = st.integers(0, 2)           # few values: many ties between choices
    per_choice = []
    for _ in range(draw(st.integers(1, 8))):
        terms = []
        for _ in range(draw(st.integers(0, 3)) if shape else 0):
            axis = draw(st.integers(0, len(shape) - 1))
            vector = np.array(draw(st.lists(small, min_size=shape[axis],
                                            max_size=shape[axis])), dtype=float)
            terms.append((axis, vector, (vector > 0).astype(np.int64)))
        per_choice.append(terms)
    work = draw(st.one_of(st.none(), st.lists(small, min_size=len(per_choice),
                                              max_size=len(per_choice))))
    return (shape, per_choice, None if work is None else np.array(work, dtype=float),
            float(draw(small)), draw(st.integers(1, 40)))


@settings(max_examples=300, deadline=None)
@given(choice_terms())
def test_op_tables_are_the_brute_force_min_over_choices(case):
    """Per cell: least cost, then fewest transfers, then the first choice, whichever
    chunks the choices are taken in."""
    from tofu_tf.search import level
    shape, per_choice, work, transfer_bytes, chunk = case
    saved, level._CHUNK = level._CHUNK, chunk
    try:
        least, argmin, chosen = level._min_table(per_choice, shape, work, transfer_bytes)
    finally:
        level._CHUNK = saved
    for cell in itertools.product(*[range(n) for n in shape]):
        ranked = []
        for c, terms in enumerate(per_choice):
            moved = sum(int(count[cell[axis]]) for axis, _, count in terms)
            cost = (0.0 if work is None else work[c]) + transfer_bytes * moved + sum(
                vector[cell[axis]] for axis, vector, _ in terms)
            ranked.append((cost, moved, c))
        assert (least[cell], chosen[cell], argmin[cell]) == min(ranked)


@settings(max_examples=200, deadline=None)
@given(factor_graphs())
def test_the_largest_table_is_known_from_the_scopes_alone(graph):
    domains, factors, order = graph
    assert largest_table(domains, [f.scope for f in factors], order) == \
        solve(domains, factors, order).max_table
