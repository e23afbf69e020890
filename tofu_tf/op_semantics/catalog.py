"""Semantics and strategies for every op of a planner Graph.

`catalog(graph)` describes each op (registry), derives its strategies (analysis) and
records its status: described, opaque (kept whole, with the reason) or missing (no
description at all). Search and coverage both read it. A missing type is kept whole too
(an opaque description: every device runs it on whole inputs), unless `strict`; an op of a
missing type that takes a resource (a variable, which may be stored in shards) cannot be
kept whole and always raises.
"""

from __future__ import annotations

from dataclasses import dataclass

from tofu_tf.errors import UnsupportedOpError
from tofu_tf.graph import Graph, Op
from tofu_tf.op_semantics.analysis import Strategy
from tofu_tf.op_semantics.memo import SemanticsMemo
from tofu_tf.op_semantics.registry import Semantics, description, opaque_semantics

DESCRIBED, OPAQUE, MISSING = "described", "opaque", "missing"
NO_DESCRIPTION = "no description (kept whole)"


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
    ins, outs = graph.input_tensors(op), graph.output_tensors(op)
    if description(op.type) is None:
        whole = opaque_semantics(op.name, op.type, op.attrs, [t.shape for t in ins],
                                 [t.shape for t in outs], reason=NO_DESCRIPTION)
        return OpEntry(op, MISSING, whole, reason=NO_DESCRIPTION)
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
        if entry.status == MISSING:
            on_resource = any(graph.tensors[t].is_resource for t in op.inputs)
            if strict or on_resource:
                why = (" It takes a resource (a variable, which may be stored in shards), "
                       "so it cannot be kept whole." if on_resource and not strict else "")
                raise UnsupportedOpError(
                    "has no semantics description." + why, node=op.name, op_type=op.type,
                    fix=f"describe it with @semantics('{op.type}') in "
                        "tofu_tf/op_semantics/ops/, or declare it opaque with a reason"
                        + ("" if on_resource else
                           " (or drop Options(strict=True) to keep it whole)") + ".")
        entries[op.name] = entry
    return entries


def missing_types(entries: dict[str, OpEntry]) -> dict[str, list[str]]:
    """Op type -> names of its ops that have no description (kept whole)."""
    out: dict[str, list[str]] = {}
    for name, entry in entries.items():
        if entry.status == MISSING:
            out.setdefault(entry.op.type, []).append(name)
    return out
