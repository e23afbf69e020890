"""Coarsening: tie tensors that should share a stored state, so the search sees a
near-linear chain of groups instead of tens of thousands of independent tensors.

Rules, applied in order with a union-find (only tensors of equal shape are tied):
1. gradient:     a gradient op's output with the shape of exactly one input of its forward
                 op is that input's gradient; its gradient input with the shape of exactly
                 one forward output is that output's gradient. Tensor and gradient tie.
2. gradient sum: an AddN/AddV2 of the backward pass whose inputs and output share a shape
                 (the gradient-summing add) joins them.
3. variable:     a variable's handle, its optimizer slots, and (through rule 4) its reads
                 and update math.
4. element-wise: an op whose every strategy cuts its same-shape inputs exactly like its
                 output (add, relu, the optimizer's update math, variable reads and writes)
                 ties its output to those inputs.
5. time steps:   ops of one type and signature that read the same weight group (the steps
                 of an unrolled RNN) tie their outputs.
6. siblings:     three or more same-shape outputs of one op (Unpack of the steps, Split of
                 the gates), or three or more same-shape inputs of one op (Pack of the
                 steps' gradients, a ConcatV2 of equal pieces), tie.
Every op stays in the problem; coarsening only decides which tensors move together.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Hashable, Mapping

from tofu_tf.graph import Graph, Op, Role
from tofu_tf.op_semantics.analysis import Strategy
from tofu_tf.op_semantics.catalog import DESCRIBED, OpEntry

GRADIENT_SUMS = ("AddN", "AddV2", "Add")
SIBLINGS = 3            # same-shape outputs (or inputs) of one op that tie (rule 6)
TIED_VIEWS = 4          # views of one key that form one group (with_views)


class _UnionFind:
    def __init__(self, items):
        self.parent = {x: x for x in items}

    def find(self, x):
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a, b) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        self.parent[rb] = ra
        return True


@dataclass(frozen=True)
class CoarseGraph:
    """Tensor groups: the variables of the search."""
    group_of: Mapping[str, int]               # tensor name -> group index
    members: tuple[tuple[str, ...], ...]      # group index -> tensor names
    position: tuple[float, ...]               # group index -> place in the linear chain
    ties: Mapping[str, int]                   # rule -> number of ties it made

    @property
    def num_groups(self) -> int:
        return len(self.members)


def _is_aligned(strategy: Strategy, index: int, shape, out_shape) -> bool:
    region = strategy.inputs[index]
    if region.kind != "data" or tuple(shape) != tuple(out_shape):
        return False
    dim = strategy.outputs[0].dim
    for d, interval in enumerate(region.dims):
        label = region.dim_label(d, shape[d])
        if label != ("S" if d == dim else "*"):
            return False
    return True


def elementwise_inputs(entry: OpEntry) -> list[int]:
    """Inputs an element-wise op cuts exactly like its output (empty if not element-wise)."""
    sem = entry.semantics
    if entry.status != DESCRIBED or not entry.strategies or len(sem.output_shapes) != 1:
        return []
    out_shape = sem.output_shapes[0]
    if any(s.kind != "output" or s.outputs[0].kind != "split" for s in entry.strategies):
        return []
    split_dims = {s.outputs[0].dim for s in entry.strategies}
    if split_dims != {d for d, n in enumerate(out_shape) if n >= 2}:
        return []
    return [i for i, shape in enumerate(sem.input_shapes)
            if all(_is_aligned(s, i, shape, out_shape) for s in entry.strategies)]


def _output_tensors(op: Op, entry: OpEntry) -> list[str]:
    """Real outputs, then the variables the op writes in place."""
    outs = list(op.outputs)
    if entry.semantics is not None:
        outs += [op.inputs[c.alias] for c in entry.semantics.updates]
    return outs


class _Coarsener:
    def __init__(self, graph: Graph, entries: Mapping[str, OpEntry]):
        self.graph, self.entries = graph, entries
        self.uf = _UnionFind(graph.tensors)
        self.ties: Counter = Counter()

    def tie(self, a: str, b: str, rule: str) -> None:
        if self.graph.tensor(a).shape == self.graph.tensor(b).shape and self.uf.union(a, b):
            self.ties[rule] += 1

    def gradients(self) -> None:
        for op in self.graph:
            if op.role is not Role.BACKWARD or op.forward_op is None:
                continue
            fwd = self.graph.op(op.forward_op)
            self._tie_unique(op.outputs, fwd.inputs, "gradient")
            grads_in = [t for t in op.inputs
                        if self.graph.producer(t).role is Role.BACKWARD]
            self._tie_unique(grads_in, fwd.outputs, "gradient")

    def _tie_unique(self, tensors, candidates, rule: str) -> None:
        for t in tensors:
            shape = self.graph.tensor(t).shape
            same = [c for c in candidates if self.graph.tensor(c).shape == shape]
            if len(same) == 1 and len(shape) > 0:
                self.tie(t, same[0], rule)

    def gradient_sums(self) -> None:
        for op in self.graph:
            if op.role is Role.BACKWARD and op.type in GRADIENT_SUMS and op.outputs:
                for t in op.inputs:
                    self.tie(op.outputs[0], t, "gradient sum")

    def variables(self) -> None:
        for v in self.graph.variables.values():
            if v.slot_of is not None and v.slot_of in self.graph.variables:
                self.tie(v.handle, self.graph.variables[v.slot_of].handle, "variable")

    def elementwise(self) -> None:
        by_signature: dict[int, list[int]] = {}    # equal signatures: equal semantics
        for op in self.graph:
            entry = self.entries[op.name]
            if entry.signature is None:
                inputs = elementwise_inputs(entry)
            else:
                inputs = by_signature.get(entry.signature)
                if inputs is None:
                    inputs = by_signature[entry.signature] = elementwise_inputs(entry)
            for out in _output_tensors(op, entry)[:1]:
                for i in inputs:
                    self.tie(out, op.inputs[i], "element-wise")

    def time_steps(self) -> None:
        weights = {self.uf.find(v.handle) for v in self.graph.variables.values()}
        steps: dict[tuple, list[Op]] = defaultdict(list)
        for op in self.graph:
            if op.role is not Role.FORWARD or not op.outputs:
                continue
            shared = [self.uf.find(t) for t in op.inputs if self.uf.find(t) in weights]
            if shared:
                signature = (op.type, tuple(self.graph.tensor(t).shape for t in op.inputs),
                             tuple(shared))
                steps[signature].append(op)
        for ops in steps.values():
            for other in ops[1:]:
                for a, b in zip(ops[0].outputs, other.outputs):
                    self.tie(a, b, "time steps")

    def siblings(self) -> None:
        for op in self.graph:
            for tensors in (op.outputs, op.inputs):
                by_shape: dict[tuple, list[str]] = defaultdict(list)
                for t in tensors:
                    if self.graph.tensor(t).rank > 0:
                        by_shape[self.graph.tensor(t).shape].append(t)
                for same in by_shape.values():
                    if len(same) >= SIBLINGS:
                        for t in same[1:]:
                            self.tie(same[0], t, "siblings")

    def result(self) -> CoarseGraph:
        order = {op.name: i for i, op in enumerate(self.graph)}
        position_of_op = {op.name: order[op.forward_op] + 0.5 if op.forward_op else order[op.name]
                          for op in self.graph}
        groups: dict[str, list[str]] = defaultdict(list)
        for t in self.graph.tensors:
            groups[self.uf.find(t)].append(t)
        members = sorted((tuple(sorted(m)) for m in groups.values()),
                         key=lambda m: min(position_of_op[self.graph.producer(t).name]
                                           for t in m))
        group_of = {t: g for g, m in enumerate(members) for t in m}
        position = tuple(min(position_of_op[self.graph.producer(t).name] for t in m)
                         for m in members)
        return CoarseGraph(group_of, tuple(members), position, dict(self.ties))


def coarsen(graph: Graph, entries: Mapping[str, OpEntry]) -> CoarseGraph:
    """Group the graph's tensors by the rules in the module docstring."""
    c = _Coarsener(graph, entries)
    c.gradients()
    c.gradient_sums()
    c.variables()
    c.elementwise()
    c.time_steps()
    c.siblings()
    return c.result()


def with_views(coarse: CoarseGraph, views: Mapping[str, tuple[str, Hashable]]
               ) -> CoarseGraph:
    """`coarse` with the views (view tensor -> (the tensor it stands for, its key),
    problem.with_views) as groups placed in the chain beside their tensors': `TIED_VIEWS`
    or more views of one key (a coarse group's tensors read alike: an RNN's steps) form
    one group, as their tensors share one (apart, they would widen the DP's tables past
    its bound); any other two views are apart, each free to gather or not."""
    if not views:
        return coarse
    group_of, members = dict(coarse.group_of), list(coarse.members)
    position = list(coarse.position)
    tied = defaultdict(list)
    for view, (tensor, key) in sorted(views.items()):
        tied[key].append((view, tensor))
    for key in sorted(tied, key=lambda k: min(v for v, _ in tied[k])):
        views_of_key = tied[key]
        for together in ([views_of_key] if len(views_of_key) >= TIED_VIEWS
                         else [[pair] for pair in views_of_key]):
            for view, _ in together:
                group_of[view] = len(members)
            members.append(tuple(view for view, _ in together))
            position.append(coarse.position[coarse.group_of[together[0][1]]])
    return CoarseGraph(group_of, tuple(members), tuple(position), coarse.ties)
