"""Recomputation: forward ops run again in the backward pass instead of keeping their
results. No TensorFlow.

`recompute(graph, ops)` is the same training step in which the backward and update ops
that read a result of one of `ops` read a copy of it instead: the op run again (its
`Op.copy_of` names the original) from the tensors that are kept, just before its first
reader in the graph's order. The originals' results then die with their last forward
reader. A copy whose inputs are all kept tensors waits (a control edge) for the backward
op just before it, so that TensorFlow's executor, which runs whatever is ready, does not
run it early and keep its result as long as the original's. Everything downstream (the
search, the memory estimate, the simulator, the emitter) sees the copies as ordinary ops;
the step computes the same numbers, since every kernel here is deterministic on its
inputs. Random ops that draw from a state are never recomputed (a second draw differs).

Which ops (`candidates`):
- `Recompute.CHEAP`: every forward op that does no reduction and no contraction (element-
  wise ops, normalisations' arithmetic, reshapes): their results are recomputed from the
  nearest kept tensors (matrix products', convolutions' and reductions' results, the
  variables, the batch). Costs a fraction of a forward pass; drops most activations.
- `Recompute.SEGMENTS`: the forward chain of contractions cut into about sqrt(n)
  segments (Chen et al., 2016); only each segment's last contraction result is kept, all
  else recomputed: about one extra forward pass, activations O(sqrt(n)).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Collection

from tofu_tf.graph import Graph, Op, Role, split_tensor_name
from tofu_tf.op_semantics.tdl import Reduce
from tofu_tf.options import Recompute

SUFFIX = "/tofu_recompute"
READERS = (Role.BACKWARD, Role.UPDATE)


def draws_state(op_type: str) -> bool:
    """A random op drawing from a hidden state: a second run gives other numbers."""
    return (not op_type.startswith("Stateless") and
            any(word in op_type for word in ("Random", "TruncatedNormal", "Multinomial")))


def recomputable(op: Op) -> bool:
    return (op.role is Role.FORWARD and not draws_state(op.type) and not op.control_inputs
            and op.type not in ("ReadVariableOp", "Placeholder", "Const", "NoOp"))


def forward_end(graph: Graph) -> int:
    """The index in the graph's order of its first backward op (the forward pass's end)."""
    return next((i for i, op in enumerate(graph) if op.role is Role.BACKWARD), len(graph))


def recompute(graph: Graph, ops: Collection[str]) -> Graph:
    """`graph` with the backward readers of `ops`' results reading recomputed copies."""
    chosen = {name for name in ops if recomputable(graph.op(name))}
    if not chosen:
        return graph
    copies: dict[str, Op] = {}
    renamed: dict[str, str] = {}                           # original tensor -> copy's
    tensors = dict(graph.tensors)
    order: list[Op] = []

    def copy(name: str, trigger: str | None) -> None:
        if name in copies:
            return
        op = graph.op(name)
        for t in op.inputs:
            if split_tensor_name(t)[0] in chosen:
                copy(split_tensor_name(t)[0], trigger)
        reads_copies = any(t in renamed for t in op.inputs)
        new = dataclasses.replace(
            op, name=name + SUFFIX, inputs=tuple(renamed.get(t, t) for t in op.inputs),
            outputs=tuple(f"{name}{SUFFIX}:{split_tensor_name(t)[1]}" for t in op.outputs),
            control_inputs=(trigger,) if trigger and not reads_copies else (),
            copy_of=name)
        for old, t in zip(op.outputs, new.outputs):
            renamed[old] = t
            tensors[t] = dataclasses.replace(graph.tensor(old), name=t)
        copies[name] = new
        order.append(new)

    trigger: str | None = None                  # the last backward or update op so far
    first = forward_end(graph)
    for i, op in enumerate(graph):
        if i >= first and op.role in READERS:
            for t in op.inputs:
                if split_tensor_name(t)[0] in chosen:
                    copy(split_tensor_name(t)[0], trigger)
            op = dataclasses.replace(op, inputs=tuple(renamed.get(t, t) for t in op.inputs))
            trigger = op.name
        order.append(op)
    # (constant values belong to Const outputs, which are never copied)
    return Graph(order, tensors.values(), fetches=graph.fetches,
                 variables=graph.variables.values(), constants=graph.constants)


def _contractions(graph: Graph, entries) -> list[str]:
    """Forward ops that reduce or contract (their semantics hold a reduction), in order."""
    out = []
    for op in graph:
        sem = entries[op.name].semantics if op.name in entries else None
        if op.role is Role.FORWARD and sem is not None and any(
                c is not None and _has_reduce(c.body) for c in sem.computes):
            out.append(op.name)
    return out


def _has_reduce(expr) -> bool:
    return isinstance(expr, Reduce) or any(_has_reduce(a) for a in getattr(expr, "args", ()))


def candidates(graph: Graph, entries, policy: Recompute) -> frozenset[str]:
    """The forward ops `policy` recomputes (NONE and AUTO: none)."""
    if policy in (Recompute.NONE, Recompute.AUTO):
        return frozenset()
    chain = _contractions(graph, entries)
    kept = set(chain)
    if policy is Recompute.SEGMENTS:
        every = max(1, round(math.sqrt(len(chain))))
        kept = {name for i, name in enumerate(chain) if i % every == every - 1}
    # The forward pass: what runs before the first backward op (forward-role ops after it,
    # such as a gradient's own arithmetic on forward values, are produced late anyway; the
    # updates inside it, such as batch norm's moving averages, read their values at once).
    ops = graph.ops
    first = forward_end(graph)
    forward = {op.name for op in ops[:first]}
    read_later = {split_tensor_name(t)[0] for op in ops[first:] if op.role in READERS
                  for t in op.inputs}
    needed: set[str] = set()
    stack = [name for name in read_later & forward if name not in kept]
    while stack:                        # every forward op a recomputed one reads, up to kept
        name = stack.pop()
        if name in needed or name in kept or name not in forward or \
                not recomputable(graph.op(name)):
            continue
        needed.add(name)
        stack += [split_tensor_name(t)[0] for t in graph.op(name).inputs]
    return frozenset(needed)
