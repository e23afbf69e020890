"""The joint problem of all levels (`joint_model`; `exact.joint_optimum` its optimum, and
`Options.joint_choices` where the search solves it): the recursion fixes level 1 before it
solves level 2; the joint problem minimises total = c_1 + k_1 c_2 + k_1 k_2 c_3 + ...
(c_l: level l's bytes, its choices' work and its transfers' price, search/level.py)
over all levels' states and choices at once. It is a product-domain problem of the same
form. A group's joint state is a path (X_1, X_2, ...) through its state tree: X_1 a
level-1 state, X_2 a state of the level-2 tensor shape that X_1 leaves, and so on. An op's
joint choice is ((c_1, K_1), (c_2, K_2), ..., c_L), with K_l the level-l states of the
op's groups (the groups of all its tensors: a deeper local op kept whole may read one,
such as a shape input, that level 1 does not). The level-(l+1) op is part 0's local op
under c_l and its tensors take the part shapes under K_l (exactly `problem.sub_problem`,
restricted to one op), so its choices and vectors depend on (c_1, K_1, ..., c_l, K_l)
only. The joint vector of group g is sum_l k_1...k_{l-1} v_l[X_l] on the paths through
K_1[g], ..., K_{L-1}[g] and +inf elsewhere. `dp.solve` minimises it through the op tables
(min over joint choices), the ILP (search/ilp.py) through the choices; both are exact and
must agree. `JointModel.plan_cost` prices a recursive plan in it: equal to its objective.
`exact.recursion_under` reruns the recursion with level 1 fixed to the joint optimum's
(`JointModel.first_level`): where it meets the joint optimum, the recursion's gap is
all in level 1, chosen by its own cost without the levels below.

Limits: the joint problem enumerates, per op, every level-l choice under every state
combination of the op's groups at every level before the last. That suits tiny graphs at
2x2 devices (the tiny reference models take seconds) and the smallest at 2x2x2; past
`max_joint_choices` (summed over ops) it raises rather than run for hours.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from tofu_tf.errors import PlanInfeasibleError, TofuError
from tofu_tf.graph import Graph
from tofu_tf.op_semantics.analysis import OutputState
from tofu_tf.op_semantics.catalog import OpEntry, catalog
from tofu_tf.options import Options, VariableStorage
from tofu_tf.search import dp
from tofu_tf.search.coarsen import CoarseGraph, coarsen
from tofu_tf.search.ilp import DEFAULT_TIME_LIMIT, ilp_minimum, merged_vectors
from tofu_tf.search.level import LevelModel, choice_work, level_models
from tofu_tf.search.problem import (Choice, Problem, ProblemOp, SearchCache, TensorSpec,
                                    clamp_box, cost_vectors, fetch_extra, make_choice,
                                    may_replicate, sub_problem)
from tofu_tf.search.topology import Topology

MAX_JOINT_CHOICES = 1_000_000        # joint choices summed over ops, before giving up
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


@dataclass
class _Context:
    """One op at one level under fixed outer choices and states: its choices and their
    vectors, summed per group."""
    problem: Problem                           # the op alone, with its tensors
    vectors: list[dict[int, np.ndarray]]       # per choice: group -> bytes per state
    work: np.ndarray                           # per choice: its work (level.choice_work)

    @property
    def op(self) -> ProblemOp:
        return self.problem.ops[0]

    def label(self, choice: int) -> str:
        return self.problem.choices[self.op.name][choice].label


@dataclass
class _Walk:
    """Builds and caches the contexts of deeper levels: `sub_problem`, `build_choices` and
    `cost_vectors` for one op. Shapes enter a choice only through `clamp_box`, and clamping
    to unbounded shapes and then (offset 0) to the real ones is clamping to the real ones;
    a choice's vector for a tensor depends only on its boxes and the tensor. So each local
    op is localized once, and each (choice, tensor, shape) costed once."""
    base: Problem
    coarse: CoarseGraph
    ways: tuple[int, ...]
    limit: int                                         # most joint choices in all
    flop_bytes: float                                  # the price of repeated work
    transfer_bytes: float              # the price of one transfer between two devices
    local_ops: dict = field(default_factory=dict)      # (id(op), choice) -> (op, local op)
    contexts: dict = field(default_factory=dict)       # (id(local op), shapes) -> _Context
    templates: dict = field(default_factory=dict)      # id(local op) -> (op, choices, whole)
    vectors: dict = field(default_factory=dict)   # (id(choice), slot, shape) -> (bytes, transfers)
    choices: int = 0                                   # joint choices made so far

    def count(self, more: int, context: _Context) -> None:
        self.choices += more
        if self.choices > self.limit:
            raise JointTooLarge.of(f"more than {self.limit}", self.ways, node=context.op.name,
                                   op_type=context.op.sem.op_type)

    def root(self, model: LevelModel, op: ProblemOp) -> _Context:
        tensors = {t: model.problem.tensors[t] for t in op.inputs + op.outputs}
        problem = Problem(model.problem.k, [op], tensors, self.base.replicable,
                          self.base.replicate_below, {op.name: model.problem.choices[op.name]},
                          views=self.base.views)
        return _Context(problem, [merged_vectors(self.coarse.group_of, entries)
                                  for entries in model.priced(op.name)], model.work(op.name))

    def next(self, context: _Context, choice: int, states: dict[str, OutputState],
             level: int) -> _Context:
        """The context one level down, after `choice` with the tensors in `states`."""
        k_next = self.ways[level + 1]
        key = (id(context.op), choice)
        if key not in self.local_ops:
            local = sub_problem(context.problem, {}, {context.op.name: context.label(choice)},
                                k_next).ops[0]
            self.local_ops[key] = (context.op, local)
        local = self.local_ops[key][1]
        tensors = _part_tensors(context.problem, states, k_next)
        shapes = tuple(sorted((t, spec.shape) for t, spec in tensors.items()))
        if (id(local), shapes) not in self.contexts:
            price = self.transfer_bytes * math.prod(self.ways[level + 2:])
            self.contexts[id(local), shapes] = self._context(local, tensors, k_next, price)
        return self.contexts[id(local), shapes]

    def _context(self, op: ProblemOp, tensors: dict[str, TensorSpec], k: int,
                 price: float) -> _Context:
        """The op's choices at a deeper level, each transfer costing `price` (the level's
        price, level.level_models)."""
        problem = Problem(k, [op], tensors, self.base.replicable, self.base.replicate_below,
                          views=self.base.views)
        chosen = self._templates(problem, op)
        keys = [[(id(choice), slot, tensors[tensor].shape) for slot, tensor in
                 _slots(choice, op)] for choice in chosen]
        if any(key not in self.vectors for row in keys for key in row):
            problem.choices[op.name] = [clamp_boxed(choice, op, problem) for choice in chosen]
            vectors = cost_vectors(problem)
            for row, entries, counts in zip(keys, vectors[op.name],
                                            vectors.transfers(op.name)):
                self.vectors.update(zip(row, ((v, n) for (_, v), (_, n)
                                              in zip(entries, counts))))
        problem.choices[op.name] = chosen           # labels and strategies only, below
        vectors = [merged_vectors(self.coarse.group_of, [
            (tensor, self.vectors[key][0] + price * self.vectors[key][1])
            for (_, tensor), key in zip(_slots(c, op), row)]) for c, row in zip(chosen, keys)]
        return _Context(problem, vectors, choice_work(k, op, chosen, self.flop_bytes))

    def _templates(self, problem: Problem, op: ProblemOp) -> list[Choice]:
        """`build_choices` for the op, on unbounded shapes (clamped by the caller)."""
        if id(op) not in self.templates:
            unbounded = Problem(problem.k, [op], {
                t: TensorSpec(t, (UNBOUNDED,) * len(spec.shape), spec.dtype)
                for t, spec in problem.tensors.items()})
            strategies = [make_choice(unbounded, op, s) for s in op.strategies
                          if s.valid_for(problem.k)]
            self.templates[id(op)] = (op, strategies, make_choice(unbounded, op, None))
        _, strategies, whole = self.templates[id(op)]
        return strategies + ([whole] if may_replicate(problem, op, bool(strategies)) else [])


def _slots(choice: Choice, op: ProblemOp) -> list[tuple[int, str]]:
    """(slot, tensor) of each entry `cost_vectors` makes for a choice, in its order."""
    count = len(op.inputs)
    return ([(i, op.inputs[i]) for i, boxes in enumerate(choice.input_boxes)
             if boxes is not None] +
            [(count + o, tensor) for o, tensor in enumerate(op.outputs)])


def clamp_boxed(choice: Choice, op: ProblemOp, problem: Problem) -> Choice:
    """A choice built on unbounded shapes, clamped to the tensors' real shapes."""
    def clamp(boxes, shape):
        return None if boxes is None else tuple(clamp_box(box, shape, (0,) * len(shape))
                                                for box in boxes)

    def extra(i: int, boxes) -> int:
        window = op.windows[i] if i < len(op.windows) else None
        return 0 if boxes is None else fetch_extra(boxes, window,
                                                   problem.tensors[op.inputs[i]].shape)
    return dataclasses.replace(
        choice, input_boxes=tuple(clamp(b, problem.tensors[t].shape)
                                  for b, t in zip(choice.input_boxes, op.inputs)),
        input_extra=tuple(extra(i, b) for i, b in enumerate(choice.input_boxes)),
        output_boxes=tuple(clamp(b, problem.tensors[t].shape)
                           for b, t in zip(choice.output_boxes, op.outputs)))


def _joint_choices(walk: "_Walk", context: _Context, scope: tuple[int, ...],
                   trees: list[StateTree], level: int) -> list[tuple[tuple, list[np.ndarray]]]:
    """Every joint choice of the op from `level` down: (key, vector per scope group over
    the leaves of its tree), key = (label_l, K_l, ..., label_L)."""
    scale = math.prod(walk.ways[:level])
    out = []
    for choice, merged in enumerate(context.vectors):
        here = [scale * merged.get(g, np.zeros(len(tree.states)))
                for g, tree in zip(scope, trees)]
        if here and context.work[choice]:          # the choice's work, on its first group
            here[0] = here[0] + scale * context.work[choice]
        if level == len(walk.ways) - 1:
            walk.count(1, context)
            out.append(((context.label(choice),), here))
            continue
        for states in itertools.product(*(range(len(tree.states)) for tree in trees)):
            child = walk.next(context, choice, _tensor_states(walk, context, scope, trees,
                                                              states), level)
            below = _joint_choices(walk, child, scope,
                                   [tree.children[s] for tree, s in zip(trees, states)],
                                   level + 1)
            for key, vectors in below:
                out.append(((context.label(choice), states) + key,
                            _lift(trees, states, here, vectors)))
    return out


def _tensor_states(walk: "_Walk", context: _Context, scope, trees, states
                   ) -> dict[str, OutputState]:
    """The stored state of each of the op's tensors in a scope group."""
    position = {g: i for i, g in enumerate(scope)}
    out = {}
    for tensor in context.problem.tensors:
        i = position.get(walk.coarse.group_of[tensor])
        if i is not None:
            out[tensor] = trees[i].states[states[i]]
    return out


def _lift(trees, states, here, below) -> list[np.ndarray]:
    """Vectors over a tree's leaves: this level's cost plus the deeper one below the
    chosen state, +inf on every other leaf."""
    out = []
    for tree, s, cost, deeper in zip(trees, states, here, below):
        vector = np.full(tree.size, np.inf)
        vector[tree.offsets[s]:tree.offsets[s + 1]] = cost[s] + deeper
        out.append(vector)
    return out


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
                 {op: self.keys[op][c][2 * level] for op, c in chosen.items()})
                for level in range(count)]

    def plan_cost(self, result: SearchResult) -> float:
        """The joint objective of a recursive plan's own states and choices; equals its
        objective when the joint pieces match sub_problem."""
        leaves, total = self.plan_leaves(result), 0.0
        for op, choices in self.model.vectors.items():
            scope = self.model.op_scope(op)
            if not scope:
                continue
            key = _plan_key(result, op, scope)
            entries = choices[self.keys[op].index(key)]
            total += sum(float(v[leaves[self.model.coarse.group_of[t]]]) for t, v in entries)
        return total

    def solve(self, method: JointMethod = JointMethod.DP,
              time_limit: float = DEFAULT_TIME_LIMIT) -> JointSolution:
        start = time.perf_counter()
        found = {}
        if method in (JointMethod.DP, JointMethod.BOTH):
            found[JointMethod.DP] = self._dp()
        if method in (JointMethod.ILP, JointMethod.BOTH):
            found[JointMethod.ILP] = self._ilp(time_limit)
        costs = [self.model.evaluate(leaves)[0] for leaves in found.values()]
        if not math.isclose(min(costs), max(costs), rel_tol=1e-9):
            raise TofuError(f"the joint DP and ILP disagree: {dict(zip(found, costs))}.",
                            fix="report this: both are exact on the same problem.")
        return JointSolution(costs[0], next(iter(found.values())), method,
                             time.perf_counter() - start)

    def _dp(self) -> tuple[int, ...]:
        order = sorted(range(len(self.trees)), key=lambda g: self.model.coarse.position[g])
        solution = dp.solve(self.model.domains, self.model.factors()[0], order=order)
        if not solution.exact:
            raise TofuError(
                f"the joint DP needed a table larger than {dp.MAX_TABLE} entries "
                f"(largest {solution.max_table}); its answer would not be exact.",
                fix="use JointMethod.ILP for this graph.")
        return solution.assignment

    def _ilp(self, time_limit: float) -> tuple[int, ...]:
        solution = ilp_minimum(self.model, time_limit)
        if not solution.optimal:
            raise PlanInfeasibleError(
                f"HiGHS did not prove the joint ILP optimal within {time_limit:g} s "
                f"({solution.variables} variables, {solution.constraints} constraints).",
                fix="raise time_limit, or use JointMethod.DP.")
        return solution.assignment


def _plan_key(result: SearchResult, op: str, scope: tuple[int, ...]) -> tuple:
    key: tuple = ()
    for level in result.levels[:-1]:
        key += (level.choices[op], tuple(level.assignment[g] for g in scope))
    return key + (result.levels[-1].choices[op],)


class JointTooLarge(TofuError):
    """The joint problem has more joint choices than its limit."""

    @classmethod
    def of(cls, count: str, ways: tuple[int, ...], **where) -> "JointTooLarge":
        return cls(f"the joint problem has {count} joint choices (op choices under every "
                   f"state combination of their groups at {len(ways)} levels "
                   f"{'x'.join(map(str, ways))}); it is meant for tiny graphs.",
                   fix="use fewer devices or a smaller model, or raise max_joint_choices.",
                   **where)


def joint_model(graph: Graph, topology: Topology, *,
                entries: dict[str, OpEntry] | None = None,
                max_joint_choices: int = MAX_JOINT_CHOICES,
                coarse: CoarseGraph | None = None, options: Options = Options(),
                storage: VariableStorage = VariableStorage.REPLICABLE,
                cache: SearchCache | None = None) -> JointModel:
    """Build the joint problem of every level of `topology` (see the module docstring)
    over the plans the recursion searches under `options` and variable `storage`.
    Raises JointTooLarge past `max_joint_choices`."""
    entries = entries if entries is not None else catalog(graph, strict=True)
    coarse = coarse if coarse is not None else coarsen(graph, entries)
    root = next(level_models(graph, topology, entries, coarse, options, storage, cache))
    base, ways, coarse = root.problem, topology.ways, root.coarse      # with the views
    scopes = {op.name: tuple(sorted({coarse.group_of[t] for t in op.inputs + op.outputs}))
              for op in base.ops}
    if len(ways) > 1:       # each level-1 choice under each state of its groups: >= 1 each
        least = sum(len(root.vectors[op]) * math.prod(root.domains[g] for g in scope)
                    for op, scope in scopes.items())
        if least > max_joint_choices:
            raise JointTooLarge.of(f"at least {least}, more than {max_joint_choices},", ways)
    trees = tuple(state_tree(base.tensors[members[0]], base, ways)
                  for members in coarse.members)
    walk = _Walk(base, coarse, ways, max_joint_choices, root.flop_bytes,
                 root.transfer_bytes / math.prod(ways[1:]))
    vectors, keys = {}, {}
    for op in base.ops:
        scope = scopes[op.name]
        choices = _joint_choices(walk, walk.root(root, op), scope,
                                 [trees[g] for g in scope], 0)
        keys[op.name] = [key for key, _ in choices]
        vectors[op.name] = [[(coarse.members[g][0], v) for g, v in zip(scope, joint)]
                            for _, joint in choices]
    model = LevelModel(None, coarse, vectors, [tree.size for tree in trees])
    return JointModel(model, trees, keys, ways)
