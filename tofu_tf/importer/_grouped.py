"""Grouped convolutions as ops that TensorFlow's CPU kernels run and the descriptions know.

A convolution with G groups reads a filter of Cin / G input channels: output channel o
sees only the input channels of its group o // (Cout / G). Keras builds Conv1D/2D/3D
(groups=G) that way and compiles the layer with XLA (TensorFlow's CPU kernels have no
gradients for it); once the call is inlined (_inline), `ungroup` rewrites every grouped
Conv2D, Conv3D and their input and filter gradients, keeping each node's name on the op
that gives its output:

  depthwise     (G = Cin, NHWC, no dilation): DepthwiseConv2dNative, ..BackpropInput or
                ..BackpropFilter; the filter [h, w, 1, Cout] and the depthwise filter
                [h, w, Cin, Cout / Cin] hold the same elements in the same order
                (o = c * (Cout / Cin) + m), so a Reshape passes between them
  other         the channels split into G groups (Split), one ungrouped op per group, the
                results joined (ConcatV2): the input's and output's channels, the
                filter's output channels

The rewritten ops compute what the grouped op computes, in the same order per element.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from tofu_tf.importer._normalise import _output_index, _rebuild, const_node, node_of

# op -> (role of each input: "data" (channels last or at the format's channel axis),
#        "filter", "sizes" (a shape the op is told), the output's role)
_GROUPED = {
    "Conv2D": (("data", "filter"), "data"),
    "Conv3D": (("data", "filter"), "data"),
    "Conv2DBackpropInput": (("sizes", "filter", "data"), "data"),
    "Conv3DBackpropInputV2": (("sizes", "filter", "data"), "data"),
    "Conv2DBackpropFilter": (("data", "sizes", "data"), "filter"),
    "Conv3DBackpropFilterV2": (("data", "sizes", "data"), "filter"),
}
_DEPTHWISE = {"Conv2D": "DepthwiseConv2dNative",
              "Conv2DBackpropInput": "DepthwiseConv2dNativeBackpropInput",
              "Conv2DBackpropFilter": "DepthwiseConv2dNativeBackpropFilter"}
_DEPTHWISE_ATTRS = ("T", "strides", "padding", "explicit_paddings", "data_format", "dilations")

Shapes = dict[str, list]


def ungroup(graph_def: graph_pb2.GraphDef, shapes: Shapes) -> graph_pb2.GraphDef:
    """`graph_def` with every grouped convolution rewritten (the module docstring);
    `shapes` (op name -> [(shape, dtype name)]) gains the new nodes. Returns `graph_def`
    itself when none is grouped."""
    replacements: dict[str, list[node_def_pb2.NodeDef]] = {}
    for node in graph_def.node:
        grouping = _grouping(node, shapes)
        if grouping is not None:
            replacements[node.name] = _rewritten(node, *grouping, shapes)
    if not replacements:
        return graph_def
    return _rebuild(graph_def, replacements, {})


def _shape(tensor: str, shapes: Shapes) -> tuple[int, ...] | None:
    return shapes[node_of(tensor)][_output_index(tensor)][0]


def _static(shape) -> bool:
    return shape is not None and -1 not in shape


def _channel_axis(node: node_def_pb2.NodeDef, rank: int) -> int:
    data_format = node.attr["data_format"].s.decode() if "data_format" in node.attr else ""
    return 1 if data_format.startswith("NC") else rank - 1


def _grouping(node: node_def_pb2.NodeDef, shapes: Shapes) -> tuple[int, tuple, tuple] | None:
    """(G, a data-shaped tensor's shape, the filter's shape) of a grouped convolution
    (its input channels over the filter's, G > 1); None for any other node."""
    if node.op not in _GROUPED or node.name not in shapes:
        return None
    roles, out_role = _GROUPED[node.op]
    inputs = [i for i in node.input if not i.startswith("^")]
    out = shapes[node.name][0][0]
    data = out if out_role == "data" else _shape(inputs[roles.index("data")], shapes)
    kernel = out if out_role == "filter" else _shape(inputs[roles.index("filter")], shapes)
    # The input's channels: the output's for a backprop-input, else the first data input.
    source = data if roles[0] == "sizes" else _shape(inputs[0], shapes)
    if not (_static(data) and _static(kernel) and _static(source)) or not kernel[-2]:
        return None
    channels = source[_channel_axis(node, len(source))]
    if channels == kernel[-2]:
        return None
    return channels // kernel[-2], data, kernel


def _rewritten(node: node_def_pb2.NodeDef, groups: int, data: tuple, kernel: tuple,
               shapes: Shapes) -> list[node_def_pb2.NodeDef]:
    depthwise = (node.op in _DEPTHWISE and kernel[-2] == 1
                 and _channel_axis(node, len(data)) == len(data) - 1
                 and all(d == 1 for d in node.attr["dilations"].list.i))
    if depthwise:
        return _as_depthwise(node, kernel, groups, shapes)
    return _per_group(node, groups, shapes)


def _as_depthwise(node: node_def_pb2.NodeDef, kernel: Sequence[int], channels: int,
                  shapes: Shapes) -> list[node_def_pb2.NodeDef]:
    """The depthwise op on the filter reshaped [h, w, 1, Cout] <-> [h, w, Cin, M]."""
    roles, out_role = _GROUPED[node.op]
    inputs = [i for i in node.input if not i.startswith("^")]
    controls = [i for i in node.input if i.startswith("^")]
    dtype = shapes[node.name][0][1]
    h, w, _, out = kernel
    depthwise_shape = (h, w, channels, out // channels)
    made: list[node_def_pb2.NodeDef] = []
    op_inputs = list(inputs)
    if out_role == "filter":                       # the filter's gradient: told its shape
        made.append(_const(f"{node.name}/depthwise_sizes", np.array(depthwise_shape, np.int32),
                           shapes))
        op_inputs[roles.index("sizes")] = made[-1].name
    else:
        made.append(_const(f"{node.name}/depthwise_shape", np.array(depthwise_shape, np.int32),
                           shapes))
        made.append(_reshape(f"{node.name}/depthwise_filter", inputs[roles.index("filter")],
                             made[-1].name, node, depthwise_shape, dtype, shapes))
        op_inputs[roles.index("filter")] = made[-1].name
    op_name = node.name if out_role == "data" else f"{node.name}/depthwise"
    op = node_def_pb2.NodeDef(name=op_name, op=_DEPTHWISE[node.op], device=node.device)
    op.input.extend(op_inputs + controls)
    for key in _DEPTHWISE_ATTRS:
        if key in node.attr:
            op.attr[key].CopyFrom(node.attr[key])
    made.append(op)
    if out_role == "filter":
        shapes[op_name] = [(depthwise_shape, dtype)]
        made.append(_const(f"{node.name}/grouped_shape", np.array(kernel, np.int32), shapes))
        made.append(_reshape(node.name, op_name, made[-1].name, node, tuple(kernel), dtype,
                             shapes))
    return made


def _per_group(node: node_def_pb2.NodeDef, groups: int, shapes: Shapes
               ) -> list[node_def_pb2.NodeDef]:
    """Split, one ungrouped op per group, ConcatV2."""
    roles, out_role = _GROUPED[node.op]
    inputs = [i for i in node.input if not i.startswith("^")]
    controls = [i for i in node.input if i.startswith("^")]
    out_shape, dtype = shapes[node.name][0]
    made: list[node_def_pb2.NodeDef] = []
    pieces: list[list[str]] = []
    for index, (tensor, role) in enumerate(zip(inputs, roles)):
        if role == "sizes":
            whole = out_shape
            axis = _axis(node, whole, out_role)
            size = np.array(whole, _shape_dtype(tensor, shapes))
            size[axis] //= groups
            made.append(_const(f"{node.name}/group_sizes", size, shapes))
            pieces.append([made[-1].name] * groups)
            continue
        whole = _shape(tensor, shapes)
        axis = _axis(node, whole, role)
        made.append(_const(f"{node.name}/split_axis_{index}", np.array(axis, np.int32), shapes))
        split = node_def_pb2.NodeDef(name=f"{node.name}/split_{index}", op="Split",
                                     device=node.device)
        split.input.extend([made[-1].name, tensor] + controls)
        split.attr["num_split"].i = groups
        split.attr["T"].type = tf.as_dtype(dtype).as_datatype_enum
        piece = list(whole)
        piece[axis] //= groups
        shapes[split.name] = [(tuple(piece), dtype)] * groups
        made.append(split)
        pieces.append([f"{split.name}:{g}" for g in range(groups)])
    piece_shape = list(out_shape)
    out_axis = _axis(node, out_shape, out_role)
    piece_shape[out_axis] //= groups
    names = []
    for g in range(groups):
        op = node_def_pb2.NodeDef(name=f"{node.name}/group_{g}", op=node.op, device=node.device)
        op.input.extend([p[g] for p in pieces])
        for key, value in node.attr.items():
            op.attr[key].CopyFrom(value)
        shapes[op.name] = [(tuple(piece_shape), dtype)]
        made.append(op)
        names.append(op.name)
    made.append(_const(f"{node.name}/concat_axis", np.array(out_axis, np.int32), shapes))
    concat = node_def_pb2.NodeDef(name=node.name, op="ConcatV2", device=node.device)
    concat.input.extend(names + [made[-1].name])
    concat.attr["N"].i = groups
    concat.attr["T"].type = tf.as_dtype(dtype).as_datatype_enum
    concat.attr["Tidx"].type = tf.int32.as_datatype_enum
    made.append(concat)
    return made


def _axis(node: node_def_pb2.NodeDef, shape: Sequence[int], role: str) -> int:
    """The axis a tensor of `role` splits into groups on: a data tensor's channels, the
    filter's output channels (the last axis)."""
    return len(shape) - 1 if role == "filter" else _channel_axis(node, len(shape))


def _shape_dtype(tensor: str, shapes: Shapes) -> str:
    """The dtype of a shape input (int32 or int64)."""
    return shapes[node_of(tensor)][_output_index(tensor)][1]


def _const(name: str, value: np.ndarray, shapes: Shapes) -> node_def_pb2.NodeDef:
    shapes[name] = [(tuple(value.shape), value.dtype.name)]
    return const_node(name, tf.make_tensor_proto(value))


def _reshape(name: str, tensor: str, shape_node: str, like: node_def_pb2.NodeDef,
             shape: tuple[int, ...], dtype: str, shapes: Shapes) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op="Reshape", device=like.device)
    node.input.extend([tensor, shape_node])
    node.attr["T"].type = tf.as_dtype(dtype).as_datatype_enum
    node.attr["Tshape"].type = tf.int32.as_datatype_enum
    shapes[name] = [(shape, dtype)]
    return node
