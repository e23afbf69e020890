"""Exact dynamic program for one cut: min-sum variable elimination over the coarse graph.

Variables are tensor groups, each with a small domain of stored states; factors are ops,
each a table over the groups it touches (the minimum over the op's choices). Eliminating
variable v combines every factor that mentions v into

    g_v(U) = min over x_v of  sum_{f ∋ v} f(x_v, U),      U = union of their scopes - {v}

and replaces them by g_v, keeping argmin_v as a back-pointer. After the last elimination
only a constant is left: the optimum. Assigning variables in reverse elimination order
from the back-pointers gives an optimal assignment. This is exact for any graph shape —
chains, residual adds, attention's Q/K/V branches, the backward pass mirrored onto the
forward pass — and costs sum_v prod(domains of U_v ∪ {v}).

Order: greedy, each step eliminating the variable whose combined table is smallest (ties:
the earliest in the coarse graph's linear order). On near-linear coarse graphs this walks
the chain and the tables stay tiny.

Bound: a combined table above `max_table` entries (default 2**22) takes the documented
fallback: every variable in it keeps only its `beam` best states (by min-marginal) before
combining. The solution then says `exact=False` with the number of restricted steps.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

MAX_TABLE = 2 ** 22
BEAM = 2


@dataclass(frozen=True)
class Factor:
    scope: tuple[int, ...]          # variable indices, distinct
    table: np.ndarray               # shape = domain sizes of scope, in that order


@dataclass(frozen=True)
class Solution:
    assignment: tuple[int, ...]     # state index per variable
    cost: float
    exact: bool
    restricted_steps: int
    max_table: int                  # largest table built


@dataclass
class _Table:
    """A factor during elimination: values[u] are the states of u its axis holds (None:
    the table was made before any restriction, so its axes hold every state)."""
    scope: list[int]
    table: np.ndarray
    values: dict[int, np.ndarray] | None = None

    def on(self, allowed, scope: list[int], restricted: bool = True) -> np.ndarray:
        """This table restricted to `allowed` states, laid out on `scope`'s axes. Its
        variables outside `scope` are fixed (one allowed state): their axis is dropped.
        `restricted=False` promises no domain was ever restricted (the common case)."""
        table = self.table
        if restricted and self.scope:
            rows = [allowed[u] if self.values is None else
                    np.searchsorted(self.values[u], allowed[u]) for u in self.scope]
            table = table[np.ix_(*rows)]
        kept = [i for i, u in enumerate(self.scope) if u in scope]
        if len(kept) < len(self.scope):
            table = table.reshape([table.shape[i] for i in kept])
        order = sorted(range(len(kept)), key=lambda i: scope.index(self.scope[kept[i]]))
        if order != list(range(len(order))):
            table = np.transpose(table, order)
        return table.reshape([len(allowed[u]) if u in self.scope else 1 for u in scope])


class _Eliminator:
    """The live tables, and per variable its neighbours and combined-table size.

    `neighbours[v]` counts, for each other variable u, the live tables holding both, and
    `sizes[v] = |allowed v| * prod over u in neighbours[v] of |allowed u|` is the size of
    the table eliminating v would build (a fixed variable adds a factor 1). Both change
    only where a table is added or removed, or a domain restricted, so the greedy order
    reads a size in O(1) however many tables a variable touches."""

    def __init__(self, domains: list[int], factors: list[Factor], max_table: int, beam: int):
        self.allowed = [np.arange(d) for d in domains]
        self.tables: dict[int, _Table] = {}
        self.touching: list[set[int]] = [set() for _ in domains]
        self.neighbours: list[dict[int, int]] = [{} for _ in domains]
        self.sizes: list[int] = list(domains)          # Python ints: no overflow
        self.next_id = 0
        for f in factors:
            self._add(_Table(list(f.scope), f.table))
        self.max_table, self.beam = max_table, beam
        self.constant = 0.0
        self.pointers: list[tuple] = []
        self.restricted, self.largest = 0, 1

    def _add(self, table: _Table) -> None:
        tid, self.next_id = self.next_id, self.next_id + 1
        self.tables[tid] = table
        for v in table.scope:
            self.touching[v].add(tid)
            counts = self.neighbours[v]
            for u in table.scope:
                if u != v:
                    seen = counts.get(u, 0)
                    counts[u] = seen + 1
                    if not seen:
                        self.sizes[v] *= len(self.allowed[u])

    def _remove(self, tid: int) -> _Table:
        table = self.tables.pop(tid)
        for v in table.scope:
            self.touching[v].discard(tid)
            counts = self.neighbours[v]
            for u in table.scope:
                if u != v:
                    counts[u] -= 1
                    if not counts[u]:
                        del counts[u]
                        self.sizes[v] //= len(self.allowed[u])
        return table

    def _set_allowed(self, u: int, states: np.ndarray) -> None:
        """Restrict u's domain, rescaling the sizes it is a factor of."""
        before, after = len(self.allowed[u]), len(states)
        self.allowed[u] = states
        for w in (u, *self.neighbours[u]):
            self.sizes[w] = self.sizes[w] // before * after

    def scope_of(self, v: int) -> list[int]:
        """v and its neighbours that still have a choice (fixed ones add no axis)."""
        return sorted([v, *(u for u in self.neighbours[v] if len(self.allowed[u]) > 1)])

    def size_of(self, v: int) -> int:
        return self.sizes[v]

    def eliminate(self, v: int) -> list[int]:
        """Eliminate v; returns the variables whose combined-table size may have changed."""
        if self.size_of(v) > self.max_table:
            self._restrict(self.scope_of(v))
        scope = self.scope_of(v)
        combined = None
        for tid in list(self.touching[v]):
            laid = self._remove(tid).on(self.allowed, scope, self.restricted > 0)
            combined = laid if combined is None else combined + laid
        shape = tuple(len(self.allowed[u]) for u in scope)
        if combined is None or combined.shape != shape:
            combined = (0.0 if combined is None else combined) + np.zeros(shape)
        self.largest = max(self.largest, combined.size)
        axis = scope.index(v)
        rest = scope[:axis] + scope[axis + 1:]
        self.pointers.append((rest, [self.allowed[u] for u in rest], v, self.allowed[v],
                              np.argmin(combined, axis=axis)))
        reduced = np.min(combined, axis=axis)
        if rest:
            self._add(_Table(rest, reduced, {u: self.allowed[u] for u in rest}
                             if self.restricted else None))
        else:
            self.constant += float(reduced)
        return rest

    def _restrict(self, scope: list[int]) -> None:
        """Fallback past the bound: keep each variable's `beam` best states; if the table
        is still too large, keep only the best state of the variables with the most."""
        self.restricted += 1
        beam = self.beam
        while beam >= 1:
            self._restrict_to(scope, beam)
            size = int(np.prod([len(self.allowed[u]) for u in scope], dtype=np.int64))
            if size <= self.max_table:
                return
            beam -= 1

    def _restrict_to(self, scope: list[int], beam: int) -> None:
        for u in scope:
            if len(self.allowed[u]) <= beam:
                continue
            marginal = np.zeros(len(self.allowed[u]))
            for tid in self.touching[u]:
                t = self.tables[tid]
                local = t.on(self.allowed, t.scope)
                axis = t.scope.index(u)
                marginal += local.min(axis=tuple(a for a in range(local.ndim) if a != axis))
            keep = np.sort(np.argsort(marginal, kind="stable")[:beam])
            self._set_allowed(u, self.allowed[u][keep])


class _Scopes(_Eliminator):
    """Elimination on the scopes alone: the greedy order reads only scopes and domain
    sizes, so it is the one `solve` takes while no table is past the bound."""

    def eliminate(self, v: int) -> list[int]:
        self.largest = max(self.largest, self.size_of(v))
        rest = [u for u in self.scope_of(v) if u != v]
        for tid in list(self.touching[v]):
            self._remove(tid)
        if rest:
            self._add(_Table(rest, None))
        return rest


def largest_table(domains: list[int], scopes: list[tuple[int, ...]],
                  order: list[int] | None = None) -> int:
    """The largest table `solve` builds on factors of these scopes, without their tables
    (past MAX_TABLE, `solve` would restrict there and not be exact)."""
    elim = _Scopes(domains, [Factor(scope, None) for scope in scopes], MAX_TABLE, BEAM)
    _eliminate_all(elim, len(domains), order)
    return elim.largest


def solve(domains: list[int], factors: list[Factor], order: list[int] | None = None,
          max_table: int = MAX_TABLE, beam: int = BEAM) -> Solution:
    """Minimise the sum of factors over all assignments (exact unless restricted).

    `order` is the linear order used to break ties (default: index order)."""
    n = len(domains)
    elim = _Eliminator(domains, factors, max_table, beam)
    free = _eliminate_all(elim, n, order)
    assignment = _backtrack(elim.pointers, n, free)
    cost = elim.constant
    return Solution(tuple(assignment), cost, elim.restricted == 0, elim.restricted,
                    elim.largest)


def _eliminate_all(elim: _Eliminator, n: int, order: list[int] | None) -> set[int]:
    """Eliminate every variable, the smallest combined table first (ties: by `order`);
    returns the variables no factor mentions."""
    rank = {v: i for i, v in enumerate(order if order is not None else range(n))}
    # A variable no factor mentions takes its first state (what eliminating it would
    # give: the argmin of zeros) and never enters a table: it is decided here.
    free = {v for v in range(n) if not elim.touching[v]}
    heap = [(elim.size_of(v), rank[v], v) for v in range(n) if v not in free]
    heapq.heapify(heap)
    done = [v in free for v in range(n)]
    while heap:
        size, _, v = heapq.heappop(heap)
        if done[v]:
            continue
        current = elim.size_of(v)
        if current != size:                       # stale entry: re-queue with the new size
            heapq.heappush(heap, (current, rank[v], v))
            continue
        done[v] = True
        for u in elim.eliminate(v):
            heapq.heappush(heap, (elim.size_of(u), rank[u], u))
    return free


def _backtrack(pointers, n: int, free=frozenset()) -> list[int]:
    """States from the back-pointers (each keeps the domains as they were when written);
    the `free` variables take state 0."""
    value: dict[int, int] = dict.fromkeys(free, 0)
    for rest, domains, var, var_domain, argmin in reversed(pointers):
        index = tuple(int(np.searchsorted(d, value[u])) for u, d in zip(rest, domains))
        value[var] = int(var_domain[argmin[index] if rest else argmin])
    return [value[v] for v in range(n)]


def evaluate(factors: list[Factor], assignment) -> float:
    """The objective of a full assignment."""
    return float(sum(f.table[tuple(assignment[v] for v in f.scope)] for f in factors))
