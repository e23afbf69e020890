"""Exact checks of the search: one cut by integer programming, and all levels jointly.

ILP of one cut (`ilp_level`), over the same choices and byte vectors as the DP
(`LevelModel`): binary x[g,s] (group g stores state s), y[o,c] (op o runs choice c),
z[o,c,g,s] >= 0 for the product y[o,c] * x[g,s]; vector v[o,c,g] sums the vectors of
op o's tensors in group g under choice c, and m[o,c,g] = min_s v[o,c,g,s]:

    min  sum_{o,c} y[o,c] * sum_g m[o,c,g]  +  sum_{o,c,g,s} z[o,c,g,s] * (v[o,c,g,s] - m[o,c,g])
    s.t. sum_s x[g,s] = 1,   sum_c y[o,c] = 1,   z[o,c,g,s] >= y[o,c] + x[g,s] - 1,
         y[o,c] <= sum_{s: v[o,c,g,s] finite} x[g,s]          (only where some v is +inf)

With x binary and costs >= 0 the minimum puts z = y * x, so the objective is the op's
cost under its choices; y may stay continuous, since for fixed x it is a convex
combination of the op's choices whose cheapest vertex is optimal. A z is made only where
v - m > 0. Ops touching no group cost 0. HiGHS (`scipy.optimize.milp`, relative gap 0)
solves it; a result is exact only if HiGHS proves optimality.

Joint optimum of all levels (`joint_optimum`): the recursion fixes level 1 before it
solves level 2; the joint problem minimises total = c_1 + k_1 c_2 + k_1 k_2 c_3 + ...
over all levels' states and choices at once. It is a product-domain problem of the same
form. A group's joint state is a path (X_1, X_2, ...) through its state tree: X_1 a
level-1 state, X_2 a state of the level-2 tensor shape that X_1 leaves, and so on. An op's
joint choice is ((c_1, K_1), (c_2, K_2), ..., c_L), with K_l the level-l states of the
op's groups: the level-(l+1) op is part 0's local op under c_l and its tensors take the
part shapes under K_l (exactly `problem.sub_problem`, restricted to one op), so its
choices and vectors depend on (c_1, K_1, ..., c_l, K_l) only. The joint vector of group g
is sum_l k_1...k_{l-1} v_l[X_l] on the paths through K_1[g], ..., K_{L-1}[g] and +inf
elsewhere. `dp.solve` minimises it through the op tables (min over joint choices), the
ILP above through the choices; both are exact and must agree.

Limits: the joint problem enumerates, per op, every level-l choice under every state
combination of the op's groups at every level before the last — fine for tiny graphs at
2x2 and 2x2x2 devices, too large for real ones; past `max_joint_choices` it raises.
"""

from __future__ import annotations

import enum
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from tofu_tf.errors import PlanInfeasibleError, TofuError
from tofu_tf.graph import Graph
from tofu_tf.search import dp
from tofu_tf.search.coarsen import CoarseGraph
from tofu_tf.search.level import LevelModel, LevelResult, result_of
from tofu_tf.search.problem import (Problem, ProblemOp, TensorSpec, build_choices,
                                    cost_vectors, sub_problem)
from tofu_tf.search.recursive import SearchResult, level_models, search
from tofu_tf.search.topology import Topology

DEFAULT_TIME_LIMIT = 60.0            # seconds HiGHS may take per problem
MAX_JOINT_CHOICES = 2_000_000        # joint choices summed over ops, before giving up


# -- ILP of one cut --------------------------------------------------------------------------

@dataclass(frozen=True)
class IlpSolution:
    """What HiGHS found for one model."""
    assignment: tuple[int, ...]     # state index per group
    cost: float                     # HiGHS's objective value
    optimal: bool                   # HiGHS proved optimality
    seconds: float
    variables: int                  # x + y + z columns
    constraints: int


class Linearisation(enum.Enum):
    """How the ILP ties an op's choice to its groups' states (both exact)."""
    PRODUCT = "product"      # z >= y + x - 1 per positive reduced cost
    MARGINAL = "marginal"    # sum_s z = y per (op, group, choice); sum_c z = x per state


@dataclass
class _Program:
    """The ILP's columns and rows as flat arrays, appended block by block."""
    costs: list[np.ndarray] = field(default_factory=list)
    upper: list[np.ndarray] = field(default_factory=list)      # column upper bounds
    integral: list[np.ndarray] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    cols: list[np.ndarray] = field(default_factory=list)
    data: list[np.ndarray] = field(default_factory=list)
    lower_rhs: list[np.ndarray] = field(default_factory=list)
    upper_rhs: list[np.ndarray] = field(default_factory=list)
    num_columns: int = 0
    num_rows: int = 0

    def add_columns(self, costs, upper, integral: bool = False) -> np.ndarray:
        first, n = self.num_columns, len(costs)
        self.costs.append(np.asarray(costs, dtype=np.float64))
        self.upper.append(np.broadcast_to(np.asarray(upper, dtype=np.float64), (n,)))
        self.integral.append(np.full(n, int(integral)))
        self.num_columns += n
        return np.arange(first, first + n)

    def add_rows(self, row, col, data, lower, upper, count: int) -> None:
        """`count` rows, numbered 0..count-1 in `row`, with bounds lower..upper."""
        self.rows.append(np.asarray(row, dtype=np.int64) + self.num_rows)
        self.cols.append(np.asarray(col, dtype=np.int64))
        self.data.append(np.broadcast_to(np.asarray(data, dtype=np.float64), (len(row),)))
        self.lower_rhs.append(np.full(count, lower, dtype=np.float64))
        self.upper_rhs.append(np.full(count, upper, dtype=np.float64))
        self.num_rows += count

    def solve(self, time_limit: float):
        matrix = sparse.csr_array((np.concatenate(self.data), (np.concatenate(self.rows),
                                   np.concatenate(self.cols))),
                                  shape=(self.num_rows, self.num_columns))
        return milp(np.concatenate(self.costs), integrality=np.concatenate(self.integral),
                    bounds=Bounds(np.zeros(self.num_columns), np.concatenate(self.upper)),
                    constraints=LinearConstraint(matrix, np.concatenate(self.lower_rhs),
                                                 np.concatenate(self.upper_rhs)),
                    options={"time_limit": float(time_limit), "mip_rel_gap": 0.0})


@dataclass
class _Entries:
    """Every (op, choice, group of the op's scope) with its summed vector (zeros where the
    choice leaves the group alone), and the flat (entry, state) view of all of them."""
    choice: list[int] = field(default_factory=list)      # entry -> y index
    pair: list[int] = field(default_factory=list)        # entry -> (op, group) index
    group: list[int] = field(default_factory=list)       # entry -> group
    vectors: list[np.ndarray] = field(default_factory=list)
    choice_op: list[int] = field(default_factory=list)   # y index -> op index
    pair_group: list[int] = field(default_factory=list)  # (op, group) index -> group

    def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(entry, state, value) of every vector element."""
        lengths = np.array([len(v) for v in self.vectors], dtype=np.int64)
        values = np.concatenate(self.vectors) if self.vectors else np.zeros(0)
        entry = np.repeat(np.arange(len(lengths)), lengths)
        state = np.arange(len(values)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return entry, state, values


def _merged(model: LevelModel, entries) -> dict[int, np.ndarray]:
    """A choice's vectors summed per group (tensors of one group share its state)."""
    out: dict[int, np.ndarray] = {}
    for tensor, vector in entries:
        g = model.coarse.group_of[tensor]
        out[g] = out[g] + vector if g in out else np.asarray(vector, dtype=np.float64)
    return out


def _collect(model: LevelModel) -> _Entries:
    found = _Entries()
    for op_index, op in enumerate(op for op in model.vectors if model.op_scope(op)):
        scope = model.op_scope(op)                      # ops touching no group cost 0
        pairs = {g: len(found.pair_group) + i for i, g in enumerate(scope)}
        found.pair_group.extend(scope)
        for entries in model.vectors[op]:
            y = len(found.choice_op)
            found.choice_op.append(op_index)
            merged = _merged(model, entries)
            for g in scope:
                found.choice.append(y)
                found.pair.append(pairs[g])
                found.group.append(g)
                found.vectors.append(merged.get(g, np.zeros(model.domains[g])))
    return found


def _build(model: LevelModel, form: Linearisation) -> _Program:
    domains = np.asarray(model.domains, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(domains)[:-1]]).astype(np.int64)
    program, found = _Program(), _collect(model)
    x = program.add_columns(np.zeros(int(domains.sum())), 1.0, integral=True)
    entry, state, values = found.flat()
    finite = np.isfinite(values)
    least = np.full(len(found.vectors), np.inf)
    np.minimum.at(least, entry[finite], values[finite])
    choice = np.asarray(found.choice, dtype=np.int64)
    y_cost = np.zeros(len(found.choice_op))
    if form is Linearisation.PRODUCT:
        y_cost = np.bincount(choice, weights=least, minlength=len(y_cost))
    y = program.add_columns(y_cost, 1.0)
    x_col = offsets[np.asarray(found.group, dtype=np.int64)][entry] + state
    _one_hot_rows(program, domains, x, np.asarray(found.choice_op, dtype=np.int64), y)
    if form is Linearisation.PRODUCT:
        reduced = np.where(finite, values - least[entry], 0.0)
        _product_rows(program, reduced > 0, reduced, y[choice][entry], x_col)
        _support_rows(program, finite, entry, y[choice], x_col, len(least))
    else:
        pair_offsets = np.concatenate([[0], np.cumsum(domains[found.pair_group])[:-1]])
        state_row = pair_offsets[np.asarray(found.pair, dtype=np.int64)][entry] + state
        _marginal_rows(program, values, finite, entry, state_row, y[choice], x_col)
    return program


def _one_hot_rows(program: _Program, domains, x, choice_op, y) -> None:
    """sum_s x[g,s] = 1 per group; sum_c y[o,c] = 1 per op."""
    program.add_rows(np.repeat(np.arange(len(domains)), domains), x, 1.0, 1.0, 1.0,
                     len(domains))
    ops = int(choice_op.max()) + 1 if len(choice_op) else 0
    program.add_rows(choice_op, y, 1.0, 1.0, 1.0, ops)


def _product_rows(program: _Program, keep, reduced, y_col, x_col) -> None:
    """z >= y + x - 1 for every (entry, state) with a positive reduced cost."""
    z = program.add_columns(reduced[keep], np.inf)
    row = np.repeat(np.arange(len(z)), 3)
    col = np.stack([z, y_col[keep], x_col[keep]], axis=1).ravel()
    program.add_rows(row, col, np.tile([1.0, -1.0, -1.0], len(z)), -1.0, np.inf, len(z))


def _support_rows(program: _Program, finite, entry, y_of_entry, x_col, entries) -> None:
    """y <= sum of x over the finite states, for entries with an infinite state."""
    partial = np.bincount(entry[~finite], minlength=entries) > 0
    if not partial.any():
        return
    local = np.cumsum(partial) - 1                      # entry -> its row
    pick = finite & partial[entry]
    row = np.concatenate([local[partial], local[entry[pick]]])
    col = np.concatenate([y_of_entry[partial], x_col[pick]])
    data = np.concatenate([np.ones(int(partial.sum())), -np.ones(int(pick.sum()))])
    program.add_rows(row, col, data, -np.inf, 0.0, int(partial.sum()))


def _marginal_rows(program: _Program, values, finite, entry, state_row, y_of_entry,
                   x_col) -> None:
    """One z per (entry, state), zero where the cost is infinite; per entry
    sum_s z = y, and per (op, group, state) sum over choices z = x."""
    z = program.add_columns(np.where(finite, values, 0.0), np.where(finite, np.inf, 0.0))
    entries = int(entry.max()) + 1 if len(entry) else 0
    program.add_rows(np.concatenate([entry, np.arange(entries)]),
                     np.concatenate([z, y_of_entry]),
                     np.concatenate([np.ones(len(z)), -np.ones(entries)]), 0.0, 0.0, entries)
    states = int(state_row.max()) + 1 if len(state_row) else 0
    first_x = np.zeros(states, dtype=np.int64)
    first_x[state_row] = x_col
    program.add_rows(np.concatenate([state_row, np.arange(states)]),
                     np.concatenate([z, first_x]),
                     np.concatenate([np.ones(len(z)), -np.ones(states)]), 0.0, 0.0, states)


def ilp_minimum(model: LevelModel, time_limit: float = DEFAULT_TIME_LIMIT,
                form: Linearisation = Linearisation.MARGINAL) -> IlpSolution:
    """Minimise the model's objective by ILP. Needs only `vectors`, `domains` and
    `coarse.group_of` of the model. Raises PlanInfeasibleError if HiGHS finds nothing."""
    start = time.perf_counter()
    program = _build(model, form)
    result = program.solve(time_limit)
    if result.x is None:
        raise PlanInfeasibleError(
            f"HiGHS found no solution of the cut's ILP ({program.num_columns} variables, "
            f"{program.num_rows} constraints, time limit {time_limit:g} s): "
            f"{result.message}",
            fix="raise time_limit, or check the model with level.solve_level (the DP).")
    offsets = np.concatenate([[0], np.cumsum(model.domains)]).astype(np.int64)
    assignment = tuple(int(np.argmax(result.x[offsets[g]:offsets[g + 1]]))
                       for g in range(len(model.domains)))
    return IlpSolution(assignment, float(result.fun), result.status == 0,
                       time.perf_counter() - start, program.num_columns, program.num_rows)


def ilp_level(model: LevelModel, time_limit: float = DEFAULT_TIME_LIMIT,
              form: Linearisation = Linearisation.MARGINAL) -> LevelResult:
    """The optimum of one cut by ILP, as a LevelResult with `exact=True`. Raises
    PlanInfeasibleError when HiGHS fails or does not prove optimality in time."""
    solution = ilp_minimum(model, time_limit, form)
    if not solution.optimal:
        raise PlanInfeasibleError(
            f"HiGHS did not prove the cut's ILP optimal within {time_limit:g} s "
            f"({solution.variables} variables, {solution.constraints} constraints).",
            fix="raise time_limit, or use level.solve_level (the exact DP).")
    return result_of(model, solution.assignment, True, solution.seconds)


def ilp_search(graph: Graph, topology: Topology,
               time_limit: float = DEFAULT_TIME_LIMIT) -> SearchResult:
    """The recursive search with every level solved by ILP."""
    return search(graph, topology, solver=lambda model: ilp_level(model, time_limit))
