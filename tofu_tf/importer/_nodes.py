"""Plain node records of an imported graph, and their topological order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tofu_tf._order import stable_topological_order
from tofu_tf.errors import GraphImportError
from tofu_tf.graph import split_tensor_name

SOURCE_TYPES = frozenset({"VarHandleOp", "Placeholder", "PlaceholderWithDefault", "Const"})


@dataclass(frozen=True)
class NodeRecord:
    """One node: data inputs as tensor names ('op:i'), control inputs as op names."""
    name: str
    type: str
    inputs: tuple[str, ...]
    control_inputs: tuple[str, ...] = ()


def topological_order(nodes: Sequence[NodeRecord]) -> list[NodeRecord]:
    """Kahn's algorithm over data and control edges, ties broken by the given order."""
    index = {n.name: i for i, n in enumerate(nodes)}
    order = [nodes[i] for i in stable_topological_order(
        [{index[p] for p in _preds(n)} for n in nodes])]
    if len(order) != len(nodes):
        placed = {n.name for n in order}
        stuck = next(n for n in nodes if n.name not in placed)
        raise GraphImportError("the graph has a cycle through this node.", node=stuck.name,
                               op_type=stuck.type, fix="unroll loops before import.")
    return order


def _preds(node: NodeRecord) -> set[str]:
    return {split_tensor_name(t)[0] for t in node.inputs} | set(node.control_inputs)
