"""Predicted step time of a plan on a device profile. No TensorFlow.

Per op (what one device runs: the part-0 local op of every cut, `device_problem`):
    time = max(flops / (peak_flops x efficiency), bytes / memory_bandwidth) + op_overhead
where `flops` comes from the op's TDL description — per output element, one per
arithmetic node, times the extent of every reduction around it (a Sum over k of A*B: 2k)
— and `bytes` are the local op's inputs and outputs. Ops without a description count one
flop per output element.
Per level l of the plan, the bytes it moves are spread evenly over the devices, each
moving them over the level's link in α-β fashion:
    time_l = bytes_l / (devices x link_bandwidth_l) + transfers_l / devices x latency_l
Assumptions, stated: computation and communication do not overlap (a device waits for its
inputs; an upper bound on TensorFlow's executor, which overlaps independent ops); devices
run in parallel unless the profile says they share `cores` (logical CPU devices: the
step then takes at least the work of all devices divided by the cores); every kernel
reaches the same fraction of peak (`efficiency`, calibrated on this CPU).

The alternatives the paper compared against (`alternatives`) are predicted from the same
per-op model: Ideal (data parallelism as if memory were unlimited), SmallBatch (data
parallelism with the largest per-device batch that fits; memory and compute scaled
linearly in the batch), Swap (data parallelism with the overflow swapped out and back in
over the host link each step) and OpPlacement (layers spread over the devices in order,
no pipelining: one device busy at a time, activations crossing each boundary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tofu_tf.graph import Graph
from tofu_tf.op_semantics.registry import Semantics
from tofu_tf.search.problem import Problem
from tofu_tf.search.profiles import (GIB, PROFILES, DeviceProfile, expr_flops,  # noqa: F401
                                     flop_bytes, op_bytes, op_flops, step_profile)


@dataclass(frozen=True)
class StepTime:
    compute_seconds: float            # one device's ops
    communication_seconds: float
    seconds: float                    # the step
    flops: float                      # one device's
    ops: int

    def samples_per_second(self, batch: int) -> float:
        return batch / self.seconds


def op_seconds(sem: Semantics, dtypes: list[str], profile: DeviceProfile) -> float:
    return max(op_flops(sem) / (profile.peak_flops * profile.efficiency),
               op_bytes(sem, dtypes) / profile.memory_bandwidth) + profile.op_overhead


def compute_seconds(graph: Graph, device: Problem, profile: DeviceProfile
                    ) -> tuple[float, float, int]:
    """(seconds, flops, ops) of one device's local ops (`device`: recursive.device_problem)."""
    seconds = flops = 0.0
    for op in device.ops:
        dtypes = [device.tensors[t].dtype for t in op.outputs] or ["float32"]
        seconds += op_seconds(op.sem, dtypes, profile)
        flops += op_flops(op.sem)
    return seconds, flops, len(device.ops)


def step_time(graph: Graph, device: Problem, level_bytes, transfers, num_devices: int,
              profile: DeviceProfile, links=None) -> StepTime:
    """The step under a plan: `level_bytes` and `transfers` per level (all devices),
    `links`: per level (bandwidth, latency), else the profile's link for every level."""
    compute, flops, ops = compute_seconds(graph, device, profile)
    links = links or [(profile.link_bandwidth, profile.link_latency)] * len(level_bytes)
    communication = sum(b / (num_devices * bw) + n / num_devices * lat
                        for b, n, (bw, lat) in zip(level_bytes, transfers, links))
    seconds = compute + communication
    if profile.cores is not None and profile.cores < num_devices:
        seconds = max(seconds, compute * num_devices / profile.cores + communication)
    return StepTime(compute, communication, seconds + profile.step_overhead, flops, ops)


def plan_step_time(graph: Graph, result, profile: DeviceProfile,
                   topology_links: bool = False, stages=None) -> StepTime:
    """A SearchResult's step (its last level's model and result give the device's ops);
    with `topology_links`, each level moves its bytes over its own topology level's links
    instead of the profile's. `stages` (op -> stage, search/pipeline.py): the result is
    one stage's devices' plan, and the step is `pipelined_step_time`'s."""
    from tofu_tf.search.recursive import device_problem
    model, last = result.last if result.last is not None else (None, None)
    if model is None:
        raise ValueError("the search result no longer holds its last level")
    device = device_problem(model, last)
    transfers = [len(level.breakdown) * m for level, m in zip(result.levels, result.multipliers)]
    links = ([(level.bandwidth, level.latency) for level in result.topology.levels]
             if topology_links else None)
    if stages:
        return pipelined_step_time(graph, device, result, stages, profile, links)
    return step_time(graph, device, result.bytes_per_level, transfers,
                     result.topology.num_devices, profile, links)


def pipelined_step_time(graph: Graph, device: Problem, result, stages, profile: DeviceProfile,
                        links=None) -> StepTime:
    """The step of a pipeline: `result` plans one stage's devices (`device`: what one of
    them runs of every op), `stages` says which stage runs each op. Every stage's devices
    run its ops in the graph's order (the order the emitter chains them in), an op
    starting when the stage is free and its inputs have arrived; an op's time is its local
    kernel's plus its share of the bytes the plan moves for it inside the stage (α-β over
    the stage's devices, as `step_time` spreads them); a tensor crossing stages arrives
    after its local part's bytes over the link plus the latency. The step ends with the
    last op. (One stage is `step_time` without its overlap-free sum: the same figures in
    sequence.) Devices sharing `profile.cores` take at least all devices' work over them."""
    per_stage = result.topology.num_devices
    count = max(stages.values()) + 1
    links = links or [(profile.link_bandwidth, profile.link_latency)] * len(result.levels)
    moved: dict[str, float] = {}
    for level, m, (bandwidth, latency) in zip(result.levels, result.multipliers, links):
        for op, _, nbytes in level.breakdown:
            moved[op] = moved.get(op, 0.0) + m * (nbytes / bandwidth + latency) / per_stage
    local = {op.name: op for op in device.ops}
    finish: dict[str, float] = {}
    free, kernels, flops = [0.0] * count, [0.0] * count, [0.0] * count
    for op in graph:
        stage = stages.get(op.name)
        if stage is None:
            finish[op.name] = 0.0
            continue
        ready = 0.0
        for t in op.inputs:
            producer = graph.producer(t).name
            arrive = finish.get(producer, 0.0)
            if stages.get(producer, stage) != stage and t in device.tensors:
                spec = device.tensors[t]
                arrive += (math.prod(spec.shape) * spec.itemsize / profile.link_bandwidth
                           + profile.link_latency)
            ready = max(ready, arrive)
        seconds = moved.get(op.name, 0.0)
        found = local.get(op.name)
        if found is not None:
            dtypes = [device.tensors[t].dtype for t in found.outputs] or ["float32"]
            kernel = op_seconds(found.sem, dtypes, profile)
            seconds += kernel
            kernels[stage] += kernel
            flops[stage] += op_flops(found.sem)
        finish[op.name] = free[stage] = max(ready, free[stage]) + seconds
    makespan = max(free)
    if profile.cores is not None and profile.cores < per_stage * count:
        makespan = max(makespan, sum(kernels) * per_stage / profile.cores)
    busiest = max(range(count), key=kernels.__getitem__)
    return StepTime(kernels[busiest], makespan - kernels[busiest],
                    makespan + profile.step_overhead, flops[busiest],
                    sum(1 for op in local if stages.get(op) == busiest))


def single_step_time(graph: Graph, profile: DeviceProfile) -> StepTime:
    """The unpartitioned step on one device."""
    from tofu_tf.op_semantics.catalog import catalog
    entries = catalog(graph)
    seconds = flops = 0.0
    ops = 0
    for op in graph:
        sem = entries[op.name].semantics
        if sem is None:
            continue
        dtypes = [graph.tensors[t].dtype for t in op.outputs] or ["float32"]
        seconds += op_seconds(sem, dtypes, profile)
        flops += op_flops(sem)
        ops += 1
    return StepTime(seconds, 0.0, seconds + profile.step_overhead, flops, ops)


# -- the alternatives --------------------------------------------------------------------

@dataclass(frozen=True)
class Alternative:
    name: str
    samples_per_second: float | None      # None: cannot run (out of memory)
    peak_bytes: int | None = None
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Placement:
    """Layers spread over devices in order. A layer is what reads one variable: the
    variables, in the order the forward pass first reads them, are cut into `devices`
    contiguous runs of equal forward flops; a forward op goes with the variable it reads,
    else with its first placed input; a gradient op with its forward op; anything else
    with its first placed input, and a source with its first reader. What crosses
    devices is sent once to each other device that reads it."""
    boundary_bytes: float
    crossings: int
    peak_bytes: int                     # the largest device's variables + transient share


def op_placement(graph: Graph, num_devices: int, single_peak: int, single_persistent: int
                 ) -> Placement:
    from tofu_tf.graph import Role, split_tensor_name
    from tofu_tf.op_semantics.catalog import catalog
    entries = catalog(graph)
    forward = [op for op in graph if op.role is Role.FORWARD]
    variable_of = {r: v.name for v in graph.variables.values() for r in v.read_ops}

    def reads(op) -> str | None:
        for t in op.inputs:
            name = split_tensor_name(t)[0]
            if name in variable_of:
                return variable_of[name]
        return None

    work: dict[str, float] = {}                        # variable -> its forward flops
    for op in forward:
        variable = reads(op)
        if variable is not None and entries[op.name].semantics is not None:
            work[variable] = work.get(variable, 0.0) + op_flops(entries[op.name].semantics)
    total, acc, run = sum(work.values()) or 1.0, 0.0, {}
    for variable, flops in work.items():               # dicts keep first-use order
        run[variable] = min(int(acc / total * num_devices), num_devices - 1)
        acc += flops
    for op in forward:
        variable = reads(op)
        if variable is not None:
            run[op.name] = run[variable]
    for op in graph:
        if op.name in run:
            continue
        if op.forward_op in run:
            run[op.name] = run[op.forward_op]
            continue
        placed = [run[split_tensor_name(t)[0]] for t in op.inputs
                  if split_tensor_name(t)[0] in run]
        if placed:
            run[op.name] = placed[0]
    for op in graph:                                   # sources: their first reader's
        if op.name not in run:
            readers = [run[c.name] for t in op.outputs for c in graph.consumers(t)
                       if c.name in run]
            run[op.name] = readers[0] if readers else 0
    sent, crossings = 0.0, 0
    for op in graph:
        for t in op.outputs:
            readers = {run[c.name] for c in graph.consumers(t)} - {run[op.name]}
            crossings += len(readers)
            sent += len(readers) * graph.tensor(t).num_bytes
    held = [0] * num_devices
    for v in graph.variables.values():
        held[run[v.name]] += v.num_bytes
    transient = single_peak - single_persistent
    return Placement(sent, crossings, int(max(held) + transient / num_devices))


def alternatives(*, batch: int, num_devices: int, profile: DeviceProfile,
                 single: StepTime, dp: StepTime, dp_peak: int, dp_persistent: int,
                 placement: Placement) -> list[Alternative]:
    """Ideal, SmallBatch, Swap and OpPlacement (module docstring) from the unpartitioned
    step, the data-parallel plan (its step, peak and persistent bytes per device) and the
    op placement."""
    capacity = profile.memory_bytes
    out = [Alternative("Ideal", batch / dp.seconds, dp_peak)]
    # SmallBatch: per-device batch b of batch / devices; activations and compute ~ b.
    per_device = max(batch // num_devices, 1)
    small = None
    for b in range(per_device, 0, -1):
        peak = dp_persistent + (dp_peak - dp_persistent) * b / per_device
        if peak <= capacity:
            seconds = dp.compute_seconds * b / per_device + dp.communication_seconds
            small = Alternative("SmallBatch", b * num_devices / seconds, int(peak),
                                {"per_device_batch": b})
            break
    out.append(small or Alternative("SmallBatch", None, int(dp_persistent)))
    # Swap: the overflow out and back in over the host link, every step.
    if dp_persistent > capacity:
        out.append(Alternative("Swap", None, dp_peak, {"reason": "weights alone overflow"}))
    else:
        overflow = max(dp_peak - capacity, 0)
        seconds = dp.seconds + 2 * overflow / profile.host_bandwidth
        out.append(Alternative("Swap", batch / seconds, dp_peak, {"swapped_bytes": overflow}))
    # OpPlacement: one device busy at a time.
    if placement.peak_bytes > capacity:
        out.append(Alternative("OpPlacement", None, placement.peak_bytes))
    else:
        seconds = (single.seconds + placement.boundary_bytes / profile.link_bandwidth
                   + placement.crossings * profile.link_latency)
        out.append(Alternative("OpPlacement", batch / seconds, placement.peak_bytes))
    return out
