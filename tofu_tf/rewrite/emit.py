"""The plan becomes a device-placed GraphDef.

For every op and device the emitter places the device's local op (`partition.py`: local
shapes, adjusted attrs and constant inputs) and wires its inputs from what the devices
store:

- stored values: each output tensor is stored on each device as the plan's states say
  (`Partition.stored`). A stored box is cut from the device's own result when it holds it,
  assembled from the producing devices otherwise (`convert`), and summed over the
  reduction group when the producers hold partial results (`reduce`).
- reads: an op's input region is cut from the device's own stored box when it lies inside
  it, otherwise assembled from the devices storing the rest (`fetch`): a Slice on the
  owner, a ConcatV2 on the reader (TensorFlow's Send/Recv carry the cross-device edge),
  then a Pad with the description's fill for halo parts beyond the tensor's edge.
- variables: one VarHandleOp per device with the shard's shape; reads and in-place
  updates address the device's shard. `Emitted.shards` maps each original variable to its
  shards, so callers can initialise them from the unpartitioned values and write back.
- fetches keep their names: a fetched tensor is assembled whole on device 0 under the
  original name; a fetched op becomes a NoOp waiting for every device's piece.

Every cross-device edge is recorded in the ledger. The input GraphDef is never mutated.
Nodes are written straight into the GraphDef (`nodedefs.GraphBuilder`), with the local
shapes the partition knows; a region that is a whole value is that value (no Slice).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, types_pb2

from tofu_tf.errors import RewriteError
from tofu_tf.graph import DTYPE_SIZES, Graph, split_tensor_name
from tofu_tf.op_semantics.catalog import OpEntry
from tofu_tf.options import Collectives
from tofu_tf.rewrite import collectives
from tofu_tf.rewrite.ledger import Ledger
from tofu_tf.rewrite.tidy import tidy
from tofu_tf.rewrite.nodedefs import GraphBuilder, Ref, dtype_enum
from tofu_tf.rewrite.partition import (ON_VALUES, Box, DeviceOp, Partition, contains,
                                      fetched_from, narrow_update, nonempty, own_shard,
                                      partition, reads_values, reducer_identity,
                                      shared_prefix)
from tofu_tf.importer.tf_attrs import to_attr_value
from tofu_tf.search.cost import box_volume
from tofu_tf.search.plan import Plan



@dataclass(frozen=True)
class Shard:
    device: int
    box: Box
    handle: str          # the shard's VarHandleOp name in the emitted graph


@dataclass
class Emitted:
    graph_def: graph_pb2.GraphDef
    partition: Partition
    ledger: Ledger
    shards: dict[str, tuple[Shard, ...]]           # variable (handle op) name -> shards
    devices: tuple[str, ...]
    fetches: tuple[str, ...]                        # names to fetch (same as the input's)
    feeds: tuple[str, ...] = ()
    op_nodes: frozenset[str] = frozenset()          # the nodes that run planner ops
    # With sharded feeds: fed tensor -> (placeholder tensor, device, box) per device, each
    # device's share fed to it directly (the runners cut the whole value)
    feed_shards: Mapping[str, tuple[tuple[str, int, Box], ...]] = field(default_factory=dict)


def cpu_devices(n: int) -> tuple[str, ...]:
    return tuple(f"/job:localhost/replica:0/task:0/device:CPU:{d}" for d in range(n))


def emit(graph: Graph, graph_def: graph_pb2.GraphDef, entries: Mapping[str, OpEntry],
         plan: Plan, *, devices: Sequence[str] | None = None,
         feeds: Sequence[str] = (), expose: Sequence[str] = (),
         collectives_mode: Collectives = Collectives.AUTO, sequential: bool = True,
         parts: Partition | None = None, shard_feeds: bool = False) -> Emitted:
    """The partitioned GraphDef of `graph` (imported from `graph_def`) under `plan`.
    `expose`: more tensors to assemble whole on device 0, as `tofu_expose/<op>_<index>`
    (for inspecting intermediate values). `collectives_mode`, `sequential`, `shard_feeds`:
    see Options. `parts`: the plan's partition when already computed (`partition_of`)."""
    parts = parts or partition_of(graph, graph_def, entries, plan)
    devices = tuple(devices or cpu_devices(parts.num_devices))
    if len(devices) != parts.num_devices:
        raise RewriteError(f"{len(devices)} device names for a plan over "
                           f"{parts.num_devices} devices.",
                           fix="pass one device name per device of the plan.")
    return _Emitter(graph, graph_def, entries, parts, devices, feeds, plan,
                    collectives_mode, shard_feeds).run(expose, sequential)


def partition_of(graph: Graph, graph_def: graph_pb2.GraphDef,
                 entries: Mapping[str, OpEntry], plan: Plan, once_below: int = 0) -> Partition:
    """The plan's per-device ops and regions, with TensorFlow's shape inference for the
    local kernels' real result shapes (`once_below`: Options.compute_once_below)."""
    nodes = {node.name: node for node in graph_def.node}
    handles = frozenset(v.handle for v in graph.variables.values())
    return partition(graph, entries, plan,
                     functools.partial(_result_shapes, graph, nodes, handles), once_below)


def uses_v2(collectives_mode: Collectives, devices: Sequence[str]) -> bool:
    """Whether partial results reduce with V2 collectives (always on GPUs under AUTO)."""
    on_gpus = any("GPU" in name.upper() for name in devices)
    return collectives_mode is Collectives.V2 or (collectives_mode is Collectives.AUTO
                                                   and on_gpus)


@dataclass
class _Value:
    """A tensor region held on a device in the emitted graph."""
    tensor: Ref
    box: Box


class _Emitter:
    def __init__(self, graph: Graph, graph_def, entries, parts: Partition, devices, feeds,
                 plan: Plan, collectives_mode: Collectives = Collectives.AUTO,
                 shard_feeds: bool = False):
        self.graph, self.entries, self.parts, self.devices = graph, entries, parts, devices
        self.plan = plan
        self.reduced: dict[str, dict] = {}                       # tensor -> reduce_all
        self.use_v2 = uses_v2(collectives_mode, devices)
        self.communication_hint = ("nccl" if any("GPU" in name.upper() for name in devices)
                                   else "auto")
        self._group_keys: dict[tuple[int, ...], int] = {}
        self._instances = itertools.count(1)
        self.collective_ops: list[str] = []                      # their node names
        self.feeds = tuple(feeds)
        self.nodes = {node.name: node for node in graph_def.node}
        self.out = GraphBuilder(devices)
        self.ledger = Ledger()
        self.n = parts.num_devices
        self.coordinates = [parts.coordinates(d) for d in range(self.n)]
        self.produced: dict[str, list[_Value | None]] = {}      # tensor -> per device
        self.partial: dict[str, tuple] = {}                      # tensor -> (levels, reducer)
        self.stored: dict[tuple[str, int], _Value] = {}
        self.handles: dict[tuple[str, int], Ref] = {}            # (variable tensor, device)
        self.pieces: dict[str, list[str]] = {}                   # op -> its emitted nodes
        self.device_of: dict[str, int] = {}                      # piece node -> its device
        self.gates: dict[tuple, str] = {}          # (control inputs, device) -> its NoOp
        self.reads: dict[tuple[str, int], list[str]] = {}        # (variable, device) -> reads
        self.shards: dict[str, tuple[Shard, ...]] = {}
        self.variable_of = {v.handle: v for v in graph.variables.values()}
        self.sent: set[tuple[str, int]] = set()          # (tensor in the graph, device)
        self.fed: dict[str, _Value] = {}                  # placeholder tensor -> whole feed
        self.shard_feeds = shard_feeds
        self.feed_shards: dict[str, list[tuple[str, int, Box]]] = {}
        self.received: dict[str, dict[int, list[_Value]]] = {}   # t -> device -> regions

    # -- driver ----------------------------------------------------------------------------
    def run(self, expose: Sequence[str] = (), sequential: bool = True) -> Emitted:
        for op in self.graph:
            if op.name in self.parts.ops:
                self._emit_op(op)
            else:
                raise RewriteError("the op has no description to partition.",
                                   node=op.name, op_type=op.type)
        # Every collective's members must run, or the others wait forever: the fetches
        # wait for all of them (a member whose result nobody reads included).
        fetches = [self._emit_fetch(f) for f in self.graph.fetches]
        for t in expose:
            self._emit_fetch(t, "tofu_expose/" + t.replace(":", "_"))
        op_nodes = frozenset(n for names in self.pieces.values() for n in names)
        tidy(self.out, op_nodes | {f.partition(":")[0] for f in fetches}
             | set(self.collective_ops))
        if sequential:
            self.out.chain_devices(fetches)
        return Emitted(self.out.graph_def, self.parts, self.ledger, self.shards, self.devices,
                       tuple(fetches), self.feeds, op_nodes,
                       {t: tuple(s) for t, s in self.feed_shards.items()})

    def _name(self, base: str) -> str:
        return self.out.name(base)

    def _dtype(self, t: str) -> int:
        return dtype_enum(self.graph.tensors[t].dtype)

    # -- ops -------------------------------------------------------------------------------
    def _emit_op(self, op) -> None:
        pieces = self.parts.ops[op.name]
        node = self.nodes[op.copy_of or op.name]         # an added op: its original's
        emitted = [self._emit_piece(op, node, piece) for piece in pieces]
        for name, piece in zip(emitted, pieces):
            if name is not None:
                self.device_of[name] = piece.device
        self.pieces[op.name] = [e for e in emitted if e is not None]
        for o, t in enumerate(op.outputs):
            out = pieces[0].outputs[o]
            if out.partial_levels:
                self.partial[t] = (out.partial_levels, out.reducer)

    def _controls(self, op, d: int) -> list[str]:
        """What op's piece on device d waits for: its control inputs' pieces on d, and
        for each other device holding some, one gate there that waits for them (one
        cross-device edge per device, not one per piece)."""
        local, remote = [], {}
        for name in op.control_inputs:
            for c in self.pieces.get(name, ()):
                e = self.device_of[c]
                (local.append(c) if e == d else remote.setdefault(e, []).append(c))
        return local + [self._gate(op.control_inputs, e, names)
                        for e, names in sorted(remote.items())]

    def _gate(self, key: tuple[str, ...], e: int, names: list[str]) -> str:
        """A NoOp on device e waiting for `names` (e's pieces of the ops in `key`)."""
        if len(names) == 1:
            return names[0]
        if (key, e) not in self.gates:
            name = self._name("gate")
            self.out.node("NoOp", name, e, (), {}, [], [], names)
            self.gates[(key, e)] = name
        return self.gates[(key, e)]

    def _emit_piece(self, op, node, piece: DeviceOp) -> str | None:
        """The device's local op (its node name; None when it emits no op of its own)."""
        d = piece.device
        if piece.elsewhere:
            return None
        if op.type == "Placeholder":
            return self._emit_feed(op, node, piece)
        if op.type == "VarHandleOp":
            return self._emit_handle(op, node, piece)
        if op.type == "Const":
            return self._emit_const(op, node, piece)
        empty = piece.outputs and not any(nonempty(out.box) for out in piece.outputs)
        if empty or piece.identity:   # an empty part computes nothing; an empty part of a
            for o, t in enumerate(op.outputs):   # reduction holds the reducer's identity
                out = piece.outputs[o]
                fill = 0 if empty or out.reducer is None else reducer_identity(
                    out.reducer, tf.as_dtype(self._dtype(t)).as_numpy_dtype)
                self.produced.setdefault(t, [None] * self.n)[d] = _Value(self._zeros(
                    out.box, t, d, op.name + ("/empty" if empty else "/identity"), fill),
                    out.box)
            return None
        if op.type == "ReadVariableOp" and not own_shard(piece, 0, self.parts.stored[op.inputs[0]][d]):
            value = self._resource_value(op.inputs[0], piece.inputs[0].data, d, op)
            self.produced.setdefault(op.outputs[0], [None] * self.n)[d] = _Value(
                value, piece.outputs[0].box)
            return value.node
        sem = self.entries[op.name].semantics
        if sem.updates:
            piece = narrow_update(op, sem, piece, self.parts.stored)
            if piece is None:
                return None                   # the device stores none of the variable
        inputs = [self._input(op, piece, i, t) for i, t in enumerate(op.inputs)]
        op_type, attrs = piece.op_type, _local_attrs(op, node, piece.attrs)
        if any(t in self.variable_of and reads_values(op.type, piece, i, self.parts.stored[t][d])
               for i, t in enumerate(op.inputs)):
            op_type, attrs, inputs = self._on_values(op, attrs, inputs, d)
        if op_type in _FILTER_GRADIENTS:
            attrs, inputs = self._unit_stride(op, attrs, inputs, piece)
        name = self._name(op.name)
        results = self.out.node(op_type, name, d, inputs, attrs,
                                self._kernel_shapes(op, piece),
                                [self._dtype(t) for t in op.outputs],
                                self._controls(op, d) + self._update_controls(op, piece))
        if op.type == "ReadVariableOp":
            self.reads.setdefault((op.inputs[0], d), []).append(name)
        for o, t in enumerate(op.outputs):
            out = piece.outputs[o]
            result = self._crop(results[o], out.crop, d)
            if out.scale != 1.0:
                scale = self.out.const(out.scale, result.dtype, d, "scale")
                result = self.out.binary("Mul", result, scale, d,
                                         self._name(op.name + "/scale"))
            self.produced.setdefault(t, [None] * self.n)[d] = _Value(result, out.box)
        return name

    def _unit_stride(self, op, attrs: dict, inputs: list[Ref], piece: DeviceOp
                     ) -> tuple[dict, list[Ref]]:
        """A 1x1 filter's gradient with strides > 1 as the same gradient at stride 1 of the
        input's strided subsample (a 1x1 window reads only the pixels the strides land on,
        and neither SAME nor VALID pads it). oneDNN's AVX2 kernel for the strided case
        (jit_1x1:avx2, what TensorFlow's default x86 CPU kernels run on CPUs without
        AVX-512) copies the input to unit stride first and, with fewer input channels than
        its channel block of 8, writes past that workspace: wrong filter gradients (tens of
        percent) and, by thread count, hangs or crashes
        (https://github.com/uxlfoundation/oneDNN/issues/6035). A channel split makes such
        local shapes out of a model's wide shortcut convolutions;
        tests/robustness/test_onednn.py reproduces it. The subsample is 1/stride^2 of the
        input, which the kernel itself would have copied."""
        strides = tuple(attrs["strides"].list.i)
        dilations = tuple(attrs["dilations"].list.i) if "dilations" in attrs else ()
        nhwc = "data_format" not in attrs or attrs["data_format"].s in (b"", b"NHWC")
        window = tuple(self._kernel_shapes(op, piece)[0][:2])
        if (not nhwc or window != (1, 1) or strides[1:3] == (1, 1) or set(dilations) - {1}
                or attrs["padding"].s not in (b"SAME", b"VALID")):
            return attrs, inputs
        sliced = self.out.strided_slice(inputs[0], (1, strides[1], strides[2], 1),
                                        piece.device, self._name(op.name + "/unit_stride"))
        attrs = {**attrs, "strides": attr_value_pb2.AttrValue(
            list=attr_value_pb2.AttrValue.ListValue(i=[1, 1, 1, 1]))}
        return attrs, [sliced, *inputs[1:]]

    def _kernel_shapes(self, op, piece: DeviceOp) -> tuple[tuple[int, ...], ...]:
        if piece.result_shapes is None and op.outputs:
            raise RewriteError(f"the shapes of the local kernel's results on device "
                               f"{piece.device} are unknown.", node=op.name, op_type=op.type,
                               fix="a local op that crops its result needs TensorFlow's "
                                   "shape inference to succeed on it.")
        return piece.result_shapes or ()

    def _update_controls(self, op, piece: DeviceOp) -> list[str]:
        """An in-place update waits for every read of the shard it writes."""
        sem = self.entries[op.name].semantics
        controls = []
        for c in sem.updates:
            controls += self.reads.get((op.inputs[c.alias], piece.device), [])
        return controls

    def _crop(self, tensor: Ref, crop: Box, d: int) -> Ref:
        shape = tensor.shape
        if all(a == 0 and b == n for (a, b), n in zip(crop, shape)) and len(crop) == len(shape):
            return tensor
        return self.out.slice(tensor, crop, d, self._name("crop"))

    # -- inputs ----------------------------------------------------------------------------
    def _input(self, op, piece: DeviceOp, i: int, t: str) -> Ref:
        d = piece.device
        spec = self.graph.tensors[t]
        if t in self.variable_of:
            if reads_values(op.type, piece, i, self.parts.stored[t][d]):
                return self._resource_value(t, piece.inputs[i].data, d, op)
            if not own_shard(piece, i, self.parts.stored[t][d]):
                raise RewriteError(
                    f"input {i} needs the variable region {piece.inputs[i].data} on device "
                    f"{d}, which stores {self.parts.stored[t][d]}.", node=op.name,
                    op_type=op.type, fix="the plan must update a variable where it is stored.")
            return self.handles[(t, d)]
        if i in piece.const_inputs:
            return self.out.const(piece.const_inputs[i], self._dtype(t), d, op.name + "/const")
        read = piece.inputs[i]
        if read is None:
            if t in self.graph.constants:
                return self.out.const(self.graph.constants[t], self._dtype(t), d,
                                      op.name + "/c")
            full = tuple((0, n) for n in spec.shape)
            return self._read(t, full, d, op.name)
        value = self._read(t, read.data, d, op.name) if nonempty(read.data) else None
        if any(p0 or p1 for p0, p1 in read.pads):
            fill = read.fill if read.fill is not None else 0
            if value is None:
                return self.out.fill(read.shape, fill, self._dtype(t), d,
                                     self._name(op.name + "/fill"))
            return self.out.pad(value, read.pads, fill, d, self._name(op.name + "/pad"))
        if value is None:
            return self.out.fill(read.shape, 0, self._dtype(t), d,
                                 self._name(op.name + "/empty"))
        return value

    def _read(self, t: str, box: Box, d: int, op: str) -> Ref:
        """The region `box` of tensor t on device d, from the devices storing it (only
        d's own stored box is materialised when it holds the region)."""
        stored = self.parts.stored[t]
        if stored[d] is not None and contains(stored[d], box):
            return self._cut(self._stored(t, d, op), box, d)
        sources = [self._stored(t, e, op) if stored[e] is not None else None
                   for e in range(self.n)]
        return self._assemble(t, box, d, sources, "fetch", op)

    def _stored(self, t: str, d: int, op: str) -> _Value:
        """Tensor t's stored box on device d (materialised on first use)."""
        key = (t, d)
        if key not in self.stored:
            box = self.parts.stored[t][d]
            if t in self.partial:
                value = self._reduced(t, d, box, op)
            else:
                value = self._assemble(t, box, d, self.produced[t], "convert", op)
            self.stored[key] = _Value(value, box)
        return self.stored[key]

    def _assemble(self, t: str, box: Box, d: int, sources: Sequence[_Value | None],
                  kind: str, op: str, relay: bool = True) -> Ref:
        """`box` of t on device d, cut from the sources (per device) that hold it."""
        return self._assemble_pieces(t, box, d, [(e, s) for e, s in enumerate(sources)
                                                 if s is not None], kind, op, relay)

    def _assemble_pieces(self, t: str, box: Box, d: int, pieces, kind: str,
                         op: str, relay: bool = True) -> Ref:
        """`box` of t on device d from [(device, value)] pieces: d's own where it holds
        the region, else the nearest holder's. A region that is one remote cell arrives in
        an Identity on d (the edge the ledger records exists even if no op on d reads the
        region; several cells meet in a Concat on d). With `relay` (a tensor's value, not a
        variable's, which updates change), the regions devices assembled from remote cells
        earlier are holders too, d's own included: a region crosses a slow outer link once
        per group and spreads over the inner links (rewrite/pricing.py prices the same)."""
        if relay:
            pieces = list(pieces) + [(e, v) for e, values in self.received.get(t, {}).items()
                                     for v in values]
        for e, value in pieces:
            if e == d and contains(value.box, box):
                return self._cut(value, box, d)

        def cell_value(cell: Box) -> Ref:
            found = self._source(cell, d, pieces)
            if found is None:
                raise RewriteError(f"no device holds region {cell} of tensor '{t}'.",
                                   node=op, fix="the plan's states do not cover the tensor.")
            src, value = found
            piece = self._cut(value, cell, src)
            if src != d:
                self.send(kind, t, op, piece, src, d, cell)
                remote[piece.name] = src
            return piece

        def source_key(cell: Box):
            found = self._source(cell, d, pieces)
            return None if found is None else (found[0], id(found[1]))

        remote: dict[str, int] = {}              # remote cells: node name -> its device
        whole = self.tile(t, box, d, [value.box for _, value in pieces], cell_value,
                          source_key)
        if whole.name in remote:
            whole = self.out.identity(whole, d, self._name(t.replace(":", "_") + "/received"))
        if relay and remote:
            self.received.setdefault(t, {}).setdefault(d, []).append(_Value(whole, box))
        return whole

    def send(self, kind: str, t: str, op: str, piece: Ref, src: int, dst: int,
             box: Box) -> None:
        """Record `piece` (of t, region `box`) going from src to dst."""
        shared = (piece.name, dst) in self.sent
        self.sent.add((piece.name, dst))
        self.ledger.add(kind, t, op, src, dst, _bytes(box, self.graph.tensors[t].dtype),
                        shared)

    def tile(self, t: str, box: Box, d: int, boxes: Sequence[Box], cell_value,
             source_key=None) -> Ref:
        """`box` on device d from cells: the grid that the edges of `boxes` cut it into;
        `cell_value(cell)` gives each cell's tensor, concatenated here on device d. With
        `source_key(cell)` (where a cell comes from), neighbouring cells whose sub-grids
        come from the same sources alike are one cell: one slice and one edge per source
        region, not one per grid cell."""
        if not nonempty(box):
            return self._zeros(box, t, d, "empty")
        cuts = [sorted({lo, hi} | {x for b in boxes for x in b[k] if lo < x < hi})
                for k, (lo, hi) in enumerate(box)]
        cells = [list(zip(c[:-1], c[1:])) for c in cuts]

        def layout(axis: int, prefix: list):
            if axis == len(box):
                return source_key(tuple(prefix))
            return tuple(layout(axis + 1, prefix + [c]) for c in cells[axis])

        def merged(axis: int, prefix: list) -> list:
            if source_key is None:
                return cells[axis]
            runs, keys = [], []
            for c in cells[axis]:
                key = layout(axis + 1, prefix + [c])
                if runs and keys[-1] == key:
                    runs[-1] = (runs[-1][0], c[1])
                else:
                    runs.append(c)
                    keys.append(key)
            return runs

        def build(axis: int, prefix: list) -> Ref:
            if axis == len(box):
                return cell_value(tuple(prefix))
            parts = [build(axis + 1, prefix + [c]) for c in merged(axis, prefix)]
            if len(parts) == 1:
                return parts[0]
            return self.out.concat(parts, axis, d,
                                   self._name(t.replace(":", "_") + "/concat"))

        return build(0, [])

    def _source(self, cell: Box, d: int, pieces):
        """(device, value) to read a cell from: d's own if it holds it, else the nearest
        holder's (sharing the longest prefix of level coordinates); None if none."""
        holders = [(e, v) for e, v in pieces if contains(v.box, cell)]
        if not holders:
            return None
        mine = self.coordinates[d]
        return max(holders, key=lambda ev: (ev[0] == d, shared_prefix(self.coordinates[ev[0]], mine),
                                            -ev[0]))

    def _cut(self, value: _Value, box: Box, d: int) -> Ref:
        """`box` (tensor coords) of a value, sliced on device d."""
        if value.box == box:
            return value.tensor
        local = tuple((a - va, b - va) for (a, b), (va, _) in zip(box, value.box))
        return self.out.slice(value.tensor, local, d, self._name("slice"))

    def _zeros(self, box: Box, t: str, d: int, base: str, value=0) -> Ref:
        """`box` of tensor t on device d, holding `value` (zeros unless given)."""
        return self.out.fill(tuple(b - a for a, b in box), value, self._dtype(t), d,
                             self._name(base))

    # -- partial results -------------------------------------------------------------------
    def _reduced(self, t: str, d: int, box: Box, op: str) -> Ref:
        """The stored box of a partial result, from the reduced pieces (collectives)."""
        if t not in self.reduced:
            self.reduced[t] = collectives.reduce_all(self, t, op)
        pieces = [(e, _Value(tensor, piece)) for e, held in self.reduced[t].items()
                  for piece, tensor in held.items()]
        return self._assemble_pieces(t, box, d, pieces, "convert", op)

    def collective_keys(self, group: Sequence[int]) -> tuple[int, int]:
        """(group key, a fresh instance key) for a collective over `group`."""
        group_key = self._group_keys.setdefault(tuple(group), len(self._group_keys) + 1)
        return group_key, next(self._instances)

    def active(self, t: str) -> list[int]:
        """The devices that produced t (its stage's, with pipeline stages)."""
        return [d for d, value in enumerate(self.produced[t]) if value is not None]

    def itemsize(self, t: str) -> int:
        return DTYPE_SIZES.get(self.graph.tensors[t].dtype, 4)

    def plan_states(self, t: str) -> list[str]:
        return [self.plan.state(level, t) for level in range(len(self.plan.levels))]

    # -- sources and variables -------------------------------------------------------------
    def _emit_feed(self, op, node, piece: DeviceOp):
        """The fed placeholder keeps its name on device 0; each device gets its share.
        With sharded feeds, each device has a placeholder of its own share instead."""
        t = op.outputs[0]
        if self.shard_feeds:
            box = piece.outputs[0].box
            value = self.out.node("Placeholder", self._name(op.name), piece.device, (),
                                  _attrs_of_shape(node, box), [tuple(b - a for a, b in box)],
                                  [self._dtype(t)])[0]
            self.produced.setdefault(t, [None] * self.n)[piece.device] = _Value(value, box)
            self.feed_shards.setdefault(t, []).append((value.node + ":0", piece.device, box))
            return None
        if t not in self.fed:
            attrs = {k: v for k, v in node.attr.items() if not k.startswith("_")}
            shape = self.graph.tensors[t].shape
            whole = self.out.node("Placeholder", op.name, 0, (), attrs, [shape],
                                  [self._dtype(t)])[0]
            self.produced[t] = [None] * self.n
            self.fed[t] = _Value(whole, tuple((0, n) for n in shape))
        out = piece.outputs[0]
        value = self._cut(self.fed[t], out.box, 0)
        self.send("feed", t, op.name, value, 0, piece.device, out.box)
        if piece.device:
            value = self.out.identity(value, piece.device, self._name(op.name))
        self.produced[t][piece.device] = _Value(value, out.box)
        return None

    def _emit_const(self, op, node, piece: DeviceOp):
        """A constant holds the device's share of its value."""
        box = piece.outputs[0].box
        value = tf.make_ndarray(node.attr["value"].tensor)
        if value.shape != self.graph.tensors[op.outputs[0]].shape:       # a splat constant
            value = np.broadcast_to(value, self.graph.tensors[op.outputs[0]].shape)
        local = value[tuple(slice(a, b) for a, b in box)]
        created = self.out.const(local, node.attr["dtype"].type, piece.device, op.name)
        self.produced.setdefault(op.outputs[0], [None] * self.n)[piece.device] = _Value(
            created, box)
        return created.node

    def _emit_handle(self, op, node, piece: DeviceOp):
        t = op.outputs[0]
        d = piece.device
        box = self.parts.stored[t][d]
        attrs = _attrs_of_shape(node, box)
        shared = node.attr["shared_name"].s.decode() if "shared_name" in node.attr else ""
        name = self._name(op.name)
        attrs["shared_name"] = attr_value_pb2.AttrValue(
            s=f"{shared or op.name}/tofu_part_{d}".encode())
        handle = self.out.node("VarHandleOp", name, d, (), attrs, [()],
                               [types_pb2.DT_RESOURCE])[0]
        self.handles[(t, d)] = handle
        self.shards[op.name] = self.shards.get(op.name, ()) + (Shard(d, box, name),)
        return name

    def _on_values(self, op, attrs: dict, inputs: list[Ref], d: int
                   ) -> tuple[str, dict, list[Ref]]:
        """The op that reads the variable's values (`_input` read them off the shards)
        in place of the one that reads the variable through its handle (ON_VALUES)."""
        int32 = attr_value_pb2.AttrValue(type=types_pb2.DT_INT32)
        batch_dims = attrs["batch_dims"].i if "batch_dims" in attrs else 0
        axis = self.out.const(batch_dims, types_pb2.DT_INT32, d, op.name + "/axis")
        gather = {"Tparams": attr_value_pb2.AttrValue(type=attrs["dtype"].type),
                  "Tindices": attrs["Tindices"], "Taxis": int32,
                  "batch_dims": attr_value_pb2.AttrValue(i=batch_dims)}
        return ON_VALUES[op.type], gather, list(inputs) + [axis]

    def _resource_value(self, t: str, box: Box, d: int, read_op) -> Ref:
        """The variable's values in `box`, read from the shards that hold them — after
        the read's own control inputs (a read that follows an update sees its result)."""
        sources, op = [], read_op.name
        for e in range(self.n):
            key = ("value", op, t, e)
            box_e = self.parts.stored[t][e]
            if box_e is None:                     # outside the variable's stage
                sources.append(None)
                continue
            if key not in self.stored:
                dtype = dtype_enum(self.variable_of[t].dtype)
                read = self.out.node("ReadVariableOp", self._name("read"), e,
                                     (self.handles[(t, e)],),
                                     {"dtype": attr_value_pb2.AttrValue(type=dtype)},
                                     [tuple(b - a for a, b in box_e)], [dtype],
                                     self._controls(read_op, e))[0]
                self.reads.setdefault((t, e), []).append(read.node)
                self.stored[key] = _Value(read, box_e)
            sources.append(self.stored[key])
        return self._assemble(t, box, d, sources, "fetch", op, relay=False)

    # -- fetches ---------------------------------------------------------------------------
    def _emit_fetch(self, fetch: str, rename: str | None = None) -> str:
        name, index = split_tensor_name(fetch) if ":" in fetch else (fetch, None)
        if index is None:
            self.out.node("NoOp", name, 0, (), {}, [], [],
                          self.pieces.get(name, []) + self.collective_ops)
            return name
        spec = self.graph.tensors[fetch]
        full = tuple((0, n) for n in spec.shape)
        used = fetched_from(self.parts, fetch)
        sources = [self._stored(fetch, e, name) if e in used else None for e in range(self.n)]
        value = self._assemble(fetch, full, 0, sources, "result", name)
        out = self.out.identity(value, 0, rename or (name if index == 0 else f"{name}_{index}"),
                                self.collective_ops)
        return out.node + ":0"


def _result_shapes(graph: Graph, nodes, handles, op_name: str, local, in_shapes):
    """The shapes a local op's kernel returns (TensorFlow's shape inference on a scratch
    graph), or None when they cannot be known here (ops on variable handles)."""
    op = graph.op(op_name)
    if any(t in handles for t in op.inputs):
        return None
    scratch = tf.Graph()
    try:
        with scratch.as_default():
            inputs = []
            for i, t in enumerate(op.inputs):
                dtype = tf.as_dtype(graph.tensors[t].dtype)
                if i in local.const_inputs:
                    inputs.append(tf.constant(np.asarray(local.const_inputs[i]), dtype))
                elif local.input_slices[i] is None and t in graph.constants:
                    inputs.append(tf.constant(graph.constants[t], dtype))
                else:     # the op itself: half the time of tf.compat.v1.placeholder
                    inputs.append(scratch._create_op_internal(
                        "Placeholder", [], dtypes=[dtype], attrs={
                            "dtype": attr_value_pb2.AttrValue(type=dtype.as_datatype_enum),
                            "shape": attr_value_pb2.AttrValue(
                                shape=tf.TensorShape(in_shapes[i]).as_proto())}).outputs[0])
            attrs = _local_attrs(op, nodes[op.copy_of or op_name], local.attrs)
            created = scratch._create_op_internal(local.op_type, inputs, attrs=attrs)
        shapes = [tuple(t.shape.as_list()) if t.shape.is_fully_defined() else None
                  for t in created.outputs]
    except (ValueError, TypeError, tf.errors.OpError):
        return None
    if any(s is None for s in shapes):
        return None
    # in-place updates (after the real outputs) keep the shape of their share
    return shapes + [tuple(b - a for a, b in share) for share in local.output_slices[len(shapes):]]


_FILTER_GRADIENTS = frozenset({"Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter"})
_PLAIN = frozenset({int, float, bool, str, bytes})      # attr values compared with ==


def _attrs_of_shape(node, box: Box) -> dict:
    """The node's AttrValues with its `shape` attr the box's (a shard's placeholder or
    variable handle)."""
    attrs = {k: v for k, v in node.attr.items() if not k.startswith("_")}
    attrs["shape"] = attr_value_pb2.AttrValue(
        shape=tf.TensorShape([b - a for a, b in box]).as_proto())
    return attrs


def _local_attrs(op, node, local_attrs) -> dict:
    """The node's AttrValues with the local op's changed attrs applied (all of them for an
    op written from another's node: its attrs may differ from that node's)."""
    attrs = {key: value for key, value in node.attr.items() if not key.startswith("_")}
    for key, value in local_attrs.items():
        if not op.copy_of and key in op.attrs and _equal(op.attrs.get(key), value):
            continue
        attrs[key] = to_attr_value(node.attr[key] if key in node.attr else None, value)
    return attrs


def _bytes(box: Box, dtype: str) -> int:
    return box_volume(box) * DTYPE_SIZES.get(dtype, 4)


def _equal(a, b) -> bool:
    if type(a) is type(b) and type(a) in _PLAIN:
        return a == b
    try:
        return bool(np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object)))
    except Exception:   # noqa: BLE001 — incomparable values differ
        return False
