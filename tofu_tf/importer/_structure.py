"""The training-step structure of an imported graph: roles, gradient links, variables.

Works on plain node records in topological order (no TensorFlow). On the pruned graph:

  writers  W  ops that write a variable (Assign*VariableOp, ResourceApply*, ResourceScatter*).
  value edges data edges, plus a control edge from a writer to an op that touches the
              variable it wrote (a read after a write sees the written value).
  gradient B  ops under a gradient name scope (`gradient_tape/`, `gradients/`, `x/gradients_1/`),
              confirmed structurally (see _gradients).
  D           everything reachable from B along value edges.
  FORWARD     data-ancestors of B and of the fetches, outside D; never a writer or NoOp.
  BACKWARD    B, plus the ops of D that feed B (un-scoped ops between gradient ops).
  UPDATE      the rest: writers, optimizer arithmetic, slot reads, joins.
  forward_op  the FORWARD op a BACKWARD op differentiates: from its gradient name scope,
              confirmed by shared tensors, or by gradient flow for un-scoped ops (the
              tape's AddN); None when unknown (see _gradients).
  trainable   read by a FORWARD op and written by an op of D (its update uses a gradient).
  slot_of     for a variable not read by FORWARD ops and written by an op of D: the one
              trainable variable whose writer its value reaches (if it reaches several,
              the one with the same shape).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from tofu_tf.graph import Role, Variable, split_tensor_name
from tofu_tf.importer._gradients import ForwardResolver, gradient_ops
from tofu_tf.importer._nodes import NodeRecord

WRITE_OPS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                       "ResourceStridedSliceAssign"})
WRITE_PREFIXES = ("ResourceApply", "ResourceSparseApply", "ResourceScatter")
ALIAS_OPS = frozenset({"Identity", "IdentityN", "Snapshot"})
TYPE_ROLES: Mapping[str, Role] = {
    "VarHandleOp": Role.VARIABLE, "Placeholder": Role.INPUT,
    "PlaceholderWithDefault": Role.INPUT, "Const": Role.CONSTANT,
}
_MAX_LABELS = 16  # slot labels carried per op; more means "reached by many", no slot info


@dataclass(frozen=True)
class Structure:
    roles: Mapping[str, Role]
    forward_op: Mapping[str, str]      # backward op -> the forward op it differentiates
    variables: tuple[Variable, ...]
    resource_of: Mapping[str, str]     # resource tensor -> the variable handle op it refers to


def is_writer(op_type: str) -> bool:
    return op_type in WRITE_OPS or op_type.startswith(WRITE_PREFIXES)


def analyse(order: Sequence[NodeRecord], fetch_ops: Iterable[str],
            variable_specs: Mapping[str, tuple[tuple[int, ...], str]]) -> Structure:
    """Roles, forward links and variables of a graph given in topological order.

    `variable_specs` maps each variable handle op to its (shape, dtype name).
    """
    flow = _ValueFlow(order, variable_specs)
    resolver = ForwardResolver(order)
    gradients, forward_map = gradient_ops(order, resolver)
    in_d = flow.reachable_from(gradients)
    roles = _roles(order, set(fetch_ops), gradients, in_d, flow)
    for node in order:  # backward ops outside gradient scopes (the tape's AddN)
        if roles[node.name] is Role.BACKWARD and node.name not in forward_map:
            found = resolver.by_flow(node, forward_map, None)
            if found:
                forward_map[node.name] = found
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


def _roles(order: Sequence[NodeRecord], fetch_ops: set[str], gradients: set[str],
           in_d: set[str], flow: _ValueFlow) -> dict[str, Role]:
    feeds_gradient: set[str] = set()
    forward: set[str] = set()
    for node in reversed(order):
        users = flow.data_users[node.name]
        if any(u in gradients or u in feeds_gradient for u in users):
            feeds_gradient.add(node.name)
        if node.name in in_d or is_writer(node.type) or node.type == "NoOp":
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
