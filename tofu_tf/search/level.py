"""One level of the search: cost vectors -> factors over tensor groups -> exact DP.

`LevelModel` is the shared accounting of one cut — every search (DP, ILP, baselines)
evaluates assignments through it, so their numbers compare like with like:

    cost(states) = sum over ops of  min over the op's choices c of
                   sum over the op's tensors t of  vector[c][t][state of t's group]

where the vectors are bytes (cost.py). `solve_level` minimises it exactly with dp.solve.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from tofu_tf.op_semantics.analysis import OutputState
from tofu_tf.search import dp
from tofu_tf.search.coarsen import CoarseGraph
from tofu_tf.search.problem import Problem, build_choices, cost_vectors


@dataclass
class LevelModel:
    problem: Problem
    coarse: CoarseGraph
    vectors: dict[str, list[list[tuple[str, np.ndarray]]]]   # op -> choice -> [(tensor, bytes)]
    domains: list[int]                                        # group -> number of states
    _tables: dict = field(default_factory=dict, repr=False)

    @staticmethod
    def build(problem: Problem, coarse: CoarseGraph) -> "LevelModel":
        if not problem.choices:
            build_choices(problem)
        vectors = cost_vectors(problem)
        domains = [len(problem.states(members[0])) for members in coarse.members]
        return LevelModel(problem, coarse, vectors, domains)

    def group_states(self, group: int) -> tuple[OutputState, ...]:
        return self.problem.states(self.coarse.members[group][0])

    def op_scope(self, op: str) -> tuple[int, ...]:
        groups = {self.coarse.group_of[t] for entries in self.vectors[op] for t, _ in entries}
        return tuple(sorted(groups))

    def op_table(self, op: str) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
        """(scope, table = min over choices, argmin choice) over the op's groups. Ops with
        the same geometry whose tensors fall into groups the same way share the arrays."""
        if op not in self._tables:
            scope = self.op_scope(op)
            geo = self.problem.geometries.get(op) if self.problem is not None else None
            layout = tuple(tuple(scope.index(self.coarse.group_of[t]) for t, _ in entries)
                           for entries in self.vectors[op])
            key = None if geo is None else (geo, layout, tuple(self.domains[g] for g in scope))
            shared = self._tables.get(key) if key is not None else None
            if shared is None:
                shared = self._op_table(op, scope)[1:]
                if key is not None:
                    self._tables[key] = shared
            self._tables[op] = (scope, *shared)
        return self._tables[op]

    def _op_table(self, op: str, scope) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
        shape = [self.domains[g] for g in scope]
        per_choice = np.zeros([len(self.vectors[op])] + shape)
        for c, entries in enumerate(self.vectors[op]):
            for tensor, vector in entries:
                axis = scope.index(self.coarse.group_of[tensor])
                view = [1] * len(scope)
                view[axis] = len(vector)
                per_choice[c] += vector.reshape(view)
        return scope, per_choice.min(axis=0), per_choice.argmin(axis=0)

    def _free(self, scope, table) -> tuple[tuple[int, ...], np.ndarray]:
        """The table on the groups that have a choice (one-state groups are constants)."""
        free = tuple(g for g in scope if self.domains[g] > 1)
        return free, table.reshape([self.domains[g] for g in free])

    def factors(self) -> list[dp.Factor]:
        """One factor per op over its groups with a choice; ops with none add `constant`."""
        out = []
        for op in self.vectors:
            free, table = self._free(*self.op_table(op)[:2])
            if free:
                out.append(dp.Factor(free, table))
        return out

    def constant(self) -> float:
        """Bytes of the ops whose groups all have one state: the same in every assignment."""
        total = 0.0
        for op in self.vectors:
            free, table = self._free(*self.op_table(op)[:2])
            if not free:
                total += float(table)
        return total

    def evaluate(self, assignment) -> tuple[float, dict[str, int]]:
        """Total bytes of a group assignment, and each op's best choice under it."""
        total, chosen = 0.0, {}
        for op in self.vectors:
            scope, table, argmin = self.op_table(op)
            index = tuple(assignment[g] for g in scope)
            total += float(table[index])
            chosen[op] = int(argmin[index])
        return total, chosen


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


def solve_level(model: LevelModel, max_table: int = dp.MAX_TABLE,
                beam: int = dp.BEAM) -> LevelResult:
    """The exact optimum of one level (unless the DP's table bound forces its fallback)."""
    start = time.perf_counter()
    solution = dp.solve(model.domains, model.factors(),
                        order=sorted(range(len(model.domains)),
                                     key=lambda g: model.coarse.position[g]),
                        max_table=max_table, beam=beam)
    return result_of(model, solution.assignment, solution.exact, time.perf_counter() - start)


def result_of(model: LevelModel, assignment, exact: bool, seconds: float) -> LevelResult:
    total, chosen = model.evaluate(assignment)
    states = {t: model.group_states(g)[assignment[g]]
              for g, members in enumerate(model.coarse.members) for t in members}
    labels = {op: model.problem.choices[op][c].label for op, c in chosen.items()}
    breakdown = tuple((op, tensor, float(vector[assignment[model.coarse.group_of[tensor]]]))
                      for op, c in chosen.items() for tensor, vector in model.vectors[op][c]
                      if vector[assignment[model.coarse.group_of[tensor]]] > 0)
    return LevelResult(model.problem.k, tuple(assignment), states, labels, total, exact,
                       seconds, breakdown)
