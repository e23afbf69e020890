"""Plain node records of an imported graph, and their topological order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

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
    """Kahn's algorithm over data and control edges, stable in the given order."""
    by_name = {n.name: n for n in nodes}
    pending = {n.name: len(_preds(n)) for n in nodes}
    users: dict[str, list[str]] = {n.name: [] for n in nodes}
    for node in nodes:
        for pred in _preds(node):
            users[pred].append(node.name)
    ready = [n.name for n in nodes if pending[n.name] == 0]
    order: list[NodeRecord] = []
    while ready:
        name = ready.pop()
        order.append(by_name[name])
        for user in reversed(users[name]):
            pending[user] -= 1
            if pending[user] == 0:
                ready.append(user)
    if len(order) != len(nodes):
        stuck = next(n for n in nodes if pending[n.name] > 0)
        raise GraphImportError("the graph has a cycle through this node.", node=stuck.name,
                               op_type=stuck.type, fix="unroll loops before import.")
    return order


def _preds(node: NodeRecord) -> set[str]:
    return {split_tensor_name(t)[0] for t in node.inputs} | set(node.control_inputs)
