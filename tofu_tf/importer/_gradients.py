"""Which ops are gradient ops, and which forward op each one differentiates.

A gradient op lives in `<outer>/gradient_tape/<S>/<name>` (tf.GradientTape: S is the name
scope the forward op was created in, often the forward op's own name) or in
`<outer>/gradients/<S>_grad/<name>` (tf.gradients: S is the forward op's name); `<outer>`
is the call op's name when a function body was inlined. The forward op is resolved,
in order of trust:

  1. S names a forward op                                  -> S
  2. among the forward ops directly inside scope S, the one sharing most tensors
     (its inputs or outputs) with the gradient op, if unique
  3. gradient flow: the gradient op consumes gradients of Y; the forward op is the
     unique producer of Y's inputs (inside S, where S is known)
  4. a same-scope gradient input's forward op, if there is exactly one
Forward ops whose gradient creates no ops (StopGradient, Shape, ReadVariableOp, ...) are
never candidates. Otherwise None. A name-scoped op counts as a gradient op only when confirmed: it
resolves to a forward op, or consumes a gradient op, or consumes only constants.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from tofu_tf.graph import split_tensor_name
from tofu_tf.importer._nodes import SOURCE_TYPES, NodeRecord

_GRADIENT_SCOPE = re.compile(r"^(gradient_tape|gradients)(_\d+)?$")
# Forward ops whose gradient creates no ops: never the forward op of a gradient op.
NO_GRADIENT_OPS = frozenset({"StopGradient", "PreventGradient", "Shape", "ShapeN", "Size",
                             "Rank", "ReadVariableOp", "NoOp", "ZerosLike", "OnesLike"})


def gradient_ops(order: Sequence[NodeRecord], resolver: ForwardResolver
                 ) -> tuple[set[str], dict[str, str]]:
    """Confirmed gradient-scoped ops, and the forward op of each where it is known."""
    types = {n.name: n.type for n in order}
    gradients: set[str] = set()
    forward_map: dict[str, str] = {}
    for node in order:
        if node.type in SOURCE_TYPES or gradient_scope_index(node.name) is None:
            continue
        producers = [_producer(t) for t in node.inputs]
        forward = resolver.resolve(node, forward_map)
        if forward or any(p in gradients for p in producers) or \
                all(types[p] == "Const" for p in producers):
            gradients.add(node.name)
            if forward:
                forward_map[node.name] = forward
    return gradients, forward_map


def gradient_scope_index(name: str) -> int | None:
    """Index of the first gradient-scope component of an op name, or None."""
    for index, part in enumerate(name.split("/")[:-1]):
        if _GRADIENT_SCOPE.match(part):
            return index
    return None


def _producer(tensor: str) -> str:
    return split_tensor_name(tensor)[0]


def _parent(name: str) -> str:
    return name.rpartition("/")[0]


class ForwardResolver:
    """Resolves gradient ops to forward ops (rules 1-4 of the module docstring)."""

    def __init__(self, order: Sequence[NodeRecord]):
        self._records = {n.name: n for n in order if gradient_scope_index(n.name) is None
                         and n.type not in SOURCE_TYPES and n.type not in NO_GRADIENT_OPS}
        self._children: dict[str, list[str]] = {}
        for name in self._records:
            self._children.setdefault(_parent(name), []).append(name)
        self._suffixes: dict[str, str | None] | None = None
        self._indexes: dict[str, dict[str, list[str]]] = {}

    def resolve(self, node: NodeRecord, known: Mapping[str, str]) -> str | None:
        scope = self._forward_scope(node.name)
        if scope is None:
            return None
        if scope in self._records:
            return scope
        return (self._by_shared_tensors(node, scope)
                or self.by_flow(node, known, scope) or _inherited(node, known))

    def by_flow(self, node: NodeRecord, known: Mapping[str, str],
                scope: str | None) -> str | None:
        """The unique forward producer of the inputs of the ops whose gradients `node` uses."""
        common: set[str] | None = None
        for tensor in node.inputs:
            forward = known.get(_producer(tensor))
            if forward is None:
                continue
            producers = {_producer(t) for t in self._records[forward].inputs
                         if _producer(t) in self._records}
            if scope is not None:
                producers = {p for p in producers if _parent(p) == scope}
            common = producers if common is None else common & producers
        return next(iter(common)) if common and len(common) == 1 else None

    def _forward_scope(self, name: str) -> str | None:
        parts = name.split("/")
        k = gradient_scope_index(name)
        outer, scope = "/".join(parts[:k]), "/".join(parts[k + 1:-1])
        scope = scope[:-5] if scope.endswith("_grad") else scope
        if not scope:
            return None
        candidates = [f"{outer}/{scope}", scope, self._by_suffix(scope)] if outer else [scope]
        for candidate in candidates:
            if candidate in self._records or candidate in self._children:
                return candidate
        return None

    def _by_shared_tensors(self, node: NodeRecord, scope: str) -> str | None:
        """The op of `scope` sharing most tensors (its inputs or outputs) with `node`."""
        index = self._input_index(scope)
        scores: dict[str, int] = {}
        for tensor in set(node.inputs):
            producer = _producer(tensor)
            owners = list(index.get(tensor, ()))
            if producer in self._records and _parent(producer) == scope:
                owners.append(producer)
            for name in owners:
                scores[name] = scores.get(name, 0) + 1
        if not scores:
            return None
        best = max(scores.values())
        winners = [name for name, score in scores.items() if score == best]
        return winners[0] if len(winners) == 1 else None

    def _input_index(self, scope: str) -> dict[str, list[str]]:
        """Tensor -> the ops directly inside `scope` that consume it (built once per scope)."""
        if scope not in self._indexes:
            index: dict[str, list[str]] = {}
            for name in self._children.get(scope, ()):
                for tensor in set(self._records[name].inputs):
                    index.setdefault(tensor, []).append(name)
            self._indexes[scope] = index
        return self._indexes[scope]

    def _by_suffix(self, suffix: str) -> str | None:
        """The unique forward op or scope whose name ends with `/suffix` (inlined bodies)."""
        if self._suffixes is None:
            self._suffixes = {}
            for name in list(self._records) + list(self._children):
                parts = name.split("/")
                for m in range(1, len(parts)):
                    key = "/".join(parts[m:])
                    if self._suffixes.get(key, name) != name:
                        self._suffixes[key] = None
                    else:
                        self._suffixes[key] = name
        return self._suffixes.get(suffix)


def _inherited(node: NodeRecord, known: Mapping[str, str]) -> str | None:
    """A gradient op with no link of its own differentiates what its same-scope inputs do."""
    found = {known[p] for p in map(_producer, node.inputs)
             if p in known and _parent(p) == _parent(node.name)}
    return found.pop() if len(found) == 1 else None
