"""The joint problem of all levels (`joint_model`; `exact.joint_optimum` its optimum, and
`Options.joint_choices` where the search solves it): the recursion fixes level 1 before it
solves level 2; the joint problem minimises total = c_1 + k_1 c_2 + k_1 k_2 c_3 + ...
(c_l: level l's bytes, its choices' work and its transfers' price, search/level.py)
over all levels' states and choices at once. It is a problem of the same form as one
level. A group's joint state is a path (X_1, X_2, ...) through its state tree: X_1 a
level-1 state, X_2 a state of the level-2 tensor shape that X_1 leaves, and so on. An op's
joint choice is a chain (c_1, c_2, ..., c_L): c_{l+1} a choice of part 0's local op under
c_l (`problem.sub_problem`; the local op depends on the outer choices only). The level-l
choice's bytes for a tensor depend on the choice, the tensor and its part shape there
(`cost_vectors` per tensor), which its group's states X_1..X_{l-1} fix: so the chain's
vector for group g, over the group's leaves, is sum_l k_1...k_{l-1} v_l[X_l] with v_l
taken at the part shape of the leaf's path, and the op's cost is the sum over its groups,
as at one level. `dp.solve` minimises it through the op tables (min over chains), the ILP
(search/ilp.py) through the chains; both are exact and must agree. `JointModel.plan_cost`
prices a recursive plan in it: equal to its objective. `exact.recursion_under` reruns the
recursion with level 1 fixed to the joint optimum's (`JointModel.first_level`): where it
meets the joint optimum, the recursion's gap is all in level 1, chosen by its own cost
without the levels below.

Limits: chains multiply the levels' choice counts (tens per op at 2 levels, a hundred or
more at 3), and a group's leaves the levels' state counts, so the op tables grow with the
product of their groups' leaves: the tiny reference models take a second or a few at 2
levels; at 3 the Transformer's two, WResNet's sixteen (bench/results/search.md). Past
`max_joint_choices` chains (summed over ops), an op of more than MAX_OP_TABLE chains x
table entries, or all ops' tables past MAX_TABLE_WORK, it raises rather than run for
minutes. Building the chains (the walk: each local op costed at every part shape) takes
most of the time; where it is large it is shared among forked processes, one per core
(`_walk_ops`). The DP reads each op's min table alone (LevelModel.min_table).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import enum
import functools
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from tofu_tf import _forking
from tofu_tf.errors import PlanInfeasibleError, TofuError
from tofu_tf.graph import Graph
from tofu_tf.op_semantics.analysis import REPLICATED, OutputState
from tofu_tf.op_semantics.catalog import OpEntry, catalog
from tofu_tf.options import Options, VariableStorage
from tofu_tf.search import dp
from tofu_tf.search.coarsen import CoarseGraph, coarsen
from tofu_tf.search.ilp import DEFAULT_TIME_LIMIT, ilp_minimum, merged_vectors
from tofu_tf.search.level import LevelModel, choice_work, level_models
from tofu_tf.search.problem import (Choice, Problem, ProblemOp, SearchCache, TensorSpec,
                                    clamp_box, entry_vectors, fetch_extra, geometry,
                                    make_choice, searched, sub_problem, viewed)
from tofu_tf.search.topology import Topology

MAX_JOINT_CHOICES = 1_000_000        # joint choices summed over ops, before giving up
# Most ILP columns `optimum` gives HiGHS where the DP's tables are too large: the LSTM at
# 2x4 with shared reads has 66338 (proved in 2.2-3.3 CPU seconds), the Transformer at 2x2
# and 2x4 about 150000 (its LP relaxation integral: the plan in 1.9 s, 1.6-2.8% fewer
# bytes than the plan without views priced with them); of the stock Keras models' default
# searches at 4, 6 and 8 devices three more are proved (DINOv3, ESM-2, RoFormer-V2 at 4:
# 1.7-2.7 s against 0.3-0.5, DINOv3 3.9% fewer bytes). Past about 240000 (by estimate) the
# proofs take tens of seconds (the LSTM at 2x2x2 with shared reads: 773527 columns, 34 s).
ILP_VARIABLES = 200_000
# An ILP whose columns, estimated before the walk, are past this many times ILP_VARIABLES
# is not built (the estimate was within 5% either way of the columns on the tiny models
# and the stock Keras ones, 6750-621338: past the bound, a walk of a second or more for
# nothing).
ILP_ESTIMATE_SLACK = 1.2
# Most branch-and-bound nodes it may take: the bound that decides, as the time limit
# would on a loaded machine. Every joint ILP of the tiny models at 2x2, 2x4 and 2x2x2,
# with and without shared reads, is proved at its root node (its LP relaxation is
# integral), up to 194563 columns in 10 CPU seconds.
ILP_NODES = 1_000
# Most chains x table entries of one op (the min over chains, LevelModel.min_table, takes
# about 0.05 s per 2^26 here: the Transformer's largest at 2x2x2 179 x 250047, WResNet's
# 448 x 499968), and of all ops' tables, each key's once (WResNet at 2x2x2: 2^31.4).
MAX_OP_TABLE = 2 ** 30
MAX_TABLE_WORK = 2 ** 32
# A walk of at least this many estimated chains (summed over the ops walked, one per
# geometry) is shared among forked processes, at most MAX_WORKERS of the cores there are
# (the tiny MLP's at 2x2, 284 and a fifth of a second, gains a third on 2 cores).
PARALLEL_CHAINS = 250
MAX_WORKERS = 8
UNBOUNDED = 2 ** 40                  # a dim no box reaches past, for shape-free choices


class JointMethod(enum.Enum):
    """Which exact solver minimises the joint problem."""
    DP = "dp"          # dp.solve over the op tables
    ILP = "ilp"        # ilp_minimum over the joint choices
    BOTH = "both"      # both; they must agree


@dataclass(frozen=True)
class StateTree:
    """A group's joint states from one level down: its states at this level and, per
    state, the tree of the part shape that state leaves. The leaves, depth first, are the
    joint states; `offsets[s]:offsets[s + 1]` are the leaves below state s."""
    states: tuple[OutputState, ...]
    children: tuple["StateTree", ...]          # per state; empty at the last level
    offsets: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.offsets[-1]

    @functools.cached_property
    def spread(self) -> np.ndarray:
        """Per leaf, the index of the state it is below."""
        return np.repeat(np.arange(len(self.states)), np.diff(self.offsets))

    def leaf(self, path: tuple[int, ...]) -> int:
        """The leaf index of a path of state indices, one per level."""
        below = self.children[path[0]].leaf(path[1:]) if self.children else 0
        return self.offsets[path[0]] + below

    def path(self, leaf: int) -> tuple[int, ...]:
        """The state index per level of a leaf (`leaf`'s inverse)."""
        state = bisect.bisect_right(self.offsets, leaf) - 1
        below = self.children[state].path(leaf - self.offsets[state]) if self.children else ()
        return (state,) + below


def _empty_problem(base: Problem, k: int, tensors: dict[str, TensorSpec]) -> Problem:
    return Problem(k, [], tensors, base.replicable, base.replicate_below,
                   views=base.views)


def _part_tensors(problem: Problem, states: dict[str, OutputState], k_next: int
                  ) -> dict[str, TensorSpec]:
    """The next level's tensors of `problem` (part 0's shapes under `states`)."""
    return sub_problem(_empty_problem(problem, problem.k, problem.tensors), states, {},
                       k_next).tensors


def state_tree(spec: TensorSpec, base: Problem, ways: tuple[int, ...]) -> StateTree:
    """The joint state tree of a tensor at the cuts `ways` (outermost first)."""
    here = _empty_problem(base, ways[0], {spec.name: spec})
    states = here.states(spec.name)
    children: tuple[StateTree, ...] = ()
    if len(ways) > 1:
        children = tuple(state_tree(_part_tensors(here, {spec.name: s}, ways[1])[spec.name],
                                    base, ways[1:]) for s in states)
    sizes = [child.size for child in children] or [1] * len(states)
    return StateTree(states, children, tuple(int(v) for v in np.cumsum([0] + sizes)))


@dataclass(frozen=True)
class _Node:
    """A group at one level under fixed outer states: its subtree, where the subtree's
    leaves start among the group's leaves, and the part shapes there of its tensors (those
    of the op being walked)."""
    tree: StateTree
    offset: int
    tensors: dict[str, TensorSpec]


@dataclass
class _Walk:
    """Builds each op's joint choices: chains of one choice per level, each a choice of
    the local op the choice above leaves (`sub_problem`; a local op depends on the outer
    choices only). A choice's vector for a tensor depends only on the choice, the tensor
    and the tensor's part shape, which its group's outer states fix; so a chain's cost is
    a vector per group over the group's leaves, and the joint problem keeps the form of
    one level. Shapes enter a choice only through `clamp_box`, and clamping to unbounded
    shapes and then (offset 0) to the real ones is clamping to the real ones: each local
    op is localized once, and each (template, choice, slot, tensor kind) costed once."""
    base: Problem
    coarse: CoarseGraph
    ways: tuple[int, ...]
    limit: int                                         # most joint choices in all
    flop_bytes: float                                  # the price of repeated work
    transfer_bytes: float              # the price of one transfer between two devices
    levels: dict = field(default_factory=dict)         # (id(op), label) -> (op, local op)
    templates: dict = field(default_factory=dict)      # template -> (op, choices, whole)
    vectors: dict = field(default_factory=dict)   # (template, choice, slot, tensor kind)
    #                                                 -> (bytes, transfers)
    clamped: dict = field(default_factory=dict)        # clamp_boxed's memo
    entries: dict = field(default_factory=dict)        # entry_vectors' memo
    choices: int = 0                                   # joint choices made so far

    def chains(self, model: LevelModel, op: ProblemOp, scope: tuple[int, ...],
               trees: list[StateTree]) -> list[tuple[tuple[str, ...], list[np.ndarray]]]:
        """Every joint choice of `op`: (its labels, outermost first; its bytes per scope
        group over the group's leaves)."""
        tensors = {t: model.problem.tensors[t] for t in op.inputs + op.outputs}
        problem = self._problem(model.problem.k, op, tensors, model.problem.choices[op.name])
        nodes = [[_Node(tree, 0, {t: spec for t, spec in tensors.items()
                                  if self.coarse.group_of[t] == g})]
                 for g, tree in zip(scope, trees)]
        per_node = [[[merged.get(g)] for g in scope] for merged in
                    (merged_vectors(self.coarse.group_of, e) for e in model.priced(op.name))]
        return self._chains(problem, per_node, model.work(op.name), nodes,
                            [tree.size for tree in trees], 0)

    def _chains(self, problem: Problem, per_node: list, work: np.ndarray,
                nodes: list[list[_Node]], sizes: list[int], level: int):
        """The chains from `level` down of the op of `problem` (its choices at this level;
        per choice and scope group, a vector over the states of each of the group's
        `nodes`, None where the choice moves none of its tensors)."""
        op, scale = problem.ops[0], math.prod(self.ways[:level])
        last = level == len(self.ways) - 1
        if not last:
            k = self.ways[level + 1]
            below = [[_Node(node.tree.children[s], node.offset + node.tree.offsets[s],
                            _part_tensors(self._problem(problem.k, None, node.tensors),
                                          dict.fromkeys(node.tensors, state), k))
                      for node in at for s, state in enumerate(node.tree.states)]
                     for at in nodes]
        out = []
        for choice, chosen in enumerate(problem.choices[op.name]):
            vectors = [_spread(at, vectors, scale, size)
                       for at, vectors, size in zip(nodes, per_node[choice], sizes)]
            if vectors and work[choice]:            # the choice's work, on its first group
                vectors[0] = vectors[0] + scale * work[choice]
            if last:
                out.append(((chosen.label,), vectors))
                continue
            local, local_nodes, local_work = self._below(problem, chosen.label, below,
                                                         level + 1)
            for labels, deeper in self._chains(local, local_nodes, local_work, below, sizes,
                                               level + 1):
                out.append(((chosen.label,) + labels,
                            [v + d for v, d in zip(vectors, deeper)]))
        return out

    def count(self, op: ProblemOp, more: int) -> None:
        self.choices += more
        if self.choices > self.limit:
            raise JointTooLarge.of(f"more than {self.limit}", self.ways, node=op.name,
                                   op_type=op.sem.op_type)

    def kind(self, spec: TensorSpec) -> tuple:
        """What a tensor's states, state tree and vectors depend on: its shape, whether it
        is a view, whether it may be replicated whatever its size, and a view's
        footprint."""
        view = spec.name in self.base.views
        return (spec.shape, view,
                (viewed(spec.name) if view else spec.name) in self.base.replicable,
                spec.footprint)

    def _problem(self, k: int, op: ProblemOp | None, tensors: dict[str, TensorSpec],
                 choices: list[Choice] | None = None) -> Problem:
        """The op alone at a cut of k, sharing the search's descriptions of local ops;
        its vectors are not remembered by geometry (`self.vectors` keeps them)."""
        ops = [op] if op is not None else []
        return Problem(k, ops, tensors, self.base.replicable, self.base.replicate_below,
                       {op.name: choices} if choices is not None else {},
                       cache=self.base.cache, geometries={o.name: None for o in ops},
                       views=self.base.views)

    def _below(self, problem: Problem, label: str, nodes: list[list[_Node]], level: int):
        """One level down after the choice `label`: the local op's problem (its choices),
        per choice and scope group a vector per node, and per choice its work."""
        op, k = problem.ops[0], self.ways[level]
        key = (id(op), label)
        if key not in self.levels:        # op kept alive with it: its id keys the entry
            self.levels[key] = (op, sub_problem(problem, {}, {op.name: label}, k).ops[0])
        local = self.levels[key][1]
        template = self._template(local, k)
        chosen, whole = self.templates[template][1:]
        for i in range(max(len(at) for at in nodes)):      # every node's shapes, costed
            self._cost(local, k, template, {t: spec for at in nodes for t, spec
                                            in at[min(i, len(at) - 1)].tensors.items()})
        price = self.transfer_bytes * math.prod(self.ways[level + 1:])
        slots = [_slots(c, local) for c in chosen]

        def vector(n: int, node: _Node) -> np.ndarray | None:
            """Choice n's bytes on the node's states (its group's tensors summed), +inf
            where running the op whole stores an output replicated that may not be
            (`may_replicate`); None where it moves none of the group's tensors."""
            if n == whole and any(REPLICATED not in self._problem(k, None, {t: spec}).states(t)
                                  for t, spec in node.tensors.items() if t in local.outputs):
                return np.full(len(node.tree.states), np.inf)
            out = None
            for slot, tensor in slots[n]:
                spec = node.tensors.get(tensor)
                if spec is not None:
                    bytes_, transfers = self.vectors[template, n, slot, self.kind(spec)]
                    if price:
                        bytes_ = bytes_ + price * transfers
                    out = bytes_ if out is None else out + bytes_
            return out
        per_node = [[[vector(n, node) for node in at] for at in nodes]
                    for n in range(len(chosen))]
        first = {t: spec for at in nodes for t, spec in at[0].tensors.items()}
        return (self._problem(k, local, first, chosen), per_node,
                choice_work(k, local, chosen, self.flop_bytes))

    def _template(self, op: ProblemOp, k: int) -> tuple:
        """What the op's choices and vectors depend on but its tensors (its geometry's
        template at this k; the op itself where it has none), as a key of `templates`:
        `build_choices` for the op on unbounded shapes (clamped where costed), with
        `replicate` always, and its index where only some shapes allow it (it has
        strategies: `may_replicate`)."""
        key = (k, op.template) if op.template is not None else (k, None, id(op))
        if key not in self.templates:
            unbounded = Problem(k, [op], {
                t: TensorSpec(t, (UNBOUNDED,) * len(self.base.tensors[t].shape),
                              self.base.tensors[t].dtype) for t in op.inputs + op.outputs})
            strategies = [make_choice(unbounded, op, s) for s in op.strategies
                          if s.valid_for(k)]
            whole = len(strategies) if strategies else None
            self.templates[key] = (op, strategies + [make_choice(unbounded, op, None)],
                                   whole)
        return key

    def _cost(self, op: ProblemOp, k: int, template: tuple,
              tensors: dict[str, TensorSpec]) -> None:
        """Each choice's (bytes, transfers) per tensor at these shapes, into `vectors`."""
        chosen = self.templates[template][1]
        keys = [[(template, n, slot, self.kind(tensors[t])) for slot, t in _slots(c, op)]
                for n, c in enumerate(chosen)]
        if all(key in self.vectors for row in keys for key in row):
            return
        problem = self._problem(k, op, tensors)
        clamped = [clamp_boxed(c, op, problem, self.clamped) for c in chosen]
        for row, costs in zip(keys, entry_vectors(problem, op, clamped, self.entries)):
            self.vectors.update(zip(row, costs))


def _spread(nodes: list[_Node], per_node: list, scale: float, size: int) -> np.ndarray:
    """A group's vector over its `size` leaves: each node's vector over its states,
    scaled, on the leaves below each state (zero where a node has none)."""
    out = np.zeros(size)
    for node, vector in zip(nodes, per_node):
        if vector is not None:
            out[node.offset:node.offset + node.tree.size] += scale * vector[node.tree.spread]
    return out


def _slots(choice: Choice, op: ProblemOp) -> list[tuple[int, str]]:
    """(slot, tensor) of each entry `cost_vectors` makes for a choice, in its order."""
    count = len(op.inputs)
    return ([(i, op.inputs[i]) for i, boxes in enumerate(choice.input_boxes)
             if boxes is not None] +
            [(count + o, tensor) for o, tensor in enumerate(op.outputs)])


def clamp_boxed(choice: Choice, op: ProblemOp, problem: Problem, memo: dict) -> Choice:
    """A choice built on unbounded shapes, clamped to the tensors' real shapes. `memo`
    keeps each (boxes, shape, input window) clamped with its extra read (`fetch_extra`):
    many choices read or write a tensor alike (a walk clamps each about ten times)."""
    def clamp(boxes, shape, window=()) -> tuple:         # window (): an output
        if boxes is None:
            return None, 0
        key = (boxes, shape, window)
        found = memo.get(key)
        if found is None:
            found = memo[key] = (
                tuple(clamp_box(box, shape, (0,) * len(shape)) for box in boxes),
                0 if window == () else fetch_extra(boxes, window, shape))
        return found

    windows = [op.windows[i] if i < len(op.windows) else None
               for i in range(len(op.inputs))]
    inputs = [clamp(b, problem.tensors[t].shape, w)
              for b, t, w in zip(choice.input_boxes, op.inputs, windows)]
    return dataclasses.replace(
        choice, input_boxes=tuple(boxes for boxes, _ in inputs),
        input_extra=tuple(extra for _, extra in inputs),
        output_boxes=tuple(clamp(b, problem.tensors[t].shape)[0]
                           for b, t in zip(choice.output_boxes, op.outputs)))


@dataclass(frozen=True)
class JointSolution:
    """The joint optimum: a leaf (joint state) per group and the objective in bytes."""
    cost: float
    leaves: tuple[int, ...]
    method: JointMethod
    seconds: float


@dataclass(frozen=True)
class JointModel:
    """The product-domain problem of all levels, in LevelModel form (problem=None):
    domains are leaf counts, vectors are joint choices' bytes over leaves."""
    model: LevelModel
    trees: tuple[StateTree, ...]                       # per group
    keys: dict[str, list[tuple]]                       # op -> key per joint choice
    ways: tuple[int, ...]

    def plan_leaves(self, result: SearchResult) -> tuple[int, ...]:
        """The joint state of each group under a recursive plan."""
        return tuple(tree.leaf(tuple(level.assignment[g] for level in result.levels))
                     for g, tree in enumerate(self.trees))

    def first_level(self, leaves: tuple[int, ...]) -> tuple[tuple[int, ...], dict[str, str]]:
        """Level 1 of the joint states `leaves` (as `fixed_levels` gives each level)."""
        return self._levels(leaves, 1)[0]

    def fixed_levels(self, leaves: tuple[int, ...]
                     ) -> list[tuple[tuple[int, ...], dict[str, str]]]:
        """Every level but the last of the joint states `leaves`, as the recursion's
        levels see them: each group's state index in that level's domain, and each op's
        choice label in the best joint choices under `leaves`."""
        return self._levels(leaves, len(self.ways) - 1)

    def _levels(self, leaves, count: int) -> list[tuple[tuple[int, ...], dict[str, str]]]:
        _, chosen = self.model.evaluate(leaves)
        paths = [tree.path(leaf) for tree, leaf in zip(self.trees, leaves)]
        return [(tuple(path[level] for path in paths),
                 {op: self.keys[op][c][level] for op, c in chosen.items()})
                for level in range(count)]

    def plan_cost(self, result: SearchResult) -> float:
        """The joint objective of a recursive plan's own states and choices; equals its
        objective when the joint pieces match sub_problem."""
        leaves, total = self.plan_leaves(result), 0.0
        for op, choices in self.model.vectors.items():
            scope = self.model.op_scope(op)
            if not scope:
                continue
            key = _plan_key(result, op)
            entries = choices[self.keys[op].index(key)]
            total += sum(float(v[leaves[self.model.coarse.group_of[t]]]) for t, v in entries)
        return total

    def solve(self, method: JointMethod = JointMethod.DP,
              time_limit: float = DEFAULT_TIME_LIMIT,
              max_variables: int | None = None,
              node_limit: int | None = None) -> JointSolution:
        start = time.perf_counter()
        found = {}
        if method in (JointMethod.DP, JointMethod.BOTH):
            found[JointMethod.DP] = self._dp()
        if method in (JointMethod.ILP, JointMethod.BOTH):
            found[JointMethod.ILP] = self._ilp(time_limit, max_variables, node_limit)
        costs = [self.model.evaluate(leaves)[0] for leaves in found.values()]
        if not math.isclose(min(costs), max(costs), rel_tol=1e-9):
            raise TofuError(f"the joint DP and ILP disagree: {dict(zip(found, costs))}.",
                            fix="report this: both are exact on the same problem.")
        return JointSolution(costs[0], next(iter(found.values())), method,
                             time.perf_counter() - start)

    def _dp(self) -> tuple[int, ...]:
        solution = dp.solve(self.model.domains, self.model.factors()[0],
                            order=_order(self.model.coarse))
        if not solution.exact:
            raise JointTooWide(
                f"the joint DP needed a table larger than {dp.MAX_TABLE} entries "
                f"(largest {solution.max_table}); its answer would not be exact.",
                fix="use JointMethod.ILP for this graph.")
        return solution.assignment

    def _ilp(self, time_limit: float, max_variables: int | None,
             node_limit: int | None) -> tuple[int, ...]:
        solution = ilp_minimum(self.model, time_limit, max_variables=max_variables,
                               node_limit=node_limit)
        if not solution.optimal:
            raise PlanInfeasibleError(
                f"HiGHS did not prove the joint ILP optimal within {time_limit:g} s "
                f"and {node_limit} nodes ({solution.variables} variables, "
                f"{solution.constraints} constraints).",
                fix="raise time_limit, or use JointMethod.DP.")
        return solution.assignment


def _order(coarse: CoarseGraph) -> list[int]:
    """The groups in the coarse graph's linear order: the DP's ties."""
    return sorted(range(len(coarse.members)), key=lambda g: coarse.position[g])


def _plan_key(result: SearchResult, op: str) -> tuple:
    return tuple(level.choices[op] for level in result.levels)


class JointTooLarge(TofuError):
    """The joint problem has more joint choices than its limit, or an op table past the
    DP's."""

    @classmethod
    def of(cls, count: str, ways: tuple[int, ...], **where) -> "JointTooLarge":
        return cls(f"the joint problem has {count} joint choices (chains of one choice per "
                   f"level, summed over ops, at {len(ways)} levels "
                   f"{'x'.join(map(str, ways))}); it is meant for tiny graphs.",
                   fix="use fewer devices or a smaller model, or raise max_joint_choices.",
                   **where)

    @classmethod
    def tables(cls, work: int, ways: tuple[int, ...], limit: int) -> "JointTooLarge":
        return cls(f"the joint DP's op tables have {work} chains x entries in all (at "
                   f"{'x'.join(map(str, ways))}), more than {limit}; it is meant for tiny "
                   f"graphs.", fix="use fewer levels or devices, or a smaller model.")

    @classmethod
    def table(cls, chains: int, cells: int, ways: tuple[int, ...], limit: int, **where
              ) -> "JointTooLarge":
        return cls(f"an op's joint table has {cells} entries (the product of its groups' "
                   f"joint states at {'x'.join(map(str, ways))}) for each of its about {chains} "
                   f"chains, more than {limit} in all; it is meant for tiny graphs.",
                   fix="use fewer levels or devices, or a smaller model.", **where)


class JointTooWide(JointTooLarge):
    """The joint problem is within its limits, but the DP's elimination would build a
    table past dp.MAX_TABLE: HiGHS may still solve it (`optimum`)."""


def joint_model(graph: Graph, topology: Topology, *,
                entries: dict[str, OpEntry] | None = None,
                max_joint_choices: int = MAX_JOINT_CHOICES,
                coarse: CoarseGraph | None = None, options: Options = Options(),
                storage: VariableStorage = VariableStorage.REPLICABLE,
                cache: SearchCache | None = None,
                max_op_table: int = MAX_OP_TABLE,
                method: JointMethod = JointMethod.DP,
                max_table_work: int = MAX_TABLE_WORK,
                max_ilp_columns: int | None = None) -> JointModel:
    """Build the joint problem of every level of `topology` (see the module docstring)
    over the plans the recursion searches under `options` and variable `storage`.
    Raises JointTooLarge past `max_joint_choices`, or tables past their bounds
    (`joint_below`), and for `method` DP JointTooWide where the DP's elimination would be
    past dp.MAX_TABLE."""
    entries = entries if entries is not None else catalog(graph, strict=True)
    coarse = coarse if coarse is not None else coarsen(graph, entries)
    root = next(level_models(graph, topology, entries, coarse, options, storage, cache))
    return joint_below(root, topology.ways, max_joint_choices, max_op_table, method,
                       max_table_work, max_ilp_columns)


def least_joint_choices(graph: Graph, entries: Mapping[str, OpEntry],
                        ways: tuple[int, ...]) -> int:
    """At most the estimate `joint_below` checks before its walk, from the op descriptions
    alone (no level model): per op of the problem (problem.searched), its strategies
    valid at the first cut (one where none is) times `_deeper_choices`. A search can skip
    a joint problem this already puts past its limit without building level 1's model (a
    large graph's takes a tenth of a second to seconds)."""
    return sum(max(1, sum(s.valid_for(ways[0]) for s in entry.strategies))
               * _deeper_choices(entry.strategies, ways)
               for op in graph for entry in (entries[op.name],) if searched(op, entry))


def _deeper_choices(strategies, ways: tuple[int, ...]) -> int:
    """About how many chains one choice at the first cut leads to: 1 + the strategies
    valid at each cut below (`replicate` and the splits; a local op has about as many)."""
    return math.prod(1 + sum(s.valid_for(k) for s in strategies) for k in ways[1:])


def joint_below(root: LevelModel, ways: tuple[int, ...],
                max_joint_choices: int = MAX_JOINT_CHOICES,
                max_op_table: int = MAX_OP_TABLE,
                method: JointMethod = JointMethod.DP,
                max_table_work: int = MAX_TABLE_WORK,
                max_ilp_columns: int | None = None) -> JointModel:
    """The joint problem of the levels `ways` from the level of `root` down (its cut is
    ways[0]; the recursion's model of any level, whose levels above are fixed): c_1 + k_1
    c_2 + ... counted from that level. Raises JointTooLarge past `max_joint_choices`, an
    op past `max_op_table` chains x table entries, for a `method` with the DP all ops'
    tables past `max_table_work` (by estimate before the walk, exactly after), for DP
    JointTooWide past the DP's table bound, and for ILP an ILP whose estimated columns
    are past ILP_ESTIMATE_SLACK x `max_ilp_columns`."""
    base, coarse = root.problem, root.coarse                           # with the views
    walk = _Walk(base, coarse, ways, max_joint_choices, root.flop_bytes,
                 root.transfer_bytes / math.prod(ways[1:]))
    made_trees: dict = {}                              # tensor kind -> its state tree
    for members in coarse.members:
        spec = base.tensors[members[0]]
        if walk.kind(spec) not in made_trees:
            made_trees[walk.kind(spec)] = state_tree(spec, base, ways)
    trees = tuple(made_trees[walk.kind(base.tensors[members[0]])]
                  for members in coarse.members)
    # each op's groups in the order its tensors first meet them: equal geometries
    # (choices and vectors), group patterns and trees have equal chains
    scopes = {op.name: tuple(dict.fromkeys(coarse.group_of[t] for t in op.inputs + op.outputs))
              for op in base.ops}
    cells = {op: math.prod(trees[g].size for g in scope) for op, scope in scopes.items()}
    # Before any walk: about prod_l c_l chains per op, c_l its strategies valid at level l's
    # cut and `replicate` (its local ops have about as many), so a problem far past the
    # limits is told at once (the walk counts exactly).
    about = {op.name: len(base.choices[op.name]) * _deeper_choices(op.strategies, ways)
             for op in base.ops}
    if sum(about.values()) > max_joint_choices:
        raise JointTooLarge.of(f"about {sum(about.values())}, more than "
                               f"{max_joint_choices},", ways)
    for op in base.ops:
        if about[op.name] * cells[op.name] > max_op_table:
            raise JointTooLarge.table(about[op.name], cells[op.name], ways, max_op_table,
                                      node=op.name, op_type=op.sem.op_type)
    if method is JointMethod.ILP and max_ilp_columns is not None:
        # MARGINAL's z columns: per chain, one per leaf of each of its groups (less its
        # infinite ones); past the bound by this estimate and its slack, no walk
        columns = sum(about[op.name] * sum(trees[g].size for g in scopes[op.name])
                      for op in base.ops)
        if columns > ILP_ESTIMATE_SLACK * max_ilp_columns:
            raise JointTooLarge(f"the joint ILP would have about {columns} columns, more "
                                f"than {max_ilp_columns} (at {'x'.join(map(str, ways))}); "
                                f"it is meant for tiny graphs.",
                                fix="use fewer levels or devices, or a smaller model.")
    # The DP's elimination reads only the scopes and leaf counts: a problem it could not
    # solve exactly is told before the walk too.
    domains = [tree.size for tree in trees]
    width = dp.largest_table(domains, [tuple(g for g in scopes[op.name] if domains[g] > 1)
                                       for op in base.ops], _order(coarse))
    if width > dp.MAX_TABLE and method is JointMethod.DP:
        raise JointTooWide(f"the joint DP would need a table of {width} entries, more than "
                           f"{dp.MAX_TABLE} (at {'x'.join(map(str, ways))}); it is meant "
                           f"for tiny graphs.", fix="use fewer levels or devices, or a "
                           "smaller model, or JointMethod.ILP.")
    # each op's chains walked once per key: equal geometries (choices and vectors),
    # group patterns and trees have equal chains
    key_of, walked = {}, {}
    for op in base.ops:
        scope = scopes[op.name]
        geo = geometry(base, op)
        key_of[op.name] = op.name if geo is None else (
            geo, tuple(scope.index(coarse.group_of[t]) for t in op.inputs + op.outputs),
            tuple(id(trees[g]) for g in scope))
        walked.setdefault(key_of[op.name], op)
    # each key's op table is made once: all of them by this estimate within the bound
    work = sum(about[op.name] * cells[op.name] for op in walked.values())
    if work > max_table_work and method is not JointMethod.ILP:
        raise JointTooLarge.tables(work, ways, max_table_work)
    repeats = collections.Counter(key_of.values())
    chains = dict(zip(walked, _walk_ops(walk, root, list(walked.values()), scopes, trees,
                                        [repeats[key] for key in walked],
                                        [about[op.name] for op in walked.values()])))
    work = sum(len(chains[key]) * cells[op.name] for key, op in walked.items())
    if work > max_table_work and method is not JointMethod.ILP:
        raise JointTooLarge.tables(work, ways, max_table_work)
    vectors, keys = {}, {}
    for op in base.ops:
        choices, scope = chains[key_of[op.name]], scopes[op.name]
        walk.count(op, len(choices))
        if len(choices) * cells[op.name] > max_op_table:
            raise JointTooLarge.table(len(choices), cells[op.name], ways, max_op_table,
                                      node=op.name, op_type=op.sem.op_type)
        keys[op.name] = [labels for labels, _ in choices]
        vectors[op.name] = [[(coarse.members[g][0], v) for g, v in zip(scope, joint)]
                            for _, joint in choices]
    model = LevelModel(None, coarse, vectors, domains)
    return JointModel(model, trees, keys, ways)


def _walk_ops(walk: _Walk, root: LevelModel, ops: list[ProblemOp], scopes, trees,
              repeats: list[int], weights: list[int]) -> list:
    """The chains of each op (`_Walk.chains`), in order: where the walk is large enough
    (its ops' estimated chains at least PARALLEL_CHAINS) and the machine has several cores,
    shared among forked processes (`_forking`; each op's chains are the same whoever
    walks them), the largest ops first, each to the least loaded process."""
    workers = min(len(ops), MAX_WORKERS, _cores())
    if workers < 2 or sum(weights) < PARALLEL_CHAINS or not _forking.available():
        return _walk_share(walk, root, ops, scopes, trees, repeats)
    shares, loads = [[] for _ in range(workers)], [0] * workers
    for i in sorted(range(len(ops)), key=lambda i: -weights[i]):
        least = loads.index(min(loads))
        shares[least].append(i)
        loads[least] += weights[i]

    def share(indices: list[int]) -> list:
        return _walk_share(walk, root, [ops[i] for i in indices], scopes, trees,
                           [repeats[i] for i in indices])

    out = [None] * len(ops)
    with contextlib.ExitStack() as stack:
        forked = [stack.enter_context(_forking.Forked(functools.partial(share, indices)))
                  for indices in shares[1:]]
        done = [share(shares[0])] + [f.result(fallback=functools.partial(share, indices))
                                     for f, indices in zip(forked, shares[1:])]
    for indices, walked in zip(shares, done):
        for i, chains in zip(indices, walked):
            out[i] = chains
    return out


def _walk_share(walk: _Walk, root: LevelModel, ops: list[ProblemOp], scopes, trees,
                repeats: list[int]) -> list:
    """The chains of `ops`, each standing for `repeats` ops; raises JointTooLarge as soon
    as these alone are past the walk's limit."""
    out, made = [], 0
    for op, repeat in zip(ops, repeats):
        scope = scopes[op.name]
        out.append(walk.chains(root, op, scope, [trees[g] for g in scope]))
        made += repeat * len(out[-1])
        if made > walk.limit:
            raise JointTooLarge.of(f"more than {walk.limit}", walk.ways, node=op.name,
                                   op_type=op.sem.op_type)
    return out


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                  # no affinity on this platform
        return os.cpu_count() or 1


def optimum(build: Callable[..., JointModel], ilp_seconds: float = 0.0
            ) -> tuple[JointModel, JointSolution]:
    """The joint model `build(method=...)` makes and its optimum: by the DP, or where the DP's
    tables would be too large (JointTooWide) by HiGHS, if `ilp_seconds` > 0 and the ILP
    has at most ILP_VARIABLES columns; an ILP answer counts only where HiGHS proves it
    optimal within ILP_NODES nodes (and `ilp_seconds`, a bound for safety). Raises
    JointTooLarge, or PlanInfeasibleError where HiGHS is not given or does not prove it."""
    try:
        model = build(method=JointMethod.DP)
    except JointTooWide:             # told before the walk: build the ILP's model
        if ilp_seconds <= 0:
            raise
        model = build(method=JointMethod.ILP, max_ilp_columns=ILP_VARIABLES)
    else:
        try:
            return model, model.solve()
        except JointTooWide:         # the elimination went past its bound: same model
            if ilp_seconds <= 0:
                raise
    return model, model.solve(JointMethod.ILP, ilp_seconds, max_variables=ILP_VARIABLES,
                              node_limit=ILP_NODES)
