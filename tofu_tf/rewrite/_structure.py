"""The training-step structure of an imported graph: roles, gradient links, variables.

Works on plain node records in topological order (no TensorFlow). On the pruned graph:

  writers  W  ops that write a variable (Assign*VariableOp, ResourceApply*, ResourceScatter*).
  value edges data edges, plus a control edge from a writer to an op that touches the
              variable it wrote (a read after a write sees the written value).
  gradient B  ops under a gradient name scope (`gradient_tape/`, `gradients/`, `x/gradients_1/`),
              confirmed structurally: the scope names an existing forward op, or the op
              consumes another gradient op (or only constants).
  D           everything reachable from B along value edges.
  FORWARD     data-ancestors of B and of the fetches that are outside D and not writers.
  BACKWARD    B, plus the ops of D that feed B (un-scoped ops between gradient ops).
  UPDATE      the rest: writers, optimizer arithmetic, slot reads, joins.
  forward_op  the op a gradient scope names, `gradient_tape/<op>/...` or
              `gradients/<op>_grad/...`: the longest such prefix naming a FORWARD op
              (inlined function bodies are matched by a unique name suffix).
  trainable   read by a FORWARD op and written by an op of D (its update uses a gradient).
  slot_of     for a variable not read by FORWARD ops and written by an op of D: the one
              trainable variable whose writer its value reaches (if it reaches several,
              the one with the same shape).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from tofu_tf.errors import GraphImportError
from tofu_tf.graph import Role, Variable, split_tensor_name

WRITE_OPS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                       "ResourceStridedSliceAssign"})
WRITE_PREFIXES = ("ResourceApply", "ResourceSparseApply", "ResourceScatter")
ALIAS_OPS = frozenset({"Identity", "IdentityN", "Snapshot"})
TYPE_ROLES: Mapping[str, Role] = {
    "VarHandleOp": Role.VARIABLE, "Placeholder": Role.INPUT,
    "PlaceholderWithDefault": Role.INPUT, "Const": Role.CONSTANT,
}
_GRADIENT_SCOPE = re.compile(r"^(gradient_tape|gradients)(_\d+)?$")
_MAX_LABELS = 16  # slot labels carried per op; more means "reached by many", no slot info


@dataclass(frozen=True)
class NodeRecord:
    """One node: data inputs as tensor names ('op:i'), control inputs as op names."""
    name: str
    type: str
    inputs: tuple[str, ...]
    control_inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Structure:
    roles: Mapping[str, Role]
    forward_op: Mapping[str, str]      # backward op -> the forward op it differentiates
    variables: tuple[Variable, ...]
    resource_of: Mapping[str, str]     # resource tensor -> the variable handle op it refers to


def is_writer(op_type: str) -> bool:
    return op_type in WRITE_OPS or op_type.startswith(WRITE_PREFIXES)


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


def analyse(order: Sequence[NodeRecord], fetch_ops: Iterable[str],
            variable_specs: Mapping[str, tuple[tuple[int, ...], str]]) -> Structure:
    """Roles, forward links and variables of a graph given in topological order.

    `variable_specs` maps each variable handle op to its (shape, dtype name).
    """
    flow = _ValueFlow(order, variable_specs)
    gradients, forward_map = _gradient_ops(order)
    in_d = flow.reachable_from(gradients)
    roles = _roles(order, set(fetch_ops), gradients, in_d, flow)
    links = {op: fwd for op, fwd in forward_map.items()
             if roles[op] is Role.BACKWARD and roles.get(fwd) is Role.FORWARD}
    variables = _variables(order, flow, roles, in_d, variable_specs)
    return Structure(roles=roles, forward_op=links, variables=tuple(variables),
                     resource_of=flow.var_of_tensor)


class _ValueFlow:
    """Which variable each resource tensor refers to, and the value edges of the graph."""

    def __init__(self, order: Sequence[NodeRecord],
                 variable_specs: Mapping[str, tuple[tuple[int, ...], str]]):
        self.order = order
        self.types = {n.name: n.type for n in order}
        self.var_of_tensor = {f"{h}:0": h for h in variable_specs}
        self.touches: dict[str, frozenset[str]] = {}
        for node in order:
            self._track(node)
        self.value_preds = {n.name: self._value_preds(n) for n in order}
        self.data_users: dict[str, list[str]] = {n.name: [] for n in order}
        for node in order:
            for tensor in node.inputs:
                self.data_users[split_tensor_name(tensor)[0]].append(node.name)

    def _track(self, node: NodeRecord) -> None:
        held = [(i, self.var_of_tensor[t]) for i, t in enumerate(node.inputs)
                if t in self.var_of_tensor]
        if node.type in ALIAS_OPS:
            for index, var in held:
                self.var_of_tensor[f"{node.name}:{index}"] = var
            return
        self.touches[node.name] = frozenset(var for _, var in held)

    def writes(self, op: str) -> frozenset[str]:
        return self.touches.get(op, frozenset()) if is_writer(self.types[op]) else frozenset()

    def _value_preds(self, node: NodeRecord) -> list[str]:
        preds = [split_tensor_name(t)[0] for t in node.inputs]
        touched = self.touches.get(node.name, frozenset())
        preds += [c for c in node.control_inputs if touched & self.writes(c)]
        return preds

    def reachable_from(self, sources: set[str]) -> set[str]:
        reached = set(sources)
        for node in self.order:
            if node.name not in reached and any(p in reached for p in self.value_preds[node.name]):
                reached.add(node.name)
        return reached


def _gradient_ops(order: Sequence[NodeRecord]) -> tuple[set[str], dict[str, str]]:
    """Gradient-scoped ops confirmed structurally, and the forward ops they differentiate."""
    types = {n.name: n.type for n in order}
    resolver = _ForwardResolver(order)
    gradients: set[str] = set()
    forward_map: dict[str, str] = {}
    for node in order:
        if node.type in TYPE_ROLES or _gradient_scope(node.name) is None:
            continue
        producers = [split_tensor_name(t)[0] for t in node.inputs]
        forward = resolver.resolve(node) or _inherited(node, producers, forward_map)
        if forward or any(p in gradients for p in producers) or \
                all(types[p] == "Const" for p in producers):
            gradients.add(node.name)
            if forward:
                forward_map[node.name] = forward
    return gradients, forward_map


def _gradient_scope(name: str) -> int | None:
    """Index of the first gradient-scope component of an op name, or None."""
    for index, part in enumerate(name.split("/")[:-1]):
        if _GRADIENT_SCOPE.match(part):
            return index
    return None


def _parent(name: str) -> str:
    return name.rpartition("/")[0]


def _inherited(node: NodeRecord, producers: list[str], forward_map: Mapping[str, str]
               ) -> str | None:
    """A gradient op with no link of its own differentiates what its same-scope inputs do."""
    found = {forward_map[p] for p in producers
             if p in forward_map and _parent(p) == _parent(node.name)}
    return found.pop() if len(found) == 1 else None


class _ForwardResolver:
    """Finds the forward op a gradient op differentiates.

    The gradient op lives in `<outer>/gradient_tape/<S>/...` (tape: S is the name scope
    the forward op was created in, often its own name) or `<outer>/gradients/<S>_grad/...`.
    Candidates are the forward op named S and the forward ops directly inside scope S;
    a candidate is confirmed when the gradient op consumes one of its inputs or outputs.
    """

    def __init__(self, order: Sequence[NodeRecord]):
        self._records = {n.name: n for n in order if _gradient_scope(n.name) is None}
        self._children: dict[str, list[str]] = {}
        for name in self._records:
            self._children.setdefault(_parent(name), []).append(name)
        self._suffixes: dict[str, str | None] | None = None

    def resolve(self, node: NodeRecord) -> str | None:
        parts = node.name.split("/")
        k = _gradient_scope(node.name)
        outer, scope = "/".join(parts[:k]), "/".join(parts[k + 1:-1])
        if scope.endswith("_grad"):
            scope = scope[:-5]
        if not scope:
            return None
        for full in self._scopes(outer, scope):
            found = self._confirm(node, full)
            if found:
                return found
        return None

    def _scopes(self, outer: str, scope: str) -> list[str]:
        scopes = [f"{outer}/{scope}", scope] if outer else [scope]
        if outer and self._by_suffix(scope):
            scopes.append(self._by_suffix(scope))
        return [s for s in scopes if s in self._records or s in self._children]

    def _confirm(self, node: NodeRecord, scope: str) -> str | None:
        used = set(node.inputs)
        outputs, inputs = [], []
        for name in ([scope] if scope in self._records else []) + self._children.get(scope, []):
            record = self._records[name]
            if any(split_tensor_name(t)[0] == name for t in used):
                outputs.append(name)
            elif used & set(record.inputs):
                inputs.append(name)
        for matches in (outputs, inputs):
            if matches:
                return scope if scope in matches else (matches[0] if len(matches) == 1 else None)
        return scope if scope in self._records else None

    def _by_suffix(self, suffix: str) -> str | None:
        if self._suffixes is None:
            self._suffixes = {}
            for name in self._records:
                parts = name.split("/")
                for m in range(1, len(parts)):
                    key = "/".join(parts[m:])
                    self._suffixes[key] = None if key in self._suffixes else name
        return self._suffixes.get(suffix)


def _roles(order: Sequence[NodeRecord], fetch_ops: set[str], gradients: set[str],
           in_d: set[str], flow: _ValueFlow) -> dict[str, Role]:
    feeds_gradient: set[str] = set()
    forward: set[str] = set()
    for node in reversed(order):
        users = flow.data_users[node.name]
        if any(u in gradients or u in feeds_gradient for u in users):
            feeds_gradient.add(node.name)
        if node.name in in_d or is_writer(node.type):
            continue
        if node.name in fetch_ops or any(u in gradients or u in forward for u in users):
            forward.add(node.name)
    roles: dict[str, Role] = {}
    for node in order:
        if node.type in TYPE_ROLES:
            roles[node.name] = TYPE_ROLES[node.type]
        elif node.name in gradients or (node.name in in_d and node.name in feeds_gradient):
            roles[node.name] = Role.BACKWARD
        elif node.name in forward:
            roles[node.name] = Role.FORWARD
        else:
            roles[node.name] = Role.UPDATE
    return roles


def _variables(order: Sequence[NodeRecord], flow: _ValueFlow, roles: Mapping[str, Role],
               in_d: set[str], specs: Mapping[str, tuple[tuple[int, ...], str]]
               ) -> list[Variable]:
    reads: dict[str, list[str]] = {h: [] for h in specs}
    updates: dict[str, list[str]] = {h: [] for h in specs}
    for node in order:
        written = flow.writes(node.name)
        for var in sorted(flow.touches.get(node.name, ())):
            (updates if var in written else reads)[var].append(node.name)
    trainable = {h for h in specs
                 if any(roles[r] is Role.FORWARD for r in reads[h])
                 and any(u in in_d for u in updates[h])}
    slots = {h for h in specs
             if not any(roles[r] is Role.FORWARD for r in reads[h])
             and any(u in in_d for u in updates[h])}
    owners = _slot_owners(flow, slots, trainable, specs)
    return [Variable(name=h, handle=f"{h}:0", shape=specs[h][0], dtype=specs[h][1],
                     read_ops=tuple(reads[h]), update_ops=tuple(updates[h]),
                     slot_of=owners.get(h), trainable=h in trainable)
            for h in (n.name for n in order) if h in specs]


def _slot_owners(flow: _ValueFlow, slots: set[str], trainable: set[str],
                 specs: Mapping[str, tuple[tuple[int, ...], str]]) -> dict[str, str]:
    """Propagate slot labels along value edges; a trainable variable's writer names its slots."""
    empty: frozenset[str] = frozenset()
    labels: dict[str, frozenset[str] | None] = {}
    targets: dict[str, set[str]] = {s: set() for s in slots}
    for node in flow.order:
        label = _merge([labels[p] for p in flow.value_preds[node.name]], empty)
        if node.name in slots and label is not None:
            label = label | {node.name}
        labels[node.name] = label
        for owner in flow.writes(node.name) & trainable:
            for slot in label or ():
                targets[slot].add(owner)
    owners = {}
    for slot, found in targets.items():
        if len(found) > 1:
            found = {t for t in found if specs[t][0] == specs[slot][0]}
        if len(found) == 1:
            owners[slot] = found.pop()
    return owners


def _merge(sets: list[frozenset[str] | None], empty: frozenset[str]) -> frozenset[str] | None:
    merged = empty
    for s in sets:
        if s is None:
            return None
        if s:
            merged = merged | s if merged else s
    return merged if len(merged) <= _MAX_LABELS else None
