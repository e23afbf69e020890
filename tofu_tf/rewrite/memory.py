"""Per-device memory of a GraphDef (partitioned or not): estimated by liveness, measured
from TensorFlow's own allocation records.

The estimate is `tofu_tf.liveness` (its docstring states the model) over the graph's nodes
in `schedule.execution_order` (each device runs its nodes in the graph's topological
order, ties broken by the GraphDef's order; the emitter chains each device's nodes with
control edges so that TensorFlow keeps it). Devices are
`shared_memory` when every device is a CPU (logical CPU devices share the process's
memory, a cross-device edge passes the buffer itself).

The measurement: a v1 Session run with FULL_TRACE; per device, the peak of the running sum
of its allocation records (in time order), plus the variables, constants and feeds, which
are allocated before the step and are not in its trace.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import config_pb2

from tofu_tf._tf_graph import LazyGraph
from tofu_tf.liveness import (ALIASING, FORWARDING, DeviceMemory, Node,
                              conv_grad_scratch, peaks, slice_is_view,
                              split_is_view)
from tofu_tf.importer import _inline, _normalise
from tofu_tf.errors import TofuError
from tofu_tf.rewrite.schedule import execution_order

__all__ = ["DeviceMemory", "estimate", "measure", "persistent_bytes"]

PERSISTENT_OPS = ("VarHandleOp", "Const", "Placeholder")


def _bytes(tensor: tf.Tensor) -> int:
    if tensor.dtype == tf.resource or tensor.dtype == tf.variant:
        return 0
    if not tensor.shape.is_fully_defined():
        return 0
    return int(np.prod(tensor.shape.as_list(), dtype=np.int64)) * tensor.dtype.size


def _variable_bytes(op: tf.Operation) -> int:
    shape = op.get_attr("shape")
    return int(np.prod(tf.TensorShape(shape).as_list(), dtype=np.int64)) * \
        tf.as_dtype(op.get_attr("dtype")).size


def _view_of(op: tf.Operation) -> int | None:
    if op.type in ALIASING:
        return 0
    if op.type == "Slice" and op.inputs[0].shape.is_fully_defined():
        begin, size = (tf.get_static_value(t) for t in op.inputs[1:3])
        if begin is not None and size is not None and slice_is_view(
                op.inputs[0].shape.as_list(), list(begin), list(size),
                op.inputs[0].dtype.size):
            return 0
    if op.type in ("Split", "SplitV"):
        data, axis = (1, 0) if op.type == "Split" else (0, 2)
        axis = tf.get_static_value(op.inputs[axis])
        shape = op.inputs[data].shape
        if axis is not None and shape.is_fully_defined() and split_is_view(
                shape.as_list(), [t.shape[int(axis)] for t in op.outputs], int(axis),
                op.inputs[data].dtype.size):
            return data
    return None


def _scratch(op: tf.Operation) -> int:
    """The CPU convolution gradients' im2col buffer (liveness.conv_grad_scratch)."""
    if op.type not in ("Conv2DBackpropInput", "Conv2DBackpropFilter"):
        return 0
    filter_shape = (op.outputs[0] if op.type == "Conv2DBackpropFilter" else op.inputs[1]).shape
    grad = op.inputs[2].shape
    if not (filter_shape.is_fully_defined() and grad.is_fully_defined()):
        return 0
    channels_last = op.get_attr("data_format") in (b"NHWC", "NHWC")
    spatial = grad.as_list()[1:3] if channels_last else grad.as_list()[2:4]
    return conv_grad_scratch(filter_shape.as_list(), spatial, op.outputs[0].dtype.size)


def _node(op: tf.Operation, device: str, cpu: bool) -> Node:
    outputs = tuple((t.name, _bytes(t), t.dtype.name) for t in op.outputs)
    inputs = tuple(t.name for t in op.inputs)
    if op.type in PERSISTENT_OPS:
        return Node(op.name, device, inputs, outputs, persistent=True,
                    persistent_bytes=_variable_bytes(op) if op.type == "VarHandleOp" else 0)
    forwards = tuple(range(len(inputs))) if op.type in FORWARDING else ()
    return Node(op.name, device, inputs, outputs, view_of=_view_of(op), forwards=forwards,
                scratch_bytes=_scratch(op) if cpu else 0)


def _names(fetches) -> list[str]:
    return [f.name if hasattr(f, "name") else f for f in fetches]


def estimate(graph_def: graph_pb2.GraphDef, fetches=(), default_device: str = "",
             explain: int = 0) -> dict[str, DeviceMemory]:
    """The per-device estimate (see the module docstring) of a step that fetches
    `fetches` (all nodes run if none given); nodes without a device count on
    `default_device`. `explain`: list that many of the largest buffers at each peak.
    Function calls count as the ops of their bodies (inlined first)."""
    if _normalise.calls_functions(graph_def) and _inline.inlinable(graph_def):
        graph_def = _inline.inline_calls(
            graph_def, keep=set(_normalise.fetch_node_names(_names(fetches))))
    graph = LazyGraph(graph_def)
    order = [graph.get_operation_by_name(graph_def.node[i].name)
             for i in execution_order(graph_def, _names(fetches))]
    cpu = {d: "GPU" not in d.upper()
           for d in {op.device or default_device for op in order}}
    fetched = {graph.as_graph_element(f) for f in fetches}
    fetched = {f.name for f in fetched if isinstance(f, tf.Tensor)}
    nodes = [_node(op, op.device or default_device, cpu[op.device or default_device])
             for op in order]
    shared = all(cpu.values())
    return peaks(nodes, fetched, shared_memory=shared, explain=explain)


def measure(session: tf.compat.v1.Session, fetches, feeds: Mapping,
            persistent: Mapping[str, int]) -> dict[str, int]:
    """Per-device peak bytes of one step run: the running sum of the trace's allocation
    records at its maximum, plus the device's persistent bytes (variables and constants,
    allocated before the step and not in its trace; `persistent_bytes`). TensorFlow's
    oneDNN CPU kernels keep their buffers out of those records (a WResNet step's records
    hold a tenth of what it allocates): with them on, a TofuError instead of a low number."""
    options = config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE)
    metadata = config_pb2.RunMetadata()
    session.run(fetches, feeds, options=options, run_metadata=metadata)
    from tensorflow.python.util import _pywrap_util_port
    if _pywrap_util_port.IsMklEnabled() and any(
            "CPU" in stats.device.upper() for stats in metadata.step_stats.dev_stats):
        raise TofuError("TensorFlow's oneDNN CPU kernels are on: their buffers can be missing "
                        "from the step trace's allocation records, so the measured peak "
                        "would be too low.",
                        fix="measure with TF_ENABLE_ONEDNN_OPTS=0 set before TensorFlow is "
                            "imported; the estimate (`estimate`) does not depend on it.")
    result: dict[str, int] = {}
    for stats in metadata.step_stats.dev_stats:
        records = sorted((r.alloc_micros, r.alloc_bytes) for node in stats.node_stats
                         for memory in node.memory for r in memory.allocation_records)
        records = sorted(records + _adoptions(session.graph, stats))
        running = best = 0
        for _, size in records:
            running += size
            best = max(best, running)
        name = tf.DeviceSpec.from_string(stats.device).to_string()
        result[name] = result.get(name, 0) + best
    for device, size in persistent.items():
        name = tf.DeviceSpec.from_string(device).to_string()
        result[name] = result.get(name, 0) + size
    return result


def _adoptions(graph: tf.Graph, stats) -> list[tuple[int, int]]:
    """(time, -bytes) of the variable buffers an AssignVariableOp replaced by adopting its
    value's buffer (TensorFlow does when it is the value's last reader): the adopted buffer
    stays allocated in the trace, the old one is freed without a record (it was allocated
    before the step), so without these the running sum would count both."""
    held: dict[str, int] = {}                # node -> bytes it allocated and never freed
    for node in stats.node_stats:
        for memory in node.memory:
            for r in memory.allocation_records:
                held[node.node_name] = held.get(node.node_name, 0) + r.alloc_bytes
    frees = []
    for node in stats.node_stats:
        try:
            op = graph.get_operation_by_name(node.node_name)
        except (KeyError, ValueError):
            continue
        if op.type != "AssignVariableOp":
            continue
        size = _bytes(op.inputs[1])
        source = op.inputs[1].op
        while held.get(source.name, 0) <= 0 and (source.type in FORWARDING
                                                 or source.type in ALIASING) and source.inputs:
            source = max((t.op for t in source.inputs), key=lambda o: held.get(o.name, 0))
        if size and held.get(source.name, 0) >= size:
            held[source.name] -= size
            end = node.all_start_micros + node.all_end_rel_micros
            frees.append((end, -size))
    return frees


def persistent_bytes(graph_def: graph_pb2.GraphDef, default_device: str = ""
                     ) -> dict[str, int]:
    """Per device: the bytes of its variables, constants and feeds."""
    return {d: m.persistent_bytes for d, m in estimate(graph_def, (), default_device).items()}
