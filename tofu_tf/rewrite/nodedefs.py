"""NodeDefs written straight into a GraphDef, with shapes the emitter already knows.

Building an op through `tf.Graph` costs ~0.2 ms (C++ shape inference, Python wrappers, a
device scope per op); a partitioned ResNet has ~10^5 of them. The emitter knows every
local shape from the plan, so `GraphBuilder` writes each NodeDef itself: op type, inputs
(data, then `^control`), device, attrs (the op's registered defaults filled in, as
`tf.Graph` does) and `_output_shapes` (as `as_graph_def(add_shapes=True)` writes it).
Names are `<base>/tofu_<n>` with one counter, so the same calls give the same GraphDef.
Constants (slice bounds, paddings, axes, fill values, collective keys) are one Const per
device and value.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2
from tensorflow.python.framework import op_def_registry

from tofu_tf.rewrite.schedule import chain, merge_barriers

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Ref:
    """One output of an emitted node: the tensor's name as a NodeDef input names it."""
    name: str
    shape: Shape
    dtype: int                         # DataType enum

    @property
    def node(self) -> str:
        return self.name.split(":")[0]


def dtype_enum(dtype) -> int:
    """A dtype name, tf.DType or enum as the DataType enum."""
    return _dtype_enum(dtype) if isinstance(dtype, (str, int)) else dtype.as_datatype_enum


@functools.lru_cache(maxsize=None)
def _dtype_enum(dtype: str | int) -> int:
    return tf.as_dtype(dtype).as_datatype_enum


@functools.lru_cache(maxsize=None)
def type_attr(dtype: int) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(type=dtype)


@functools.lru_cache(maxsize=None)
def _shapes_attr(shapes: tuple[Shape, ...]) -> attr_value_pb2.AttrValue:
    value = attr_value_pb2.AttrValue()
    value.list.SetInParent()
    for shape in shapes:
        proto = value.list.shape.add()
        for size in shape:
            proto.dim.add().size = size
    return value


@functools.lru_cache(maxsize=None)
def _defaults(op_type: str) -> tuple[tuple[str, attr_value_pb2.AttrValue], ...]:
    op_def = op_def_registry.get(op_type)
    if op_def is None:
        return ()
    return tuple((a.name, a.default_value) for a in op_def.attr if a.HasField("default_value"))


def int_attr(value: int) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(i=value)


def str_attr(value: str) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(s=value.encode())


# The types oneDNN's kernels (and so its node merges) serve.
_ONEDNN_TYPES = frozenset({types_pb2.DT_FLOAT, types_pb2.DT_BFLOAT16, types_pb2.DT_HALF})


class GraphBuilder:
    """Appends NodeDefs to `graph_def` in call order (see the module docstring)."""

    def __init__(self, devices: Sequence[str]):
        self.graph_def = graph_pb2.GraphDef()
        self.devices = tuple(devices)
        self._counter = itertools.count()
        self._nodes: list = []                          # the NodeDefs, in graph order
        self._records: tuple[list, list, list, list] = ([], [], [], [])  # names, ops,
        #                                                 devices, inputs (schedule.chain)
        self._consts: dict[tuple, Ref] = {}          # (device, dtype, shape, bytes) -> Const
        self._const_values: dict[str, np.ndarray] = {}          # Const node -> its value

    def name(self, base: str) -> str:
        return f"{base}/tofu_{next(self._counter)}"

    def node(self, op: str, name: str, device: int, inputs: Sequence[Ref | str],
             attrs: Mapping[str, attr_value_pb2.AttrValue], shapes: Sequence[Shape],
             dtypes: Sequence[int], controls: Sequence[str] = ()) -> list[Ref]:
        """A node named `name` on device `device`; its outputs' shapes and dtypes as given.
        `controls`: node names to wait for (repeats and data producers left out)."""
        return self._write(self.graph_def.node.add(), op, name, device, inputs, attrs, shapes,
                           dtypes, controls)

    def detached_node(self, op: str, name: str, device: int, inputs: Sequence[Ref | str],
                      attrs: Mapping[str, attr_value_pb2.AttrValue], shapes: Sequence[Shape],
                      dtypes: Sequence[int]) -> node_def_pb2.NodeDef:
        """A NodeDef as `node` writes it, not in the graph (for `replace_nodes`)."""
        node = node_def_pb2.NodeDef()
        self._write(node, op, name, device, inputs, attrs, shapes, dtypes, (), record=False)
        return node

    def _write(self, node, op, name, device, inputs, attrs, shapes, dtypes, controls,
               record: bool = True) -> list[Ref]:
        node.name, node.op, node.device = name, op, self.devices[device]
        names = [i.name if isinstance(i, Ref) else i for i in inputs]
        producers = {n.split(":")[0] for n in names}
        names += ["^" + c for c in dict.fromkeys(controls) if c not in producers]
        node.input.extend(names)
        if record:
            self._nodes.append(node)
            for column, value in zip(self._records, (name, op, node.device, names)):
                column.append(value)
        for key, value in attrs.items():
            node.attr[key].CopyFrom(value)
        for key, value in _defaults(op):
            if key not in attrs:
                node.attr[key].CopyFrom(value)
        shapes = tuple(tuple(s) for s in shapes)
        node.attr["_output_shapes"].CopyFrom(_shapes_attr(shapes))
        return [Ref(name if o == 0 else f"{name}:{o}", shape, dtype)
                for o, (shape, dtype) in enumerate(zip(shapes, dtypes))]

    def nodes(self) -> list:
        """The NodeDefs, in graph order (edits to them are edits to the graph)."""
        return list(self._nodes)

    def replace_nodes(self, nodes: Sequence, edited: Collection[str]) -> None:
        """The graph's nodes become `nodes` (in that order): this builder's, some with
        their inputs `edited`, and new ones. Constants left out are made anew when asked
        for again."""
        graph_def = graph_pb2.GraphDef()
        graph_def.versions.CopyFrom(self.graph_def.versions)
        graph_def.library.CopyFrom(self.graph_def.library)
        graph_def.node.extend(nodes)
        old = {name: i for i, name in enumerate(self._records[0])}
        records: tuple[list, list, list, list] = ([], [], [], [])
        for node in nodes:
            i = old.get(node.name)
            if i is None or node.name in edited:
                row = (node.name, node.op, node.device, list(node.input))
            else:
                row = tuple(column[i] for column in self._records)
            for column, value in zip(records, row):
                column.append(value)
        self.graph_def, self._nodes, self._records = graph_def, list(graph_def.node), records
        names = set(records[0])
        self._consts = {key: ref for key, ref in self._consts.items() if ref.node in names}
        self._const_values = {k: v for k, v in self._const_values.items() if k in names}

    def const_value(self, name: str) -> np.ndarray | None:
        """The value of a Const this builder made, by node name (None for other nodes)."""
        return self._const_values.get(name)

    @staticmethod
    def output_shape(node, output: int) -> Shape | None:
        """Output `output`'s shape as the node's `_output_shapes` gives it."""
        if "_output_shapes" not in node.attr:    # (reading it would insert an empty one)
            return None
        shapes = node.attr["_output_shapes"].list.shape
        if output >= len(shapes) or shapes[output].unknown_rank:
            return None
        return tuple(d.size for d in shapes[output].dim)

    def chain_devices(self, fetches: Sequence[str]) -> None:
        """Each device's nodes wait for the one before them (`schedule.sequence_devices`,
        in place), with an Identity between the pairs of nodes oneDNN would merge
        (`schedule.merge_barriers`)."""
        names, _, _, inputs = self._records
        index = {name: i for i, name in enumerate(names)}
        for i, k in merge_barriers(*self._records):
            node = self._nodes[i]
            if node.attr["T"].type not in _ONEDNN_TYPES:
                continue
            source, _, output = inputs[i][k].partition(":")
            shape = self._nodes[index[source]].attr["_output_shapes"].list.shape[
                int(output or 0)]
            barrier = self.node("Identity", self.name(node.name + "/barrier"),
                                self.devices.index(node.device), (inputs[i][k],),
                                {"T": node.attr["T"]}, [[d.size for d in shape.dim]],
                                [node.attr["T"].type])[0]
            node.input[k] = inputs[i][k] = barrier.name
        for i, before in chain(*self._records, fetches):
            self._nodes[i].input.append("^" + before)

    # -- constants -------------------------------------------------------------------------
    def const(self, value, dtype: int, device: int, base: str) -> Ref:
        """`value` as a Const on `device`: one node per device, dtype and value, made
        with no control inputs so that sharing it adds no ordering."""
        array = np.asarray(value, dtype=tf.as_dtype(dtype).as_numpy_dtype)
        content = array.tobytes() if array.dtype != object else tuple(array.ravel().tolist())
        key = (device, dtype, array.shape, content)
        if key not in self._consts:
            attrs = {"value": attr_value_pb2.AttrValue(tensor=tf.make_tensor_proto(array)),
                     "dtype": type_attr(dtype)}
            self._consts[key] = self.node("Const", self.name(base), device, (), attrs,
                                          [array.shape], [dtype])[0]
            self._const_values[self._consts[key].node] = array
        return self._consts[key]

    def int32(self, value, device: int) -> Ref:
        return self.const(value, types_pb2.DT_INT32, device, "ints")

    # -- plumbing --------------------------------------------------------------------------
    def slice(self, tensor: Ref, box, device: int, name: str) -> Ref:
        """`box` ([start, stop) per dim, in the tensor's coordinates) of a tensor."""
        begin = tuple(a for a, _ in box)
        size = tuple(b - a for a, b in box)
        attrs = {"T": type_attr(tensor.dtype), "Index": type_attr(types_pb2.DT_INT32)}
        inputs = (tensor, self.int32(begin, device), self.int32(size, device))
        return self.node("Slice", name, device, inputs, attrs, [size], [tensor.dtype])[0]

    def strided_slice(self, tensor: Ref, strides, device: int, name: str) -> Ref:
        """Every `strides[i]`-th element of each dim i, from the first."""
        shape = tuple(-(-n // s) for n, s in zip(tensor.shape, strides))
        attrs = {"T": type_attr(tensor.dtype), "Index": type_attr(types_pb2.DT_INT32)}
        inputs = (tensor, self.int32((0,) * len(strides), device),
                  self.int32(tensor.shape, device), self.int32(tuple(strides), device))
        return self.node("StridedSlice", name, device, inputs, attrs, [shape],
                         [tensor.dtype])[0]

    def concat(self, parts: Sequence[Ref], axis: int, device: int, name: str) -> Ref:
        shape = list(parts[0].shape)
        shape[axis] = sum(p.shape[axis] for p in parts)
        attrs = {"T": type_attr(parts[0].dtype), "N": int_attr(len(parts)),
                 "Tidx": type_attr(types_pb2.DT_INT32)}
        return self.node("ConcatV2", name, device, (*parts, self.int32(axis, device)), attrs,
                         [shape],
                         [parts[0].dtype])[0]

    def identity(self, tensor: Ref, device: int, name: str, controls: Sequence[str] = ()
                 ) -> Ref:
        return self.node("Identity", name, device, (tensor,), {"T": type_attr(tensor.dtype)},
                         [tensor.shape], [tensor.dtype], controls)[0]

    def pad(self, tensor: Ref, pads, fill, device: int, name: str) -> Ref:
        """`tensor` with `pads` ((before, after) per dim) of `fill` around it."""
        paddings = self.int32([list(p) for p in pads], device)
        shape = [n + p0 + p1 for n, (p0, p1) in zip(tensor.shape, pads)]
        attrs = {"T": type_attr(tensor.dtype), "Tpaddings": type_attr(types_pb2.DT_INT32)}
        if fill == 0:
            return self.node("Pad", name, device, (tensor, paddings), attrs, [shape],
                             [tensor.dtype])[0]
        value = self.const(fill, tensor.dtype, device, "fill")
        return self.node("PadV2", name, device, (tensor, paddings, value), attrs, [shape],
                         [tensor.dtype])[0]

    def fill(self, shape: Shape, value, dtype: int, device: int, name: str) -> Ref:
        """A tensor of `shape` holding `value` everywhere (a Const when it is empty)."""
        if not all(shape):
            return self.const(np.full(shape, value), dtype, device, name)
        scalar = self.const(value, dtype, device, "fill")
        attrs = {"T": type_attr(dtype), "index_type": type_attr(types_pb2.DT_INT32)}
        return self.node("Fill", name, device, (self.int32(tuple(shape), device), scalar),
                         attrs, [shape], [dtype])[0]

    def binary(self, op: str, x: Ref, y: Ref, device: int, name: str) -> Ref:
        """An element-wise op of two tensors of x's shape (or y a scalar)."""
        return self.node(op, name, device, (x, y), {"T": type_attr(x.dtype)}, [x.shape],
                         [x.dtype])[0]

    def add_n(self, terms: Sequence[Ref], device: int, name: str) -> Ref:
        attrs = {"T": type_attr(terms[0].dtype), "N": int_attr(len(terms))}
        return self.node("AddN", name, device, terms, attrs, [terms[0].shape],
                         [terms[0].dtype])[0]
