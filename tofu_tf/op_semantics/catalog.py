"""Semantics and strategies for every op of a planner Graph.

`catalog(graph)` describes each op (registry), derives its strategies (analysis) and
records its status: described, opaque (kept whole, with the reason) or missing (no
description at all). Search and coverage both read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tofu_tf.errors import UnsupportedOpError
from tofu_tf.graph import Graph, Op
from tofu_tf.op_semantics.analysis import Strategy
from tofu_tf.op_semantics.memo import SemanticsMemo
from tofu_tf.op_semantics.registry import Semantics, registered

DESCRIBED, OPAQUE, MISSING = "described", "opaque", "missing"


@dataclass(frozen=True)
class OpEntry:
    """One op's description status and derived strategies."""
    op: Op
    status: str
    semantics: Semantics | None = None
    strategies: tuple[Strategy, ...] = ()
    reason: str | None = None
    signature: int | None = None        # equal ids: equal semantics up to the name


def catalog_op(graph: Graph, op: Op, memo: SemanticsMemo | None = None) -> OpEntry:
    if op.type not in registered():
        return OpEntry(op, MISSING, reason="no description")
    ins, outs = graph.input_tensors(op), graph.output_tensors(op)
    constants = {i: graph.constants[t] for i, t in enumerate(op.inputs)
                 if t in graph.constants}
    sem, strategies, key = (memo or SemanticsMemo()).get(
        op.name, op.type, op.attrs, [t.shape for t in ins], [t.dtype for t in ins],
        [t.shape for t in outs], [t.dtype for t in outs], constants)
    if sem.is_opaque:
        return OpEntry(op, OPAQUE, sem, (), sem.opaque_reason, key)
    return OpEntry(op, DESCRIBED, sem, strategies, None, key)


def catalog(graph: Graph, *, strict: bool = False,
            memo: SemanticsMemo | None = None) -> dict[str, OpEntry]:
    """Entries for every op, in topological order; `strict` raises on a missing type."""
    memo = memo or SemanticsMemo()
    entries = {}
    for op in graph:
        entry = catalog_op(graph, op, memo)
        if strict and entry.status == MISSING:
            raise UnsupportedOpError(
                "has no semantics description.", node=op.name, op_type=op.type,
                fix=f"describe it with @semantics('{op.type}') in tofu_tf/op_semantics/ops/, "
                    "or declare it opaque with a reason.")
        entries[op.name] = entry
    return entries
