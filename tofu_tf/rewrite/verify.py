"""Checks on an emitted GraphDef, independent of how the emitter built it.

- every data and control input names a node of the graph;
- every node is placed on one of the plan's devices;
- every variable shard has the shape of the box the plan stores on its device, and the
  shards of a variable tile it (each element stored on at least one device);
- every fetch exists;
- every V2 collective instance has exactly group_size members on distinct devices;
- the bytes crossing devices, read off the graph's edges and shapes, equal the ledger's;
- the ledger's step bytes per level equal the plan's prediction (rewrite/pricing.py).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2
from tensorflow.python.framework import op_def_registry

from tofu_tf.errors import RewriteError
from tofu_tf.graph import DTYPE_SIZES, Graph

COLLECTIVES = ("CollectiveReduceV2", "CollectiveGatherV2", "CollectiveAllToAllV2")


def verify(emitted, graph: Graph, predicted: tuple[int, ...] = ()) -> None:
    """`predicted`: the plan's bytes per level for the step (checked when given)."""
    gd = emitted.graph_def
    nodes = {node.name: node for node in gd.node}
    devices = set(emitted.devices)
    for node in gd.node:
        for name in node.input:
            source = name.lstrip("^").split(":")[0]
            if source not in nodes:
                raise RewriteError(f"input '{name}' names no node.", node=node.name,
                                   op_type=node.op)
        if node.device not in devices:
            raise RewriteError(f"placed on '{node.device}', not one of the plan's devices.",
                               node=node.name, op_type=node.op)
    _check_shards(emitted, graph, nodes)
    for fetch in emitted.fetches:
        if fetch.split(":")[0] not in nodes:
            raise RewriteError("a fetch is missing from the emitted graph.", node=fetch)
    _check_collectives(gd)
    edges = cross_device_bytes(gd)
    if edges != emitted.ledger.edge_bytes:
        raise RewriteError(f"the graph moves {edges} bytes across devices, the ledger "
                           f"records {emitted.ledger.edge_bytes}.",
                           fix="every cross-device edge must be recorded once.")
    if predicted:
        ways = tuple(int(w) for w in emitted.partition.ways)
        moved = emitted.ledger.step_bytes_per_level(ways)
        if moved != tuple(predicted):
            raise RewriteError(f"the step moves {moved} bytes per level, the plan predicts "
                               f"{tuple(predicted)}.",
                               fix="the emitter and rewrite/pricing.py must follow the same "
                                   "rules.")


def _check_shards(emitted, graph: Graph, nodes) -> None:
    for name, shards in emitted.shards.items():
        variable = graph.variables[name]
        covered = np.zeros(variable.shape, dtype=bool)
        for shard in shards:
            node = nodes[shard.handle]
            shape = tuple(d.size for d in node.attr["shape"].shape.dim)
            want = tuple(b - a for a, b in shard.box)
            if shape != want:
                raise RewriteError(f"shard shape {shape} != the plan's box {shard.box}.",
                                   node=shard.handle, op_type=node.op)
            if node.device != emitted.devices[shard.device]:
                raise RewriteError("a shard is not on its device.", node=shard.handle)
            covered[tuple(slice(a, b) for a, b in shard.box)] = True
        if not covered.all():
            raise RewriteError("the shards do not cover the variable.", node=name,
                               fix="every element must be stored on some device.")


def _check_collectives(gd: graph_pb2.GraphDef) -> None:
    members: dict[int, list] = defaultdict(list)
    sizes: dict[int, set] = defaultdict(set)
    nodes = {node.name: node for node in gd.node}
    for node in gd.node:
        if node.op in COLLECTIVES:
            # inputs: (input, group_size, group_key, instance_key, ...)
            key = nodes[node.input[3].split(":")[0]].attr["value"].tensor.int_val[0]
            size_node = nodes[node.input[1].split(":")[0]]
            members[key].append(node)
            sizes[key].add(size_node.attr["value"].tensor.int_val[0])
    for key, group in members.items():
        size = sizes[key].pop()
        if len(group) != size or len({n.device for n in group}) != size:
            raise RewriteError(f"collective instance {key} has {len(group)} members on "
                               f"{len({n.device for n in group})} devices, group size {size}.",
                               node=group[0].name, op_type=group[0].op)


def cross_device_edges(gd: graph_pb2.GraphDef) -> set[tuple[str, str]]:
    """Every (tensor, destination device) pair whose producer is elsewhere: one Send/Recv
    pair each, which TensorFlow adds once per tensor and receiving device."""
    device_of = {node.name: node.device for node in gd.node}
    return {(name, node.device) for node in gd.node for name in node.input
            if not name.startswith("^") and device_of[name.partition(":")[0]] != node.device}


def cross_device_bytes(gd: graph_pb2.GraphDef) -> int:
    """Bytes of every cross-device edge (`cross_device_edges`): what Send/Recv move."""
    nodes = {node.name: node for node in gd.node}
    total = 0
    for name, _ in cross_device_edges(gd):
        source, _, index = name.partition(":")
        total += _tensor_bytes(nodes[source], int(index or 0))
    return total


def _tensor_bytes(node, index: int) -> int:
    shape = node.attr["_output_shapes"].list.shape[index]
    dtype = _output_dtype(node, index)
    return int(np.prod([d.size for d in shape.dim], dtype=np.int64)) * DTYPE_SIZES.get(dtype, 4)


def _output_dtype(node, index: int) -> str:
    """The dtype of output `index`, from the op's registered definition (a comparison's
    output is bool whatever its inputs' T)."""
    op_def = op_def_registry.get(node.op)
    types = []
    for arg in op_def.output_arg if op_def is not None else ():
        if arg.type_list_attr:
            types += list(_attr(node, arg.type_list_attr).list.type)
            continue
        count = _attr(node, arg.number_attr).i if arg.number_attr else 1
        types += [arg.type or _attr(node, arg.type_attr).type] * count
    if index < len(types) and types[index]:
        return tf.as_dtype(types[index]).name
    for key in ("T", "dtype", "out_type", "DstT"):
        if key in node.attr and node.attr[key].type:
            return tf.as_dtype(node.attr[key].type).name
    return "float32"


def _attr(node, key: str) -> attr_value_pb2.AttrValue:
    """node.attr[key] without inserting an empty value when it is missing."""
    return node.attr[key] if key in node.attr else attr_value_pb2.AttrValue()
