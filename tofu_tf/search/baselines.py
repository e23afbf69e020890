"""Baseline partition searches (the alternatives of Tofu's evaluation), each a rule that
picks one group assignment per level of the recursion. All run through
`recursive.search(..., solver=...)` and are priced by the same `LevelModel` as the exact
DP (each op takes its cheapest choice under the picked tensor states), so their
`total_bytes` compare like with like. Rules, per level (a k-way cut):

- data_parallel:  every tensor that carries the batch is Split on the dim that carries it
                  (seeded at dim 0 of the fed inputs and propagated op by op: an op runs
                  the choice that reads its batch inputs most locally, and an output it
                  produces Split(d) carries the batch on d); every variable group (weights,
                  gradients, slots) is R; the remaining groups (shape constants, reduced
                  gradients of shape (1, n), the loss) get their best states given those.
- equal_chop:     one dimension for all cuts. Level 1 is the exact DP over the states that
                  stay legal at every level (Split(d) with dim d still >= k_l after each
                  shrink, or R); every later level keeps each group's level-1 state, and
                  only a group whose state is not legal there gets its best state.
- all_row_greedy: every group Split on its first dim of size >= k (rows), else R.
- spartan:        groups by decreasing tensor bytes (ties: chain order); each takes the
                  state minimising the ops that touch it, with already visited groups at
                  their states and unvisited ones at their best case (min over them).
- layer_wise_dp:  OptCNN. A layer is a forward op with its gradient ops (`Op.forward_op`);
                  its configuration is its head op's choice, and the configuration alone
                  fixes the states of the groups the layer produces first (see
                  `LayerSpace`). The DP is `dp.solve` over layer configurations, each op's
                  table becoming a factor over the layers that own its groups (on a chain:
                  OptCNN's chain DP; on residual or attention branches: min-sum elimination).

"Best states given the fixed ones" is always the exact DP over the free groups with the
fixed groups' domains cut to one state (`best_completion`). Ties pick the lowest state
index (Split on the lowest dim before R), as the rules were published; the exact DP's
tie-break by fewest transfers (level.py) is this search's own. Given that tie-break too,
Spartan's completions get cheaper inner levels and it beats the recursion on some WResNet
configurations (WResNet-152-w10 at 8 devices: 37.79 GB against 38.92 GB, 2.9%): the
recursion's myopia across levels. Level results say `exact=False`: a baseline is not
the optimum of its level.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from tofu_tf.errors import PlanInfeasibleError
from tofu_tf.graph import Graph, Role
from tofu_tf.op_semantics.analysis import REPLICATED, OutputState, Split
from tofu_tf.search import dp
from tofu_tf.search.level import LevelModel, LevelResult, result_of
from tofu_tf.options import Options, VariableStorage
from tofu_tf.search.recursive import SearchResult, search, variable_tensors
from tofu_tf.search.topology import Topology

Assignment = tuple[int, ...]
# rule(model, level index, results of the previous levels) -> group assignment
Rule = Callable[[LevelModel, int, tuple[LevelResult, ...]], Assignment]
# observe(model, result): called once per level with the level's model and result
Observer = Callable[[LevelModel, LevelResult], None]


# -- shared helpers ----------------------------------------------------------------------

def op_factors(model: LevelModel) -> list[tuple[str, dp.Factor]]:
    """(op name, factor over its groups) for every op touching a data tensor."""
    out = []
    for op in model.vectors:
        scope, table, *_ = model.op_table(op)
        if scope:
            out.append((op, dp.Factor(scope, table)))
    return out


def best_completion(model: LevelModel, allowed: Mapping[int, list[int]],
                    factors: list[dp.Factor] | None = None) -> Assignment:
    """The cheapest assignment in which group g takes one of `allowed[g]` (every state for
    a group not in `allowed`): the exact DP with the cut domains."""
    factors = factors if factors is not None else [f for _, f in op_factors(model)]
    keep = [np.asarray(allowed.get(g, range(d)), dtype=np.int64)
            for g, d in enumerate(model.domains)]
    cut = [dp.Factor(f.scope, f.table[np.ix_(*[keep[g] for g in f.scope])]) for f in factors]
    order = sorted(range(len(keep)), key=lambda g: model.coarse.position[g])
    solution = dp.solve([len(k) for k in keep], cut, order=order)
    return tuple(int(keep[g][i]) for g, i in enumerate(solution.assignment))


def variable_groups(graph: Graph, model: LevelModel) -> frozenset[int]:
    return frozenset(model.coarse.group_of[t] for t in variable_tensors(graph, model.coarse))


def state_index(model: LevelModel, group: int, state: OutputState) -> int | None:
    states = model.group_states(group)
    return states.index(state) if state in states else None


def illegal_states(model: LevelModel, result: LevelResult) -> list[str]:
    """Tensors whose stored state in `result` is not one the level allows (empty if none)."""
    return [f"{t}: {s} not in {[str(x) for x in model.problem.states(t)]}"
            for t, s in result.states.items() if s not in model.problem.states(t)]


def _entries(model: LevelModel, op: str, c: int):
    """Choice c's cost entries split into inputs [(tensor, bytes)] and outputs
    [(tensor, bytes, produced state)], in `cost_vectors` order (inputs with data boxes,
    then one entry per output)."""
    choice = model.problem.choices[op][c]
    entries = model.vectors[op][c]
    n_in = sum(boxes is not None for boxes in choice.input_boxes)
    outputs = [(t, v, state) for (t, v), state in zip(entries[n_in:], choice.produced)]
    return entries[:n_in], outputs


def _legal_stored(model: LevelModel, group: int, produced: OutputState,
                  vector: np.ndarray) -> int:
    """The stored state of an output produced as `produced`: itself when legal, else the
    cheapest conversion (Partial: reduce-scatter to the first split; R: the first split)."""
    index = state_index(model, group, produced)
    return index if index is not None else int(np.argmin(vector))


def _run(graph: Graph, topology: Topology, rule: Rule, entries=None,
         observe: Observer | None = None) -> SearchResult:
    """recursive.search with `rule` picking each level's assignment; a state the level
    does not allow raises (the rules pick state indices, so it never should)."""
    done: list[LevelResult] = []

    def solver(model: LevelModel) -> LevelResult:
        start = time.perf_counter()
        assignment = rule(model, len(done), tuple(done))
        result = result_of(model, assignment, False, time.perf_counter() - start)
        bad = illegal_states(model, result)
        if bad:
            raise PlanInfeasibleError(
                f"baseline picked states the level does not allow: {bad[:3]}",
                fix="report this: a baseline rule must pick from LevelModel.group_states.")
        if observe is not None:
            observe(model, result)
        done.append(result)
        return result

    return search(graph, topology, solver=solver, entries=entries,
                  options=Options(variable_storage=VariableStorage.REPLICABLE))


# -- data parallel -------------------------------------------------------------------------

def batch_states(graph: Graph, model: LevelModel) -> dict[str, OutputState]:
    """Tensor -> the Split that carries the batch, seeded at dim 0 of the fed inputs.

    Op by op in topological order: among the op's choices, the one whose batch inputs
    (inputs with a known batch split) cost the fewest fetch bytes at those splits runs
    (ties: a splitting choice, then the first); each output it produces as a legal
    Split(d) carries the batch on d. Partial or R outputs (weight gradients, the loss)
    carry none."""
    problem = model.problem
    batch: dict[str, OutputState] = {}
    for op in graph.ops_by_role(Role.INPUT):
        for t in op.outputs:
            if t in problem.tensors and Split(0) in problem.states(t):
                batch[t] = Split(0)
    for op in problem.ops:
        if not any(t in batch for t in op.inputs):
            continue
        best = None
        for c, choice in enumerate(problem.choices[op.name]):
            inputs, outputs = _entries(model, op.name, c)
            read = [v[problem.states(t).index(batch[t])] for t, v in inputs if t in batch]
            if read:
                key = (float(sum(read)), choice.strategy is None, c)
                best = min(best, (key, outputs)) if best else (key, outputs)
        for t, _, produced in (best[1] if best else ()):
            if produced.kind == "split" and produced in problem.states(t):
                batch.setdefault(t, produced)
    return batch


def data_parallel_assignment(graph: Graph, model: LevelModel) -> Assignment:
    batch = batch_states(graph, model)
    fixed: dict[int, list[int]] = {}
    for g in variable_groups(graph, model):
        fixed[g] = [state_index(model, g, REPLICATED)]
    for g, members in enumerate(model.coarse.members):
        carried = Counter(batch[t] for t in members if t in batch)
        if g not in fixed and carried:
            fixed[g] = [state_index(model, g, carried.most_common(1)[0][0])]
    return best_completion(model, fixed)


def data_parallel(graph: Graph, topology: Topology, *, entries=None,
                  observe: Observer | None = None) -> SearchResult:
    return _run(graph, topology, lambda model, _, __: data_parallel_assignment(graph, model),
                entries, observe)


# -- equal chop ----------------------------------------------------------------------------

def _lasting_states(model: LevelModel, group: int, ways: tuple[int, ...]) -> list[int]:
    """States of the group that stay legal at every later level of `ways`."""
    shape = model.problem.tensors[model.coarse.members[group][0]].shape
    out = []
    for i, state in enumerate(model.group_states(group)):
        if state.kind != "split":
            out.append(i)
            continue
        n = shape[state.dim]
        for k_prev, k in zip(ways, ways[1:]):
            n = -(-n // k_prev)
            if n < k:
                break
        else:
            out.append(i)
    return out


def equal_chop(graph: Graph, topology: Topology, *, entries=None,
               observe: Observer | None = None) -> SearchResult:
    def rule(model: LevelModel, level: int, done: tuple[LevelResult, ...]) -> Assignment:
        if level == 0:
            allowed = {g: kept for g in range(len(model.domains))
                       if (kept := _lasting_states(model, g, topology.ways))}
            return best_completion(model, allowed)
        first = done[0]
        fixed = {}
        for g, members in enumerate(model.coarse.members):
            index = state_index(model, g, first.states[members[0]])
            if index is not None:
                fixed[g] = [index]
        return best_completion(model, fixed)
    return _run(graph, topology, rule, entries, observe)


# -- all-row greedy ------------------------------------------------------------------------

def all_row_assignment(model: LevelModel) -> Assignment:
    """Each group on its first splittable dim (states list splits by dim, R last)."""
    return tuple(0 for _ in model.domains)


def all_row_greedy(graph: Graph, topology: Topology, *, entries=None,
                   observe: Observer | None = None) -> SearchResult:
    return _run(graph, topology, lambda model, _, __: all_row_assignment(model), entries, observe)


# -- spartan -------------------------------------------------------------------------------

def group_bytes(model: LevelModel, group: int) -> int:
    """Bytes of one tensor of the group (members share a shape; the widest dtype)."""
    specs = [model.problem.tensors[t] for t in model.coarse.members[group]]
    return int(np.prod(specs[0].shape, dtype=np.int64)) * max(s.itemsize for s in specs)


def spartan_assignment(model: LevelModel) -> Assignment:
    factors = [f for _, f in op_factors(model)]
    touching: list[list[dp.Factor]] = [[] for _ in model.domains]
    for f in factors:
        for g in f.scope:
            touching[g].append(f)
    order = sorted(range(len(model.domains)),
                   key=lambda g: (-group_bytes(model, g), model.coarse.position[g]))
    fixed: dict[int, int] = {}
    for g in order:
        cost = np.zeros(model.domains[g])
        for f in touching[g]:
            cost += _optimistic_marginal(f, g, fixed)
        fixed[g] = int(np.argmin(cost))
    return tuple(fixed[g] for g in range(len(model.domains)))


def _optimistic_marginal(factor: dp.Factor, group: int, fixed: Mapping[int, int]) -> np.ndarray:
    """The factor over `group`'s states: fixed groups at their states, others at their min."""
    index = tuple(fixed[u] if u in fixed and u != group else slice(None) for u in factor.scope)
    table = factor.table[index]
    free = [u for u in factor.scope if u not in fixed or u == group]
    axis = free.index(group)
    others = tuple(a for a in range(table.ndim) if a != axis)
    return table.min(axis=others) if others else table


def spartan(graph: Graph, topology: Topology, *, entries=None,
            observe: Observer | None = None) -> SearchResult:
    return _run(graph, topology, lambda model, _, __: spartan_assignment(model), entries, observe)


# -- layer-wise DP (OptCNN) ----------------------------------------------------------------

@dataclass
class LayerSpace:
    """Layers as DP variables (OptCNN: one configuration per layer, no free tensor).

    A layer is a forward op with the gradient ops whose `forward_op` it is; an op of no
    layer (variable reads, optimizer updates, constants) is its own. A group belongs to
    the layer of the first op producing it, unless that op is a source (no data input:
    a variable handle, a placeholder, a constant) — then to the layer of its first real
    consumer (an op reading it with an output outside it: the MatMul that reads a weight,
    not the ReadVariableOp or the update), as OptCNN partitions a layer's parameters and
    input by the layer's configuration.

    Configuration c of a layer: its head runs choice c; each other op of the layer, in
    topological order, runs the choice cheapest on the groups the layer has already laid
    out (ties: the first). A group the layer reads takes the state its first reader's
    choice reads most cheaply; a group it produces, the produced state (Partial or not a
    legal stored state: the cheapest legal conversion). Groups with neither a producer
    nor a consumer are variables of their own, with all their states."""
    layers: list[str]                    # variable -> its layer's head op ('': a lone group)
    domains: list[int]                   # variable -> number of configurations
    owner: list[int]                     # group -> variable
    induced: list[np.ndarray]            # group -> state index per config of its owner

    @staticmethod
    def build(graph: Graph, model: LevelModel) -> "LayerSpace":
        names = [op.name for op in model.problem.ops]
        layer_of = {n: (graph.op(n).forward_op
                        if n in graph and graph.op(n).forward_op in model.vectors else n)
                    for n in names}
        owner_layer = _owner_layers(model, names, layer_of)
        place = {n: i for i, n in enumerate(names)}
        space = LayerSpace([], [], [-1] * len(model.domains),
                            [np.zeros(0, dtype=np.int64)] * len(model.domains))
        for layer in sorted(set(owner_layer.values()), key=place.__getitem__):
            ops = [n for n in names if layer_of[n] == layer]
            space._add_layer(model, ops, [g for g, lay in owner_layer.items() if lay == layer])
        for g in range(len(model.domains)):
            if g not in owner_layer:
                space._add_lone_group(model, g)
        return space

    def _add_layer(self, model: LevelModel, ops: list[str], owned: list[int]) -> None:
        var, configs = len(self.domains), len(model.vectors[ops[0]])
        states = np.zeros((len(owned), configs), dtype=np.int64)
        for c in range(configs):
            laid_out = _layer_states(model, ops, c)
            states[:, c] = [laid_out[g] for g in owned]
        self.layers.append(ops[0])
        self.domains.append(configs)
        for i, g in enumerate(owned):
            self.owner[g], self.induced[g] = var, states[i]

    def _add_lone_group(self, model: LevelModel, group: int) -> None:
        self.owner[group] = len(self.domains)
        self.induced[group] = np.arange(model.domains[group])
        self.layers.append("")
        self.domains.append(model.domains[group])

    def factor(self, factor: dp.Factor) -> dp.Factor:
        """An op's factor over groups, as a factor over the variables owning them."""
        scope = sorted({self.owner[g] for g in factor.scope})
        index = []
        for g in factor.scope:
            view = [1] * len(scope)
            view[scope.index(self.owner[g])] = self.domains[self.owner[g]]
            index.append(self.induced[g].reshape(view))
        return dp.Factor(tuple(scope), factor.table[tuple(index)])

    def assignment(self, configs) -> Assignment:
        return tuple(int(self.induced[g][configs[self.owner[g]]])
                     for g in range(len(self.owner)))


def _owner_layers(model: LevelModel, names: list[str], layer_of: dict[str, str]
                  ) -> dict[int, str]:
    """Group -> the layer that lays it out (see `LayerSpace`)."""
    group_of = model.coarse.group_of
    produced: dict[int, str] = {}
    consumed: dict[int, str] = {}
    for n in names:
        inputs, outputs = _entries(model, n, 0)
        out_groups = {group_of[t] for t, _, _ in outputs}
        for t, _ in inputs:
            g = group_of[t]
            if out_groups - {g}:
                consumed.setdefault(g, layer_of[n])
        for g in out_groups:
            produced.setdefault(g, n)
    owner = {}
    for g, producer in produced.items():
        source = not _entries(model, producer, 0)[0]
        owner[g] = consumed.get(g, layer_of[producer]) if source else layer_of[producer]
    for g, layer in consumed.items():
        owner.setdefault(g, layer)
    return owner


def _layer_states(model: LevelModel, ops: list[str], config: int) -> dict[int, int]:
    """Group -> state index for every group the layer's ops read or produce."""
    known: dict[int, int] = {}
    group_of = model.coarse.group_of
    for n, op in enumerate(ops):
        if n == 0:
            c = config
        else:
            costs = [sum(float(v[known[group_of[t]]]) for t, v in model.vectors[op][c]
                         if group_of[t] in known)
                     for c in range(len(model.vectors[op]))]
            c = int(np.argmin(costs))
        inputs, outputs = _entries(model, op, c)
        for t, vector in inputs:
            known.setdefault(group_of[t], int(np.argmin(vector)))
        for t, vector, produced in outputs:
            known.setdefault(group_of[t], _legal_stored(model, group_of[t], produced, vector))
    return known


def layer_wise_assignment(graph: Graph, model: LevelModel) -> Assignment:
    space = LayerSpace.build(graph, model)
    factors = [space.factor(f) for _, f in op_factors(model)]
    solution = dp.solve(space.domains, factors)
    return space.assignment(solution.assignment)


def layer_wise_dp(graph: Graph, topology: Topology, *, entries=None,
                  observe: Observer | None = None) -> SearchResult:
    return _run(graph, topology, lambda model, _, __: layer_wise_assignment(graph, model),
                entries, observe)


BASELINES: dict[str, Callable[..., SearchResult]] = {
    "data_parallel": data_parallel,
    "equal_chop": equal_chop,
    "all_row_greedy": all_row_greedy,
    "spartan": spartan,
    "layer_wise_dp": layer_wise_dp,
}
