"""The ILP of one cut (`ilp_minimum`; `exact.ilp_level` as a LevelResult), over the DP's
own choices and byte vectors (`LevelModel`).
Binary x[g,s]: group g stores state s; y[o,c] in [0, 1]: op o runs choice c; v[o,c,g] is
the sum of the vectors of op o's tensors in group g under c (+inf: a state the choice
cannot meet; only the joint problem below has those), w[o,c] the choice's work (level.py),
a cost of y[o,c] in both forms. Two exact linearisations:

  MARGINAL (default): z[o,c,g,s] >= 0 for each finite v[o,c,g,s];  min sum z v + w y  s.t.
      sum_s x[g,s] = 1,  sum_c y[o,c] = 1,  sum_s z[o,c,g,s] = y[o,c],  sum_c z[o,c,g,s] = x[g,s]
  PRODUCT: m[o,c,g] = min_s v[o,c,g,s], z[o,c,g,s] >= 0 where v - m > 0;
      min sum y[o,c] (w[o,c] + sum_g m[o,c,g]) + sum z (v - m)  s.t.  one-hot x and y,
      z[o,c,g,s] >= y[o,c] + x[g,s] - 1,  y[o,c] <= sum_{s: v finite} x[g,s]

With x binary both force z = y x at the stored states (costs are >= 0), so an op costs
the y-mix of its choices' costs, least at a vertex: y needs no integrality. MARGINAL's LP
relaxation is far tighter (50x faster on a tiny Wide ResNet cut). Ops touching no
group cost 0. HiGHS (`scipy.optimize.milp`, relative gap 0) solves it; a result counts
only if it is proved optimal.

MARGINAL's relaxation is often integral (every joint problem of the tiny reference models
but WResNet's at 2x4): so its LP is solved first, and where the states it picks (each
group's largest x) cost exactly what the LP bounds every assignment by, within HiGHS's own
MIP gap (PROOF_GAP), they are the optimum, without the MIP's setup and search (the
Transformer's joint problem at 2x2x2, 800k columns: 5.8 s against 14.9 s; the search's
joint ILP of the tiny LSTM at 2x4 with views: 1.0 s against 1.9-2.4 s; the LSTM's joint
problem at 2x2x2, 4.1 s against 2.6 s). Else the MIP solves it in the time left, its own
root LP again (WResNet's at 2x4, two groups at one half: 8.3 s against 5.0 s). The LP runs
without presolve: with it, HiGHS returned different optimal vertices of one LP on a loaded
machine (so different plans of equal cost); without it, the same on every run.
"""

from __future__ import annotations

import enum
import functools
import time
from dataclasses import dataclass, field

import numpy as np
from absl import logging
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from tofu_tf.errors import PlanInfeasibleError
from tofu_tf.search.level import LevelModel

DEFAULT_TIME_LIMIT = 60.0            # seconds HiGHS may take per problem
# An assignment whose exact cost exceeds the LP relaxation's bound by at most this is
# optimal: the absolute gap at which HiGHS's MIP stops too (mip_abs_gap's default).
PROOF_GAP = 1e-6


@dataclass(frozen=True)
class IlpSolution:
    """What HiGHS found for one model."""
    assignment: tuple[int, ...]     # state index per group
    cost: float                     # the model's objective at `assignment` (exact)
    optimal: bool                   # proved optimal (LP bound met, or HiGHS's MIP)
    seconds: float
    variables: int                  # x + y + z columns
    constraints: int
    relaxed: bool = False           # proved by the LP relaxation alone (no MIP)


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

    @functools.cached_property
    def _assembled(self) -> tuple:
        """(costs, integrality, bounds, constraints) as milp takes them: made once, after
        `_build` has added every block, for the LP and the MIP alike."""
        matrix = sparse.csr_array((np.concatenate(self.data), (np.concatenate(self.rows),
                                   np.concatenate(self.cols))),
                                  shape=(self.num_rows, self.num_columns))
        return (np.concatenate(self.costs), np.concatenate(self.integral),
                Bounds(np.zeros(self.num_columns), np.concatenate(self.upper)),
                LinearConstraint(matrix, np.concatenate(self.lower_rhs),
                                 np.concatenate(self.upper_rhs)))

    def solve(self, time_limit: float, node_limit: int | None = None,
              relaxed: bool = False):
        """HiGHS's result for the program (`relaxed`: its LP relaxation)."""
        costs, integral, bounds, constraints = self._assembled
        # the MIP's presolve is deterministic; the LP's, on a loaded machine, is not
        return milp(costs, integrality=np.zeros_like(integral) if relaxed else integral,
                    bounds=bounds, constraints=constraints,
                    options={"time_limit": float(time_limit), "mip_rel_gap": 0.0,
                             **({} if node_limit is None else {"node_limit": node_limit}),
                             **({"presolve": False} if relaxed else {})})


@dataclass
class _Entries:
    """Every (op, choice, group of the op's scope) with its summed vector (zeros where the
    choice leaves the group alone), and the flat (entry, state) view of all of them."""
    choice: list[int] = field(default_factory=list)      # entry -> y index
    pair: list[int] = field(default_factory=list)        # entry -> (op, group) index
    group: list[int] = field(default_factory=list)       # entry -> group
    vectors: list[np.ndarray] = field(default_factory=list)
    choice_op: list[int] = field(default_factory=list)   # y index -> op index
    work: list[float] = field(default_factory=list)      # y index -> its choice's work
    pair_group: list[int] = field(default_factory=list)  # (op, group) index -> group

    def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(entry, state, value) of every vector element."""
        lengths = np.array([len(v) for v in self.vectors], dtype=np.int64)
        values = np.concatenate(self.vectors) if self.vectors else np.zeros(0)
        entry = np.repeat(np.arange(len(lengths)), lengths)
        state = np.arange(len(values)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return entry, state, values


def merged_vectors(group_of, entries) -> dict[int, np.ndarray]:
    """A choice's vectors summed per group (tensors of one group share its state)."""
    out: dict[int, np.ndarray] = {}
    for tensor, vector in entries:
        g = group_of[tensor]
        out[g] = out[g] + vector if g in out else np.asarray(vector, dtype=np.float64)
    return out


def _collect(model: LevelModel) -> _Entries:
    found = _Entries()
    for op_index, op in enumerate(op for op in model.vectors if model.op_scope(op)):
        scope = model.op_scope(op)                      # ops touching no group cost 0
        pairs = {g: len(found.pair_group) + i for i, g in enumerate(scope)}
        found.pair_group.extend(scope)
        for entries, work in zip(model.priced(op), model.work(op)):
            y = len(found.choice_op)
            found.choice_op.append(op_index)
            found.work.append(float(work))
            merged = merged_vectors(model.coarse.group_of, entries)
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
    least[np.isinf(least)] = 0.0              # no finite state: the support row bars it
    choice = np.asarray(found.choice, dtype=np.int64)
    y_cost = np.asarray(found.work, dtype=np.float64)
    if form is Linearisation.PRODUCT:
        y_cost = y_cost + np.bincount(choice, weights=least, minlength=len(y_cost))
    y = program.add_columns(y_cost, 1.0)
    x_col = offsets[np.asarray(found.group, dtype=np.int64)][entry] + state
    _one_hot_rows(program, domains, x, np.asarray(found.choice_op, dtype=np.int64), y)
    if form is Linearisation.PRODUCT:
        reduced = np.zeros(len(values))
        reduced[finite] = values[finite] - least[entry[finite]]
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
    """One z per (entry, state) of finite cost (an infinite one is fixed at 0, so left
    out); per entry sum_s z = y, and per (op, group, state) sum over choices z = x."""
    z = program.add_columns(values[finite], np.inf)
    entries = len(y_of_entry)
    program.add_rows(np.concatenate([entry[finite], np.arange(entries)]),
                     np.concatenate([z, y_of_entry]),
                     np.concatenate([np.ones(len(z)), -np.ones(entries)]), 0.0, 0.0, entries)
    states = int(state_row.max()) + 1 if len(state_row) else 0
    x_of_row = np.zeros(states, dtype=np.int64)
    x_of_row[state_row] = x_col
    program.add_rows(np.concatenate([state_row[finite], np.arange(states)]),
                     np.concatenate([z, x_of_row]),
                     np.concatenate([np.ones(len(z)), -np.ones(states)]), 0.0, 0.0, states)


def ilp_minimum(model: LevelModel, time_limit: float = DEFAULT_TIME_LIMIT,
                form: Linearisation = Linearisation.MARGINAL,
                max_variables: int | None = None,
                node_limit: int | None = None) -> IlpSolution:
    """Minimise the model's objective by ILP. Needs only `vectors`, `domains` and
    `coarse.group_of` of the model. Raises PlanInfeasibleError if HiGHS finds nothing,
    or before solving where the program has more than `max_variables` columns. HiGHS
    stops at `time_limit` seconds or after `node_limit` branch-and-bound nodes (a bound
    of work that, unlike the time, does not depend on the machine's speed or load).
    MARGINAL's LP relaxation is solved first (module docstring); `time_limit` bounds it
    and the MIP together."""
    start = time.perf_counter()
    program = _build(model, form)
    if max_variables is not None and program.num_columns > max_variables:
        raise PlanInfeasibleError(
            f"the ILP has {program.num_columns} variables, more than {max_variables}.",
            fix="solve it by the DP, or call ilp_minimum without max_variables.")
    if form is Linearisation.MARGINAL:
        relaxation = program.solve(time_limit, relaxed=True)
        if relaxation.status == 0:           # the LP's optimum: a bound of every assignment
            assignment = _assignment(model, relaxation.x)
            cost = float(model.evaluate(assignment)[0])
            if cost - relaxation.fun <= PROOF_GAP:
                return IlpSolution(assignment, cost, True, time.perf_counter() - start,
                                   program.num_columns, program.num_rows, relaxed=True)
        time_limit = max(time_limit - (time.perf_counter() - start), 0.0)
    result = program.solve(time_limit, node_limit)
    if result.status == 1 and node_limit is not None:
        logging.warning(
            "HiGHS stopped at the ILP's time limit (%g s) before its node limit (%d): the "
            "plan depends on this machine's speed and load (for the joint search, raise "
            "Options.joint_ilp_seconds, or Options.search_time_limit_s where that is "
            "what was left).", time_limit, node_limit)
    if result.x is None:
        raise PlanInfeasibleError(
            f"HiGHS found no solution of the cut's ILP ({program.num_columns} variables, "
            f"{program.num_rows} constraints, time limit {time_limit:g} s, node limit "
            f"{node_limit}): "
            f"{result.message}",
            fix="raise time_limit, or check the model with level.solve_level (the DP).")
    assignment = _assignment(model, result.x)
    # The assignment's own cost: HiGHS's objective value is only within its tolerance
    # (2.999999 for an optimum of 3 was seen).
    return IlpSolution(assignment, float(model.evaluate(assignment)[0]), result.status == 0,
                       time.perf_counter() - start, program.num_columns, program.num_rows)


def _assignment(model: LevelModel, x: np.ndarray) -> tuple[int, ...]:
    """Each group's state of largest x (the one state of a binary solution)."""
    offsets = np.concatenate([[0], np.cumsum(model.domains)]).astype(np.int64)
    return tuple(int(np.argmax(x[offsets[g]:offsets[g + 1]]))
                 for g in range(len(model.domains)))
