"""Semantics and strategies for every op of a planner Graph.

`catalog(graph)` describes each op (registry), derives its strategies (analysis) and
records its status: described, opaque (kept whole, with the reason) or missing (no
description at all). Search and coverage both read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tofu_tf.errors import UnsupportedOpError
from tofu_tf.graph import Graph, Op
from tofu_tf.op_semantics.analysis import Strategy, analyze
from tofu_tf.op_semantics.registry import Semantics, describe_op, registered

DESCRIBED, OPAQUE, MISSING = "described", "opaque", "missing"


@dataclass(frozen=True)
class OpEntry:
    """One op's description status and derived strategies."""
    op: Op
    status: str
    semantics: Semantics | None = None
    strategies: tuple[Strategy, ...] = ()
    reason: str | None = None


def catalog_op(graph: Graph, op: Op) -> OpEntry:
    if op.type not in registered():
        return OpEntry(op, MISSING, reason="no description")
    sem = describe_op(graph, op)
    if sem.is_opaque:
        return OpEntry(op, OPAQUE, sem, (), sem.opaque_reason)
    return OpEntry(op, DESCRIBED, sem, analyze(sem))


def catalog(graph: Graph, *, strict: bool = False) -> dict[str, OpEntry]:
    """Entries for every op, in topological order; `strict` raises on a missing type."""
    entries = {}
    for op in graph:
        entry = catalog_op(graph, op)
        if strict and entry.status == MISSING:
            raise UnsupportedOpError(
                "has no semantics description.", node=op.name, op_type=op.type,
                fix=f"describe it with @semantics('{op.type}') in tofu_tf/op_semantics/ops/, "
                    "or declare it opaque with a reason.")
        entries[op.name] = entry
    return entries
