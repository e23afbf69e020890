"""Per-device memory of a GraphDef (partitioned or not): estimated by liveness, measured
from TensorFlow's own allocation records.

The estimate's assumptions:
- schedule: each device runs its ops one at a time in the graph's topological order
  (Kahn's algorithm, ties broken by the order of the nodes in the GraphDef; the emitter
  writes them in the original op order). TensorFlow's executor runs ready ops in parallel,
  so a device's real peak can exceed this by the outputs of concurrent ops;
- allocator: every output is a fresh buffer of its static size, live from its op until the
  last op on that device that reads it (fetched tensors to the end); no in-place reuse, no
  fragmentation;
- persistent: variables (each VarHandleOp's shape) and constants for the whole step;
- communication: a tensor read on another device also takes a receive buffer there, from
  the first to the last reader on that device.
The measurement: a v1 Session run with FULL_TRACE; per device, the peak of the running sum
of its allocation records (in time order), plus the variables and constants, which are
allocated before the step and are not in its trace.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import config_pb2

PERSISTENT_OPS = ("VarHandleOp", "Const")


@dataclass(frozen=True)
class DeviceMemory:
    device: str
    persistent_bytes: int            # variables and constants
    transient_peak_bytes: int        # the step's own buffers at their peak
    peak_op: str                     # the op at which that peak is reached

    @property
    def peak_bytes(self) -> int:
        return self.persistent_bytes + self.transient_peak_bytes


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


def _order(graph: tf.Graph) -> list[tf.Operation]:
    ops = graph.get_operations()
    index = {op: i for i, op in enumerate(ops)}
    preds = {op: {t.op for t in op.inputs} | set(op.control_inputs) for op in ops}
    users: dict[tf.Operation, list] = {op: [] for op in ops}
    for op, ps in preds.items():
        for p in ps:
            users[p].append(op)
    indegree = {op: len(ps) for op, ps in preds.items()}
    ready = [(index[op], op.name) for op in ops if indegree[op] == 0]
    heapq.heapify(ready)
    by_name = {op.name: op for op in ops}
    order = []
    while ready:
        _, name = heapq.heappop(ready)
        op = by_name[name]
        order.append(op)
        for u in users[op]:
            indegree[u] -= 1
            if indegree[u] == 0:
                heapq.heappush(ready, (index[u], u.name))
    return order


def estimate(graph_def: graph_pb2.GraphDef, fetches=(), default_device: str = "",
             ) -> dict[str, DeviceMemory]:
    """The per-device estimate (see the module docstring); nodes without a device count
    on `default_device`."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    order = _order(graph)
    position = {op: i for i, op in enumerate(order)}
    device_of = {op: op.device or default_device for op in order}
    fetched = {graph.as_graph_element(f) for f in fetches}
    fetched = {f.name for f in fetched if isinstance(f, tf.Tensor)}
    last: dict[tuple[str, str], int] = {}            # (tensor, device) -> last reader
    first: dict[tuple[str, str], int] = {}
    for op in order:
        for t in op.inputs:
            key = (t.name, device_of[op])
            last[key] = max(last.get(key, -1), position[op])
            first[key] = min(first.get(key, position[op]), position[op])
    persistent: dict[str, int] = {}
    live: dict[str, int] = {}
    peak: dict[str, tuple[int, str]] = {}
    frees: dict[int, list[tuple[str, int]]] = {}
    end = len(order)
    for op in order:
        here = device_of[op]
        persistent.setdefault(here, 0)
        live.setdefault(here, 0)
        if op.type == "VarHandleOp":
            persistent[here] += _variable_bytes(op)
            continue
        for t in op.inputs:                          # receive buffers for remote tensors
            if device_of[t.op] != here and first[(t.name, here)] == position[op]:
                size = _bytes(t)
                live[here] = live.get(here, 0) + size
                frees.setdefault(last[(t.name, here)], []).append((here, size))
        for t in op.outputs:
            size = _bytes(t)
            if op.type in PERSISTENT_OPS:
                persistent[here] += size
                continue
            live[here] = live.get(here, 0) + size
            stop = end if t.name in fetched else last.get((t.name, here), position[op])
            frees.setdefault(stop, []).append((here, size))
        if live[here] > peak.get(here, (-1, ""))[0]:
            peak[here] = (live[here], op.name)
        for device, size in frees.pop(position[op], []):
            live[device] -= size
    return {d: DeviceMemory(d, persistent.get(d, 0), peak.get(d, (0, ""))[0],
                            peak.get(d, (0, ""))[1])
            for d in sorted(set(persistent) | set(peak))}


def measure(session: tf.compat.v1.Session, fetches, feeds: Mapping,
            persistent: Mapping[str, int]) -> dict[str, int]:
    """Per-device peak bytes of one step run: the running sum of the trace's allocation
    records at its maximum, plus the device's persistent bytes (variables and constants,
    allocated before the step and not in its trace; `persistent_bytes`)."""
    options = config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE)
    metadata = config_pb2.RunMetadata()
    session.run(fetches, feeds, options=options, run_metadata=metadata)
    peaks: dict[str, int] = {}
    for stats in metadata.step_stats.dev_stats:
        records = sorted((r.alloc_micros, r.alloc_bytes) for node in stats.node_stats
                         for memory in node.memory for r in memory.allocation_records)
        running = best = 0
        for _, size in records:
            running += size
            best = max(best, running)
        name = tf.DeviceSpec.from_string(stats.device).to_string()
        peaks[name] = peaks.get(name, 0) + best
    for device, size in persistent.items():
        name = tf.DeviceSpec.from_string(device).to_string()
        peaks[name] = peaks.get(name, 0) + size
    return peaks


def persistent_bytes(graph_def: graph_pb2.GraphDef, default_device: str = ""
                     ) -> dict[str, int]:
    """Per device: its variables' and constants' bytes."""
    return {d: m.persistent_bytes for d, m in estimate(graph_def, (), default_device).items()}
