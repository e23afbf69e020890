"""Per-device peak memory of a plan, before any graph is emitted. No TensorFlow.

The model is `tofu_tf.liveness` over the planner graph's ops in its order, run on one
device: part 0 of every cut (the largest part; the recursion's groups are alike). What
the device holds of each tensor is its stored part after every level (`device_problem`:
the problem inside part 0 of the last cut). An op whose local input is not exactly the
stored part reads an assembled copy (what the other devices sent, plus its own part),
live while the op runs; an op whose local output is larger than the stored part (a
partial sum, a replicated computation) holds that whole output until it is reduced or cut
down. These two stand in for the communication buffers of the emitted graph. A fed tensor
is held whole: device 0 takes the whole feed and sends the other parts (with
`Options.shard_feeds` each device takes its part, and the estimate is that much high).

`single_device_peak` is the same model on the unpartitioned graph. `tofu_tf.rewrite.memory`
gives the emitted graph's per-device figures, and the tests hold the two close.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping

from tofu_tf.graph import DTYPE_SIZES, Graph, Role
from tofu_tf.liveness import ALIASING, FORWARDING, Node, conv_grad_scratch, peaks
from tofu_tf.search.problem import Problem, TensorSpec

PERSISTENT_ROLES = (Role.VARIABLE, Role.CONSTANT, Role.INPUT)
CONV_GRADS = ("Conv2DBackpropInput", "Conv2DBackpropFilter")


@dataclass(frozen=True)
class PlanMemory:
    """One device's estimate under a plan (or on one device, unpartitioned)."""
    persistent_bytes: int          # its parts of the variables, slots, constants, feeds
    transient_peak_bytes: int
    peak_op: str
    peak_buffers: tuple[tuple[str, int], ...] = ()   # the largest, with `explain`

    @property
    def peak_bytes(self) -> int:
        return self.persistent_bytes + self.transient_peak_bytes


def _bytes(shape, dtype: str) -> int:
    return math.prod(shape) * DTYPE_SIZES.get(dtype, 4)


def plan_memory(graph: Graph, device: Problem, cpu: bool = True, explain: int = 0,
                stages: Mapping[str, int] | None = None) -> PlanMemory:
    """The part-0 device's estimate; `device` is the problem inside part 0 of the last
    cut (recursive.device_problem). `cpu`: model the CPU kernels' scratch. `stages`
    (pipeline stages, search/pipeline.py: op -> stage): the largest estimate of one stage's
    devices, each running its stage's ops alone and holding what it receives from the
    others in buffers of its own."""
    local = {op.name: op.sem for op in device.ops}
    return _estimate(graph, device.tensors, local, cpu, explain, stages)


def single_device_peak(graph: Graph, cpu: bool = True, explain: int = 0) -> PlanMemory:
    """The unpartitioned graph on one device."""
    tensors = {name: TensorSpec(name, t.shape, t.dtype) for name, t in graph.tensors.items()}
    return _estimate(graph, tensors, {}, cpu, explain)


def stage_peaks(graph: Graph, stages: Mapping[str, int], cpu: bool = True) -> list[int]:
    """Per pipeline stage, the unpartitioned graph's peak of the ops it runs (each stage on
    one device, receiving what it reads from the others): what `assign_stages` balances,
    since the levels below cut every stage's tensors alike."""
    tensors = {name: TensorSpec(name, t.shape, t.dtype) for name, t in graph.tensors.items()}
    found = _peaks(graph, tensors, {}, cpu, 0, stages)
    return [found[str(s)].peak_bytes if str(s) in found else 0
            for s in range(max(stages.values(), default=0) + 1)]


def _estimate(graph: Graph, tensors, local, cpu: bool, explain: int,
              stages: Mapping[str, int] | None = None) -> PlanMemory:
    found = _peaks(graph, tensors, local, cpu, explain, stages)
    memory = max(found.values(), key=lambda m: (m.peak_bytes, m.device))
    return PlanMemory(memory.persistent_bytes, memory.transient_peak_bytes, memory.peak_op,
                      memory.peak_buffers)


def _peaks(graph: Graph, tensors, local, cpu: bool, explain: int,
           stages: Mapping[str, int] | None):
    nodes = [_node(graph, op, tensors, local.get(op.name), cpu) for op in graph]
    if stages:
        nodes = [dataclasses.replace(node, device=str(_stage(graph, op, stages)))
                 for node, op in zip(nodes, graph)]
    return peaks(nodes, set(graph.fetches), shared_memory=not stages, explain=explain)


def _stage(graph: Graph, op, stages: Mapping[str, int]) -> int:
    """The stage whose devices hold an op's results: a fed tensor arrives whole on device
    0 (stage 0); a constant, which every reader's device holds, counts at its first
    reader's."""
    if op.role is Role.INPUT:
        return 0
    if op.name in stages:
        return stages[op.name]
    readers = [c.name for t in op.outputs for c in graph.consumers(t) if c.name in stages]
    return stages[readers[0]] if readers else 0


def _node(graph: Graph, op, tensors, sem, cpu: bool) -> Node:
    specs = [tensors[t] for t in op.outputs]
    if op.role is Role.INPUT:          # fed whole to device 0, which cuts and sends it
        specs = [TensorSpec(t, graph.tensors[t].shape, graph.tensors[t].dtype)
                 for t in op.outputs]
    if op.role in PERSISTENT_ROLES:
        held = sum(_bytes(s.shape, s.dtype) for s in specs)
        return Node(op.name, "0", op.inputs, tuple((s.name, 0, s.dtype) for s in specs),
                    persistent_bytes=held, persistent=True)
    scratch, exact = 0, True
    if sem is not None:
        for i, t in enumerate(op.inputs):
            stored = tensors[t]
            if i not in sem.meta_inputs and tuple(sem.input_shapes[i]) != stored.shape:
                scratch += _bytes(sem.input_shapes[i], stored.dtype)
                exact = False
        for shape, s in zip(sem.output_shapes, specs):
            if tuple(shape) != s.shape:
                scratch += _bytes(shape, s.dtype)
                exact = False
    if cpu and op.type in CONV_GRADS and op.attr("data_format", "NHWC") in ("NHWC", b"NHWC"):
        ins = sem.input_shapes if sem is not None else [tensors[t].shape for t in op.inputs]
        outs = sem.output_shapes if sem is not None else [s.shape for s in specs]
        filter_shape = outs[0] if op.type == "Conv2DBackpropFilter" else ins[1]
        scratch += conv_grad_scratch(filter_shape, ins[2][1:3],
                                     DTYPE_SIZES.get(specs[0].dtype, 4))
    outputs = tuple((s.name, _bytes(s.shape, s.dtype), s.dtype) for s in specs)
    return Node(op.name, "0", op.inputs, outputs,
                view_of=0 if exact and op.type in ALIASING else None,
                forwards=tuple(range(len(op.inputs))) if exact and op.type in FORWARDING
                else (), scratch_bytes=scratch)
