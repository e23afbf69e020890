"""Fewer plumbing nodes in an emitted graph, the same values and the same transfers.

The emitter writes each region it moves as its own Slice of the value that holds it: a
device that sends one row block to each of seven others slices its tensor seven times, and
an op that reads a slice of a stored part slices a slice. On logical CPU devices every
node costs the executor about a microsecond whatever its size, so on small models the
plumbing, not the kernels, sets the step time. `tidy` rewrites, on each device:

- a Slice of a plumbing Slice as one Slice of the first one's input;
- the plumbing Slices of one tensor that tile it along one axis (every other axis whole)
  as one SplitV, whose outputs their readers read instead;
- and drops the plumbing nodes these leave unread.

It never moves an edge across devices (the bytes crossing devices, which the verifier
checks against the ledger, stay the same) and never touches the planner's own ops, the
fetches or anything the emitter names elsewhere: only nodes it may remove are rewired.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Collection

import numpy as np
from tensorflow.core.framework import types_pb2

from tofu_tf.rewrite.nodedefs import GraphBuilder, int_attr, type_attr
from tofu_tf.rewrite.schedule import _source


def tidy(builder: GraphBuilder, fixed: Collection[str]) -> None:
    """Rewrites `builder`'s nodes in place as the module docstring says; `fixed`: nodes
    that must keep their name and outputs (the planner's ops, fetches, and any node the
    emitter reports)."""
    nodes = builder.nodes()
    by_name = {node.name: node for node in nodes}
    plumbing = {node.name for node in nodes
                if node.op == "Slice" and node.name not in fixed and _bounds(builder, node)}
    rewired: set[str] = set()              # nodes some reader no longer reads
    edited: set[str] = set()               # nodes whose inputs changed
    for node in nodes:
        if node.op == "Slice":
            _compose(builder, node, by_name, plumbing, rewired, edited)
    added = _split(builder, nodes, by_name, plumbing, rewired, edited)
    # The constants made on the way go first: the execution order (schedule.order) breaks
    # ties by position, and a node placed after its readers would hold them back.
    made = builder.nodes()[len(nodes):]
    builder.replace_nodes(_without_unread(made + nodes, rewired, fixed, added), edited)


def _bounds(builder: GraphBuilder, node) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """(begin, size) of a Slice whose begin is a known constant (size from its shape)."""
    if ":" in node.input[1]:
        return None
    begin = builder.const_value(node.input[1])
    size = builder.output_shape(node, 0)
    if begin is None or size is None:
        return None
    return np.asarray(begin, np.int64), size


def _compose(builder, node, by_name, plumbing, rewired, edited) -> None:
    """A Slice of a plumbing Slice on the same device reads the latter's input."""
    inner = by_name.get(_source(node.input[0]))
    bounds = _bounds(builder, node)
    if (inner is None or inner.name not in plumbing or inner.device != node.device
            or ":" in node.input[0] or bounds is None):
        return
    begin, size = bounds
    inner_begin, _ = _bounds(builder, inner)
    index = node.attr["Index"].type
    device = builder.devices.index(node.device)
    node.input[0] = inner.input[0]
    node.input[1] = builder.const(inner_begin + begin, index, device, "ints").name
    node.input[2] = builder.const(np.asarray(size, np.int64), index, device, "ints").name
    rewired.add(inner.name)
    edited.add(node.name)


def _split(builder, nodes, by_name, plumbing, rewired, edited) -> dict[str, list]:
    """One SplitV per (tensor, device, axis) whose plumbing Slices tile the tensor along
    that axis; their readers read its outputs. Returns {first slice's name: [the SplitV]}
    (where it goes in the graph)."""
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for node in nodes:
        if node.name in plumbing:
            groups[(node.input[0], node.device)].append(node)
    renames: dict[str, str] = {}
    added: dict[str, list] = {}
    position = {node.name: i for i, node in enumerate(nodes)}
    for (tensor, device), slices in groups.items():
        source = by_name.get(_source(tensor))
        shape = source and builder.output_shape(source, int(tensor.partition(":")[2] or 0))
        if len(slices) < 2 or shape is None:
            continue
        for axis, extents, members in _tilings(builder, slices, shape):
            d = builder.devices.index(device)
            dtype = members[0][0].attr["T"].type
            sizes = [hi - lo for lo, hi in extents]
            first = min((node for node, _ in members), key=lambda node: position[node.name])
            split = builder.detached_node(
                "SplitV", builder.name(first.name.rpartition("/tofu_")[0] + "/split"), d,
                (tensor, builder.int32(sizes, d), builder.int32(axis, d)),
                {"T": type_attr(dtype), "Tlen": type_attr(types_pb2.DT_INT32),
                 "num_split": int_attr(len(sizes))},
                [shape[:axis] + (s,) + shape[axis + 1:] for s in sizes], [dtype] * len(sizes))
            for node, k in members:
                renames[node.name] = split.name if k == 0 else f"{split.name}:{k}"
                rewired.add(node.name)
            added.setdefault(first.name, []).append(split)
    if renames:
        for node in nodes:
            for k, name in enumerate(node.input):
                if not name.startswith("^") and name.partition(":")[0] in renames:
                    node.input[k] = renames[name.partition(":")[0]]
                    edited.add(node.name)
    return added


def _box(builder, node) -> list[tuple[int, int]]:
    begin, size = _bounds(builder, node)
    return [(int(b), int(b) + int(s)) for b, s in zip(begin, size)]


def _tilings(builder, slices, shape):
    """(axis, extents in order, [(slice, its extent's index)]) for each axis along which
    the slices that take every other axis whole have extents that tile it. Of two slices
    of one extent only the first joins: as two nodes they cross to a device twice, and the
    bytes crossing devices must stay what the ledger recorded."""
    boxes = {node.name: _box(builder, node) for node in slices}
    taken: set[str] = set()
    for axis in range(len(shape)):
        members, extents = [], set()
        for node in slices:
            box = boxes[node.name]
            if (node.name not in taken and box[axis] != (0, shape[axis])
                    and box[axis] not in extents and all(
                        box[k] == (0, shape[k]) for k in range(len(shape)) if k != axis)):
                members.append(node)
                extents.add(box[axis])
        extents = sorted(extents)
        if len(extents) > 1 and extents[0][0] == 0 and extents[-1][1] == shape[axis] and all(
                a[1] == b[0] for a, b in zip(extents, extents[1:])):
            taken.update(node.name for node in members)
            yield axis, extents, [(node, extents.index(boxes[node.name][axis]))
                                  for node in members]


def _without_unread(nodes, rewired, fixed, added) -> list:
    """`nodes` with the SplitVs before the first slice they replace, less the rewired
    nodes nobody reads any more and the constants only those read."""
    readers: dict[str, int] = defaultdict(int)
    for node in [*nodes, *(n for extra in added.values() for n in extra)]:
        for name in node.input:
            readers[_source(name)] += 1
    dropped = set()
    stack = [name for name in rewired if readers[name] == 0 and name not in fixed]
    by_name = {node.name: node for node in nodes}
    while stack:
        name = stack.pop()
        if name in dropped:
            continue
        dropped.add(name)
        for source in map(_source, by_name[name].input):
            readers[source] -= 1
            node = by_name.get(source)
            if (readers[source] == 0 and node is not None and source not in fixed
                    and node.op == "Const" and "/tofu_" in source):
                stack.append(source)
    kept = []
    for node in nodes:
        kept += added.get(node.name, [])
        if node.name not in dropped:
            kept.append(node)
    return kept
