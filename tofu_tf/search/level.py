"""One level of the search: cost vectors -> factors over tensor groups -> exact DP.

`LevelModel` is the shared accounting of one cut — every search (DP, ILP, baselines)
evaluates assignments through it, so their numbers compare like with like:

    cost(states) = sum over ops of  min over the op's choices c of
                   work[c] + sum over the op's tensors t of  vector[c][t][state of t's group]

where the vectors are bytes (cost.py) and work[c] prices the computation a choice repeats:
an op run whole on every one of the k parts (`replicate`) instead of split does k - 1
times its flops more, priced at `flop_bytes` bytes per flop (whole bytes; 0: the plan
moving the fewest bytes, whatever it computes). With `transfer_bytes`, every transfer
costs that much more: a message from one part to another as the emitter sends them, per
entry and state (problem._finish: an all-to-all re-layout k (k - 1), a halo 2 (k - 1), an
all-gather k (k - 1)). `solve_level` minimises it exactly with dp.solve; a LevelResult
keeps its bytes, work and transfers' price apart.

Ties. Bytes (and the prices) are whole numbers, and many assignments move the same bytes:
a bias stored Split, gathered for the forward op and reduce-scattered from its gradient,
moves what it moves stored R and all-reduced. Among the byte-optimal assignments the search
takes one with the fewest transfers (each has a latency):

    ranked(states) = cost(states) + epsilon * transfers(states),
    epsilon = 1 / (2 * (1 + sum over ops of the most transfers any choice makes))

so epsilon * transfers < 1/2 < the least byte difference, and the order by bytes is kept
exactly. Each op's choice is the same (least bytes, then fewest transfers); ties left after
that go to the lowest state index (Split on the lowest dim, before R).
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from tofu_tf.graph import Graph
from tofu_tf.op_semantics.analysis import OutputState
from tofu_tf.op_semantics.catalog import OpEntry, catalog
from tofu_tf.options import Options, VariableStorage
from tofu_tf.search import dp
from tofu_tf.search.coarsen import CoarseGraph, coarsen, with_views
from tofu_tf.search.cost import stored
from tofu_tf.search.problem import (REPLICATE, Choice, OpVectors, Problem, ProblemOp,
                                    SearchCache, build_choices, cost_vectors, part0_shape,
                                    root_problem, sub_problem, tensor_at, viewed)
from tofu_tf.search.profiles import flop_bytes, op_flops, transfer_bytes
from tofu_tf.search.topology import Topology


@dataclass
class LevelModel:
    problem: Problem
    coarse: CoarseGraph
    vectors: OpVectors                                        # op -> choice -> [(tensor, bytes)]
    domains: list[int]                                        # group -> number of states
    flop_bytes: float = 0.0                                   # bytes one repeated flop costs
    transfer_bytes: float = 0.0                               # bytes one transfer costs
    _tables: dict = field(default_factory=dict, repr=False)
    _shared: dict = field(default_factory=dict, repr=False)
    _work: dict = field(default_factory=dict, repr=False)
    _mins: dict = field(default_factory=dict, repr=False)       # op -> min_table
    _sums: dict = field(default_factory=dict, repr=False)       # op -> _named_sums

    @staticmethod
    def build(problem: Problem, coarse: CoarseGraph, flop_bytes: float = 0.0,
              transfer_bytes: float = 0.0) -> "LevelModel":
        if not problem.choices:
            build_choices(problem)
        vectors = cost_vectors(problem)
        domains = [len(problem.states(members[0])) for members in coarse.members]
        return LevelModel(problem, coarse, vectors, domains, flop_bytes, transfer_bytes)

    def below(self, result: "LevelResult", k: int, transfer_bytes: float) -> "LevelModel":
        """The next level's model: a k-way cut of part 0 under `result`."""
        # a G(d) view is whole in each group: the next level cuts all of it
        states = {t: self.group_states(g)[result.assignment[g]]
                  for g, members in enumerate(self.coarse.members) for t in members}
        return LevelModel.build(sub_problem(self.problem, states, result.choices, k),
                                self.coarse, self.flop_bytes, transfer_bytes)

    def work(self, op: str) -> np.ndarray:
        """Per choice of `op`, the bytes its repeated computation costs (module docstring):
        (k - 1) x the local op's flops x flop_bytes for `replicate`, else 0. Equal
        geometries share one array."""
        if self.problem is None or not self.flop_bytes:
            return np.zeros(len(self.vectors[op]))
        key = self.problem.geometries.get(op)
        key = op if key is None else key
        if key not in self._work:
            self._work[key] = choice_work(self.problem.k, self.vectors.ops[op],
                                          self.problem.choices[op], self.flop_bytes)
        return self._work[key]

    def group_states(self, group: int) -> tuple[OutputState, ...]:
        return self.problem.states(self.coarse.members[group][0])

    def op_scope(self, op: str) -> tuple[int, ...]:
        return self.min_table(op)[0]

    def min_table(self, op: str) -> tuple[tuple[int, ...], np.ndarray]:
        """(scope, table = min over choices): op_table's first two. Of a model built from
        named vectors (the joint model: hundreds of chains over up to a few hundred
        thousand cells) the min alone, a few times faster than with its argmin and
        transfers over every cell; `best_choice` finds those at the cell it is asked."""
        if self._full_tables(op):
            return self.op_table(op)[:2]
        found = self._mins.get(op)
        if found is None:
            scope, key, sums, _ = self._named_sums(op)
            least = self._shared.get(("min",) + key)
            if least is None:
                least = self._shared[("min",) + key] = _least(
                    sums, tuple(self.domains[g] for g in scope))
            found = self._mins[op] = (scope, least)
        return found

    def best_choice(self, op: str, index: tuple[int, ...]) -> int:
        """The op's choice at the cell `index` of its scope, as op_table's argmin: least
        cost (summed as _min_table sums it), then fewest transfers, then the first."""
        if self._full_tables(op):
            return int(self.op_table(op)[2].item(index))
        scope, _, sums, moving = self._named_sums(op)
        columns = np.cumsum((0,) + tuple(self.domains[g] for g in scope))[:-1] + index
        cost = np.zeros(len(sums))
        for column in columns:
            cost = cost + sums[:, column]
        return int(np.lexsort((moving[:, columns].sum(axis=1), cost))[0])

    def _full_tables(self, op: str) -> bool:
        """Whether min_table and best_choice read op_table: always for a level's own
        model (its DP ranks by the transfers anyway), and where it was already made."""
        return isinstance(self.vectors, OpVectors) or op in self._tables

    def op_table(self, op: str) -> tuple[tuple[int, ...], np.ndarray, np.ndarray, np.ndarray]:
        """(scope, table = min over choices, argmin choice, transfers of that choice) over
        the op's groups, sorted.
        Ops with equal vectors (one geometry) whose tensors fall into groups in the same
        pattern share the arrays; the pattern ranks each tensor's group among the op's."""
        cached = self._tables.get(op)
        if cached is None and not isinstance(self.vectors, OpVectors):
            cached = self._tables[op] = self._named_table(op)
        if cached is None:
            distinct, pattern = self._pattern(op)
            key = self.problem.geometries[op]
            shared = self._shared.get((key, pattern)) if key is not None else None
            if shared is None:
                shared = self._op_table(op, pattern, distinct)
                if key is not None:
                    self._shared[(key, pattern)] = shared
            used, *tables = shared
            cached = self._tables[op] = (tuple(distinct[i] for i in used), *tables)
        return cached

    def _pattern(self, op: str) -> tuple[list[int], tuple[int, ...]]:
        """The op's groups, sorted, and each of its tensors' rank among them: the same at
        every level (one coarse graph), so worked out once per search."""
        patterns = self.problem.cache.patterns
        found = patterns.get(op)
        if found is None or found[0] is not self.coarse:
            problem_op = self.vectors.ops[op]
            group_of = self.coarse.group_of
            groups = [group_of[t] for t in problem_op.inputs + problem_op.outputs]
            distinct = sorted(set(groups))
            found = patterns[op] = (self.coarse, distinct,
                                    tuple(distinct.index(g) for g in groups))
        return found[1], found[2]

    def _op_table(self, op: str, pattern, distinct):
        """(pattern ranks with vectors, min table, argmin, transfers) for one op."""
        used, terms = self._terms(op, pattern)
        return (used, *_min_table(terms, [self.domains[distinct[r]] for r in used],
                                  self.work(op), self.transfer_bytes))

    def _terms(self, op: str, pattern) -> tuple[tuple[int, ...], list[list[tuple]]]:
        """(the pattern ranks the op's vectors use, sorted; per choice its (axis among
        them, bytes, transfers) terms), as _min_table takes them."""
        n_in = len(self.vectors.ops[op].inputs)
        positional = self.vectors.positional(op)
        ranks = [[pattern[i if kind == "in" else n_in + i] for (kind, i), *_ in entries]
                 for entries in positional]
        used = tuple(sorted({r for row in ranks for r in row}))
        return used, [[(used.index(r), v, n) for r, (_, v, n) in zip(row, entries)]
                      for row, entries in zip(ranks, positional)]

    def choice_table(self, op: str, choice: int, epsilon: float = 0.0) -> np.ndarray:
        """One choice's table over the op's scope (op_scope): its bytes, work and
        transfers' price, plus `epsilon` x its transfers (factors' ranking). Equal
        geometries in the same group pattern share it, as op_table's."""
        distinct, pattern = self._pattern(op)
        geometry = self.problem.geometries[op]
        key = ("choice", geometry, pattern, choice, epsilon)
        found = self._shared.get(key) if geometry is not None else None
        if found is None:
            used, terms = self._terms(op, pattern)
            table, _, transfers = _min_table(
                [terms[choice]], [self.domains[distinct[r]] for r in used],
                self.work(op)[choice:choice + 1], self.transfer_bytes)
            found = table + epsilon * transfers
            if geometry is not None:
                self._shared[key] = found
        return found

    def _named_table(self, op: str):
        """op_table from plain {op: [[(tensor, vector)]]} vectors (models built by hand,
        and the joint model: a term moving bytes is one transfer)."""
        scope, terms, key = self._named_terms(op)
        shared = self._shared.get(key)
        if shared is None:
            shared = self._shared[key] = _min_table(
                terms, [self.domains[g] for g in scope], None, self.transfer_bytes)
        return (scope, *shared)

    def _named_terms(self, op: str) -> tuple[tuple[int, ...], list[list[tuple]], tuple]:
        """(the op's groups, sorted; per choice its (axis, bytes, transfers) terms; the
        key its tables are shared by): ops whose terms are the same arrays on the same
        axes of equal domains (one joint geometry) share them."""
        group_of = self.coarse.group_of
        scope = tuple(sorted({group_of[t] for entries in self.vectors[op] for t, _ in entries}))
        terms = [[(scope.index(group_of[t]), v, np.asarray(v) > 0) for t, v in entries]
                 for entries in self.vectors[op]]
        key = (tuple(self.domains[g] for g in scope),
               tuple(tuple((axis, id(v)) for axis, v, _ in row) for row in terms))
        return scope, terms, key

    def _named_sums(self, op: str) -> tuple[tuple[int, ...], tuple, np.ndarray, np.ndarray]:
        """(scope, key, each choice's priced bytes and its transfers summed per axis state:
        _min_table's S) of a model built from named vectors, shared by key."""
        found = self._sums.get(op)
        if found is None:
            scope, terms, key = self._named_terms(op)
            sums = self._shared.get(("sums",) + key)
            if sums is None:
                sums, moving = _axis_sums(terms, tuple(self.domains[g] for g in scope))
                if self.transfer_bytes:
                    sums = sums + self.transfer_bytes * moving
                sums = self._shared[("sums",) + key] = sums, moving
            found = self._sums[op] = (scope, key) + sums
        return found

    def transfer_counts(self, op: str) -> list[list[tuple[str, np.ndarray]]]:
        """Per choice [(tensor, transfers per state)] (one per term moving bytes in a
        model built by hand)."""
        if isinstance(self.vectors, OpVectors):
            return self.vectors.transfers(op)
        return [[(t, (np.asarray(v) > 0).astype(np.int64)) for t, v in entries]
                for entries in self.vectors[op]]

    def priced(self, op: str) -> list[list[tuple[str, np.ndarray]]]:
        """Per choice [(tensor, bytes + transfer_bytes x transfers per state)]: the
        vectors the exact checks (ILP, joint search) minimise."""
        if not self.transfer_bytes:
            return self.vectors[op]
        return [[(t, v + self.transfer_bytes * n) for (t, v), (_, n) in zip(entries, counts)]
                for entries, counts in zip(self.vectors[op], self.transfer_counts(op))]

    def _epsilon(self) -> float:
        """The weight of one transfer in ranked factors (module docstring)."""
        tables, op_table = self._tables, self.op_table
        return _epsilon_of([(tables.get(op) or op_table(op))[3] for op in self.vectors])

    def factors(self, ranked: bool = False) -> tuple[list[dp.Factor], float]:
        """The DP's factors over groups with a choice — ops with one scope summed into one
        factor — and `constant`: the bytes of ops whose groups all have one state (the
        same in every assignment). `ranked`: each table plus epsilon x its transfers, so
        that byte ties go to fewer transfers (module docstring)."""
        tables, op_table = self._tables, self.op_table
        if ranked:
            rows = [(tables.get(op) or op_table(op)) for op in self.vectors]
            epsilon = _epsilon_of([row[3] for row in rows])
        else:
            rows, epsilon = [self.min_table(op) for op in self.vectors], 0.0
        merged: dict[tuple[int, ...], np.ndarray] = {}
        constant = 0.0
        squeezed: dict[int, tuple] = {}          # id(table) -> (free axes, table on them)
        for row in rows:
            scope, table = row[0], row[1]
            found = squeezed.get(id(table))
            if found is None:
                found = squeezed[id(table)] = _squeeze(
                    table + epsilon * row[3] if ranked else table)
            axes, free_table = found
            if not axes:
                constant += free_table.item()
                continue
            free = tuple(scope[i] for i in axes)
            merged[free] = merged[free] + free_table if free in merged else free_table
        return [dp.Factor(scope, table) for scope, table in merged.items()], constant

    def storage_factors(self, weight: float) -> list[dp.Factor]:
        """`weight` x the bytes one device stores of each group's tensors, per state: the
        memory term of a budgeted search (replicated storage costs k times a split)."""
        factors = []
        for g, members in enumerate(self.coarse.members):
            states = self.group_states(g)
            if len(states) < 2:
                continue
            vector = np.zeros(len(states))
            for t in members:
                spec = self.problem.tensors[t]
                vector += [math.prod(part0_shape(spec.shape, state, self.problem.k))
                           * spec.itemsize for state in states]
            factors.append(dp.Factor((g,), weight * vector))
        return factors

    def evaluate(self, assignment) -> tuple[float, dict[str, int]]:
        """Total bytes of a group assignment, and each op's best choice under it."""
        total, chosen = 0.0, {}
        tables, op_table, full = self._tables, self.op_table, self._full_tables
        for op in self.vectors:
            if full(op):                     # op_table's min and argmin
                scope, table, argmin, _ = tables.get(op) or op_table(op)
            else:
                (scope, table), argmin = self.min_table(op), None
            index = tuple([assignment[g] for g in scope])
            chosen[op] = argmin.item(index) if argmin is not None else \
                self.best_choice(op, index)
            total += table.item(index)
        return total, chosen

    def moved(self, op: str, choice: int, assignment) -> list[tuple[str, float]]:
        """[(tensor, bytes)] the op's choice moves under `assignment`, bytes > 0."""
        if not isinstance(self.vectors, OpVectors):
            return [(t, float(v[assignment[self.coarse.group_of[t]]]))
                    for t, v in self.vectors[op][choice]
                    if v[assignment[self.coarse.group_of[t]]] > 0]
        distinct, pattern = self._pattern(op)
        n_in = len(self.vectors.ops[op].inputs)
        out = []
        for (kind, i), vector, _ in self.vectors.positional(op)[choice]:
            moved = vector.item(assignment[distinct[pattern[i if kind == "in" else n_in + i]]])
            if moved > 0:
                out.append((tensor_at(self.vectors.ops[op], (kind, i)), float(moved)))
        return out

    def transfers(self, op: str, choice: int, assignment) -> int:
        """The transfers the op's choice makes under `assignment`."""
        group_of = self.coarse.group_of
        return int(sum(n[assignment[group_of[t]]]
                       for t, n in self.transfer_counts(op)[choice]))


def choice_work(k: int, op: ProblemOp, choices: list[Choice], flop_bytes: float
                ) -> np.ndarray:
    """Per choice, whole bytes for the flops `replicate` repeats on k parts (module
    docstring): (k - 1) x the op's flops x flop_bytes; 0 for a split."""
    repeated = round((k - 1) * op_flops(op.sem) * flop_bytes)
    return np.array([repeated if c.label == REPLICATE else 0 for c in choices],
                    dtype=np.float64)


def _epsilon_of(transfers: list[np.ndarray]) -> float:
    """1 / (2 (1 + the most transfers all these tables can add up to)): tables shared
    by several ops counted once per op, their max taken once."""
    most, seen = 0, {}                     # id(table) -> its max
    for table in transfers:
        found = seen.get(id(table))
        if found is None:
            found = seen[id(table)] = int(table.max())
        most += found
    return 1.0 / (2 * (1 + most))


def _squeeze(table: np.ndarray) -> tuple[tuple[int, ...], np.ndarray]:
    """(axes with more than one state, the table on those axes)."""
    axes = tuple(i for i, n in enumerate(table.shape) if n > 1)
    return axes, table.reshape([table.shape[i] for i in axes])


def _least(sums: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The min over rows of `sums` [choices, sum of shape] (each choice's priced bytes
    per axis state, _axis_sums) spread over `shape`: _min_table's min alone, without work.
    Over a large table each row is broadcast into a table of `shape` and folded into the
    running min in place (in cache: a few times faster than _min_table's chunks and
    argmin); over a small one, in chunks. The same sums in the same order: equal to
    _min_table's, bit for bit."""
    cells = math.prod(shape)
    if len(shape) < 2 or cells < _ROW_CELLS:
        step = max(1, _CHUNK // cells)
        return functools.reduce(np.minimum, (_spread(sums[start:start + step], shape).min(0)
                                             for start in range(0, len(sums), step))
                                ).reshape(shape)
    offsets = tuple(itertools.accumulate((0,) + shape))
    least, table = np.full(shape, np.inf), np.empty(shape)
    for row in sums:
        part = row[:offsets[1]]
        for axis in range(1, len(shape) - 1):
            part = part[..., None] + row[offsets[axis]:offsets[axis + 1]]
        np.add(part[..., None], row[offsets[-2]:], out=table)
        np.minimum(least, table, out=least)
    return least


def _axis_sums(per_choice: list[list[tuple[int, np.ndarray, np.ndarray]]], shape: tuple
               ) -> tuple[np.ndarray, np.ndarray]:
    """Each choice's (axis, bytes, transfers) terms summed per (choice, axis state):
    [choices, sum of the axes' sizes] bytes and transfers, one bincount each."""
    n_choices, width = len(per_choice), sum(shape)
    offsets = tuple(itertools.accumulate((0,) + shape))[:-1]
    index, pieces, counts = [], [], []
    for c, terms in enumerate(per_choice):
        for axis, vector, count in terms:
            base = c * width + offsets[axis]
            index.extend(range(base, base + len(vector)))
            pieces.append(vector)
            counts.append(count)
    if not pieces:
        return np.zeros((n_choices, width)), np.zeros((n_choices, width), dtype=np.int64)
    where = np.array(index, dtype=np.intp)
    sums = np.bincount(where, np.concatenate(pieces), n_choices * width)
    moving = np.bincount(where, np.concatenate(counts), n_choices * width)
    return (sums.reshape(n_choices, width),
            moving.reshape(n_choices, width).astype(np.int64))


def _spread(rows: np.ndarray, shape: tuple) -> np.ndarray:
    """[n, sum of shape] -> [n, cells]: per row, the sum over axes of its states there."""
    offsets = tuple(itertools.accumulate((0,) + shape))[:-1]
    total = np.zeros((len(rows),) + (1,) * len(shape), dtype=rows.dtype)
    for axis, (start, size) in enumerate(zip(offsets, shape)):
        total = total + rows[:, start:start + size].reshape(
            (len(rows),) + tuple(size if b == axis else 1 for b in range(len(shape))))
    return np.broadcast_to(total, (len(rows),) + shape).reshape(len(rows), math.prod(shape))


def _min_table(per_choice: list[list[tuple[int, np.ndarray, np.ndarray]]], shape: list[int],
               work: np.ndarray | None = None, transfer_bytes: float = 0.0):
    """Over choices of `work` plus the sum of each choice's (axis, bytes, transfers)
    terms, each transfer also costing `transfer_bytes`: the min, the argmin (least cost,
    then fewest transfers, then the first choice) and that choice's transfers.

    With the terms summed per (choice, axis state) into S [choices, sum of the axes'
    sizes] (one bincount), a choice's table is the broadcast sum over axes of its slice
    of S on each: a fixed number of array calls per op, however many terms (bytes are
    whole numbers, so the sums are exact; a forbidden state's inf stays inf)."""
    shape = tuple(shape)
    n_choices, cells = len(per_choice), math.prod(shape)
    sums, moving = _axis_sums(per_choice, shape)
    if transfer_bytes:
        sums = sums + transfer_bytes * moving
    if work is not None and not work.any():
        work = None

    # Chunks of choices keep each [chunk, cells] table within _CHUNK numbers; a later
    # chunk replaces the running argmin only where it is strictly better, so the tie rule
    # is the one over all choices at once.
    step = max(1, _CHUNK // cells)
    least = argmin = chosen = None
    for start in range(0, n_choices, step):
        tables = _spread(sums[start:start + step], shape)
        if work is not None:
            tables = tables + work[start:start + step].reshape(-1, 1)
        transfers = _spread(moving[start:start + step], shape)
        low = tables.min(axis=0)
        pick = np.where(tables == low, transfers, _MOST).argmin(axis=0)
        fewest = transfers[pick, np.arange(cells)]
        if least is None:
            least, argmin, chosen = low, pick, fewest
            continue
        better = (low < least) | ((low == least) & (fewest < chosen))
        least = np.where(better, low, least)
        argmin = np.where(better, pick + start, argmin)
        chosen = np.where(better, fewest, chosen)
    return least.reshape(shape), argmin.reshape(shape), chosen.reshape(shape)


_MOST = np.iinfo(np.int64).max
_CHUNK = 2 ** 22                        # numbers in one chunk's table in _min_table
_ROW_CELLS = 4096                       # _least folds tables of this many cells one by one


@dataclass(frozen=True)
class LevelResult:
    """The chosen states and choices of one level, and its cost in bytes."""
    k: int
    assignment: tuple[int, ...]           # group -> state index
    states: dict[str, OutputState]        # tensor -> stored state
    choices: dict[str, str]               # op -> choice label
    bytes: float
    exact: bool
    seconds: float
    breakdown: tuple[tuple[str, str, float], ...] = ()   # (op, tensor, bytes), bytes > 0
    work: float = 0.0                     # the chosen choices' work (bytes for flops)
    latency: float = 0.0                  # its transfers' latency (bytes per transfer)

    @property
    def cost(self) -> float:
        """The level's objective: bytes moved plus work plus latency."""
        return self.bytes + self.work + self.latency


def solve_level(model: LevelModel, max_table: int = dp.MAX_TABLE,
                beam: int = dp.BEAM, memory_weight: float = 0.0) -> LevelResult:
    """The exact optimum of one level (unless the DP's table bound forces its fallback):
    least bytes moved, plus `memory_weight` x the bytes one device stores."""
    start = time.perf_counter()
    factors = model.factors(ranked=True)[0]
    if memory_weight:
        factors = factors + model.storage_factors(memory_weight)
    solution = dp.solve(model.domains, factors,
                        order=sorted(range(len(model.domains)),
                                     key=lambda g: model.coarse.position[g]),
                        max_table=max_table, beam=beam)
    return result_of(model, solution.assignment, solution.exact, time.perf_counter() - start)


def fixed_result(model: LevelModel, assignment: tuple[int, ...], labels: dict[str, str]
                 ) -> LevelResult:
    """The LevelResult of given group states (indices into the model's domains) and op
    choices (labels), as a joint optimum fixes them for the recursion."""
    index = {op: {choice.label: c for c, choice in enumerate(choices)}
             for op, choices in model.problem.choices.items()}
    return result_of(model, assignment, True, 0.0,
                     {op: index[op][labels[op]] for op in model.vectors})


def views_result(model: LevelModel, assignment: tuple[int, ...],
                 labels: Mapping[str, str]) -> LevelResult:
    """The level's result with the states of its first len(assignment) groups fixed (the
    groups of a model without views, problem.with_views: the views come last), and the
    choices `labels` gives (op -> label: as the plan of that model made them); the views'
    states free: the exact DP over the views, on each op's table of its choice (of an op
    `labels` leaves out, a view's among them: its cheapest) with the fixed groups' axes
    taken at their states."""
    start = time.perf_counter()
    fixed = len(assignment)
    index = {op: next(c for c, choice in enumerate(model.problem.choices[op])
                      if choice.label == labels[op])
             for op in model.vectors if op in labels}
    epsilon = model._epsilon()                  # ranked as factors(ranked=True)
    factors = []                      # the tables with the fixed groups' axes taken
    for op in model.vectors:
        scope = model.op_scope(op)
        free = tuple(g for g in scope if g >= fixed)
        if free:
            if op in index:
                table = model.choice_table(op, index[op], epsilon)
            else:
                _, table, _, transfers = model.op_table(op)
                table = table + epsilon * transfers
            factors.append(dp.Factor(free, table[tuple(
                assignment[g] if g < fixed else slice(None) for g in scope)]))
    solution = dp.solve(model.domains, factors,
                        order=sorted(range(len(model.domains)),
                                     key=lambda g: model.coarse.position[g]))
    full = tuple(assignment) + solution.assignment[fixed:]
    chosen = {op: index[op] if op in index else
              int(model.op_table(op)[2].item(tuple(full[g] for g in model.op_scope(op))))
              for op in model.vectors}
    return result_of(model, full, solution.exact, time.perf_counter() - start, chosen)


def result_of(model: LevelModel, assignment, exact: bool, seconds: float,
              chosen: dict[str, int] | None = None) -> LevelResult:
    """The level's result under a group assignment: each op's cheapest choice under it,
    or the op -> choice index given as `chosen`."""
    evaluated = chosen is None
    if evaluated:
        total, chosen = model.evaluate(assignment)       # bytes and work
    else:
        total = sum(moved for op, c in chosen.items()
                    for _, moved in model.moved(op, c, assignment))
    work = (float(sum(model.work(op)[c] for op, c in chosen.items()))
            if model.flop_bytes else 0.0)
    states = {t: stored(model.group_states(g)[assignment[g]])
              for g, members in enumerate(model.coarse.members) for t in members}
    labels = {op: model.problem.choices[op][c].label for op, c in chosen.items()}
    breakdown = [(op, tensor, moved) for op, c in chosen.items()
                 for tensor, moved in model.moved(op, c, assignment)]
    latency = model.transfer_bytes * sum(model.transfers(op, c, assignment)
                                         for op, c in chosen.items()) \
        if model.transfer_bytes else 0.0
    if evaluated:
        total -= work + latency
    return LevelResult(model.problem.k, tuple(assignment), states, labels, total, exact,
                       seconds, tuple(breakdown), work, latency)


def variable_tensors(graph: Graph, coarse: CoarseGraph) -> frozenset[str]:
    """Tensors grouped with a variable (its reads, gradient, slots, update math)."""
    groups = {coarse.group_of[v.handle] for v in graph.variables.values()}
    return frozenset(t for g in groups for t in coarse.members[g])


def level_models(graph: Graph, topology: Topology, entries: dict[str, OpEntry] | None = None,
                 coarse: CoarseGraph | None = None, options: Options = Options(),
                 storage: VariableStorage = VariableStorage.REPLICABLE,
                 cache: SearchCache | None = None):
    """Yield (LevelModel, solve) per level; the caller's solver picks each level's result
    (the DP here, baselines elsewhere) and the next level is built from it."""
    entries = entries if entries is not None else catalog(graph, strict=options.strict)
    coarse = coarse if coarse is not None else coarsen(graph, entries)
    work, latency = flop_bytes(options), transfer_bytes(options)
    # Recursions of one search that start alike (the joint and views candidates after the
    # recursion) share level 1's model and the tables it keeps. The key holds what it is
    # built from; the objects it names by id are held in the entry (no id is reused while
    # it is cached). Deeper models are not kept: most recursions part after level 1, and
    # keeping them costs a large graph's search more than sharing saves.
    key = (id(graph), id(entries), id(coarse), storage, options.shared_reads,
           options.replicate_below, topology.ways, work, latency)
    found = cache.models.get(key) if cache is not None else None
    if found is None:
        model = _root_model(graph, topology, entries, coarse, options, storage, cache, work,
                            latency)
        if cache is not None:
            cache.models[key] = (graph, entries, coarse, model)
    else:
        model = found[-1]
    for index in range(1, len(topology.levels)):
        result = yield model
        # a transfer between two groups of a level is one between each of their devices
        # below (a device's share of the region): its price scales by their count
        model = model.below(result, topology.levels[index].ways,
                            latency * math.prod(topology.ways[index + 1:]))
    yield model


def _root_model(graph, topology, entries, coarse, options, storage, cache, work, latency
                ) -> LevelModel:
    """Level 1's model: the graph's problem under the storage policy, with the views
    where `options` asks for them."""
    replicable = (variable_tensors(graph, coarse) if storage is VariableStorage.REPLICABLE
                  else frozenset())
    problem: Problem = root_problem(graph, entries, topology.levels[0].ways,
                                    replicable=replicable,
                                    replicate_below=options.replicate_below, cache=cache,
                                    group_of=coarse.group_of if options.shared_reads else None)
    coarse = with_views(coarse, {v: (viewed(v), key) for v, key in problem.views.items()})
    return LevelModel.build(problem, coarse, work, latency * math.prod(topology.ways[1:]))
