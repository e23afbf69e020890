"""Pipeline stages: the outermost level of a topology cut into stages (no TensorFlow).

With `Options.pipeline_stages` = S over N devices, the devices form S groups of N / S
(the stage level, outermost), and every op runs on the devices of one group only, its
stage, partitioned over them by the levels below as the search planned them. Each
device then holds its stage's variables, slots and activations alone; tensors that
cross a stage boundary (activations forward, their gradients backward) travel between
the groups as plain cross-device edges, device p of one group to device p of the next.

`assign_stages` decides the stage of every op from the variables, so that a layer's
ops, their gradients and its weights' updates stay together:

1. Variables that one op reads through their handles (a weight and its optimizer slots,
   an update that touches several) are one unit; units are ordered by their first read
   in the forward pass and cut into S runs of about equal bytes: a unit's variables (a
   weight twice: its gradient is as large), and the forward results its backward pass
   reads, computed from its first read to the next unit's (the memory a stage holds for
   the step). The boundaries then move while the largest stage's peak falls (the
   liveness model per stage on the unpartitioned graph, `memory.stage_peaks`: the levels
   below cut every stage's tensors alike).
2. An op that reads a variable's handle (its reads, updates, gathers) runs in the
   variable's stage; any other forward op runs in the latest stage of what it reads, so
   the forward pass only moves forward through the stages.
3. A gradient op runs in its forward op's stage (`Op.forward_op`); the rest (gradient
   sums, fed tensors, shape arithmetic) run in the earliest stage that reads them, or
   else the latest that feeds them. Constants are not staged: every device that reads
   one holds its own copy.

Any assignment is numerically exact (it only places ops), so these rules decide speed
and memory, never the numbers.

Micro-batches: a step that accumulates gradients over M slices of its batch (the model
builders' `micro_batches`) has M copies of each layer's ops, all reading the layer's
weights, so they share its stage. TensorFlow's executor runs an op as soon as its inputs
are ready, so stage s works on micro-batch m + 1 while stage s + 1 works on micro-batch
m (GPipe's schedule: the forward passes of all micro-batches, then their backward passes,
in the order the step wrote them).
"""

from __future__ import annotations

import bisect
import weakref
from typing import Mapping

from tofu_tf.errors import PlanInfeasibleError
from tofu_tf.graph import Graph, Op, Role
from tofu_tf.search.memory import stage_peaks
from tofu_tf.search.topology import Level, Topology

UNSTAGED = ("Const",)            # every device holds its own copy


def stage_counts(num_devices: int) -> list[int]:
    """The stage counts that cut `num_devices` into equal groups of 2 or more."""
    return [s for s in range(2, num_devices) if num_devices % s == 0 and num_devices // s >= 2]


def split_topology(topology: Topology, stages: int) -> tuple[Level, Topology]:
    """(the stage level, the topology of one stage's devices) for `stages` stages over
    `topology`'s devices: the stage level takes the outermost levels' links."""
    n = topology.num_devices
    if stages not in stage_counts(n):
        raise PlanInfeasibleError(
            f"{stages} pipeline stages over {n} devices: each stage needs the same number "
            f"of devices, at least 2.",
            fix=f"pass a stage count >= 2 that divides {n} into groups of 2 or more "
                f"devices (e.g. {stage_counts(n)}).")
    outer = topology.levels[0]
    stage_level = Level(stages, outer.bandwidth, outer.latency, name="stages")
    if outer.ways == stages:
        return stage_level, Topology(topology.levels[1:])
    inner = topology.levels[-1]
    return stage_level, Topology.default(n // stages, inner.bandwidth, inner.latency)


def assign_stages(graph: Graph, stages: int) -> dict[str, int]:
    """op name -> stage (module docstring); constants are left out. Remembered per graph."""
    found = _ASSIGNED.get(graph, {}).get(stages)
    if found is not None:
        return dict(found)
    handles = {v.handle: v.name for v in graph.variables.values()}
    unit = _variable_units(graph, handles)
    order = _forward_order(graph, handles, unit)
    sizes: dict[str, int] = {}
    for v in graph.variables.values():           # its buffer, and its gradient's
        sizes[unit[v.name]] = sizes.get(unit[v.name], 0) + v.num_bytes * (
            1 if v.slot_of else 2)
    units = sorted(sizes, key=lambda u: (order.get(u, len(graph)), u))
    for u, activations in _activation_bytes(graph, handles, unit, units).items():
        sizes[u] += activations
    if len(units) < stages:
        raise PlanInfeasibleError(
            f"{stages} pipeline stages, but the step has {len(units)} independent "
            f"variable groups to spread over them.",
            fix="use fewer pipeline stages (a stage holds at least one layer's weights).")
    starts, before, previous = [0], 0, 0
    total = sum(sizes.values()) or 1
    for i, u in enumerate(units):
        wanted = int((before + sizes[u] / 2) / total * stages)
        # no stage skipped, and enough units left for the stages after this one
        stage = max(min(wanted, previous + 1 if i else 0, stages - 1),
                    previous, stages - (len(units) - i))
        if stage > previous:
            starts.append(i)
        previous = stage
        before += sizes[u]

    def op_stages(starts: list[int]) -> dict[str, int]:
        unit_stage = {u: bisect.bisect_right(starts, i) - 1 for i, u in enumerate(units)}
        return _op_stages(graph, handles, {name: unit_stage[unit[name]]
                                           for name in graph.variables})

    stage = _balanced(starts, len(units), op_stages, lambda s: stage_peaks(graph, s))
    _ASSIGNED.setdefault(graph, {})[stages] = stage
    return dict(stage)


_ASSIGNED: "weakref.WeakKeyDictionary[Graph, dict[int, dict[str, int]]]" = \
    weakref.WeakKeyDictionary()                  # graph -> stage count -> op -> stage
BALANCE_EVALUATIONS = 12    # per-stage peak estimates `_balanced` may make


def _balanced(starts: list[int], count: int, op_stages, peaks_of) -> dict[str, int]:
    """The stage boundaries (`starts`: each stage's first unit) moved, while it lowers the
    largest stage's peak (unpartitioned, `stage_peaks`): the largest stage gives units to
    a neighbour, a quarter of a stage's share at first, halving down to one unit."""
    best = op_stages(starts)
    best_peaks = peaks_of(best)
    step = max(1, count // (4 * len(starts)))
    evaluations = 0
    while evaluations < BALANCE_EVALUATIONS:
        s = max(range(len(starts)), key=best_peaks.__getitem__)
        moves = []
        if s > 0:                                  # its first units to the stage before
            moves.append((s, starts[s] + step))
        if s + 1 < len(starts):                    # its last units to the stage after
            moves.append((s + 1, starts[s + 1] - step))
        improved = False
        for boundary, value in moves:
            tried = starts[:boundary] + [value] + starts[boundary + 1:]
            if not all(a < b for a, b in zip(tried, tried[1:] + [count])) or tried[0] != 0:
                continue
            evaluations += 1
            stage = op_stages(tried)
            found = peaks_of(stage)
            if max(found) < max(best_peaks):
                starts, best, best_peaks, improved = tried, stage, found, True
                break
        if not improved:
            if step == 1:
                break
            step //= 2
    return best


def _op_stages(graph: Graph, handles: Mapping[str, str], var_stage: Mapping[str, int]
               ) -> dict[str, int]:
    """op -> stage, the variables' stages given (module docstring, rules 2 and 3)."""
    stage: dict[str, int] = {}
    for op in graph:
        forced = [var_stage[handles[t]] for t in op.inputs + op.outputs if t in handles]
        if op.type in UNSTAGED:
            continue
        if forced:
            stage[op.name] = max(forced)
        elif op.role is Role.FORWARD:
            fed = [stage[p] for p in _producers(graph, op) if p in stage]
            if fed:
                stage[op.name] = max(fed)
        elif op.forward_op is not None and op.forward_op in stage:
            stage[op.name] = stage[op.forward_op]
    for op in reversed(graph.ops):                 # the rest: the earliest reader's stage
        if op.name in stage or op.type in UNSTAGED:
            continue
        read = [stage[c.name] for t in op.outputs for c in graph.consumers(t)
                if c.name in stage]
        if read:
            stage[op.name] = min(read)
    for op in graph:                               # else the latest that feeds it
        if op.name not in stage and op.type not in UNSTAGED:
            fed = [stage[p] for p in _producers(graph, op) if p in stage]
            stage[op.name] = max(fed, default=0)
    return stage


def _activation_bytes(graph: Graph, handles: Mapping[str, str], unit: Mapping[str, str],
                      units: list[str]) -> dict[str, int]:
    """unit -> the bytes of the forward results that the backward pass reads, computed
    after its first read and before the next unit's (each forward op carries the latest
    unit among its inputs, as `assign_stages` stages it): what a stage keeps for its
    backward pass besides its weights (a CNN's early layers hold the most)."""
    position = {u: i for i, u in enumerate(units)}
    carried: dict[str, int] = {}
    held = {u: 0 for u in units}
    for op in graph:
        if op.role is not Role.FORWARD or op.type in UNSTAGED:
            continue
        found = [position[unit[handles[t]]] for t in op.inputs if t in handles]
        found += [carried[p] for p in _producers(graph, op) if p in carried]
        if not found:
            continue
        carried[op.name] = max(found)
        if op.type != "ReadVariableOp":                  # a read aliases its variable
            held[units[carried[op.name]]] += sum(
                graph.tensors[t].num_bytes for t in op.outputs
                if any(c.role is Role.BACKWARD for c in graph.consumers(t)))
    return held


def _producers(graph: Graph, op: Op) -> list[str]:
    return [graph.producer(t).name for t in op.inputs]


def _variable_units(graph: Graph, handles: Mapping[str, str]) -> dict[str, str]:
    """variable -> its unit's representative: variables that one op reads through their
    handles, and slots with their variables, are one unit (union-find)."""
    parent = {name: name for name in graph.variables}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for v in graph.variables.values():
        if v.slot_of in parent:
            union(v.name, v.slot_of)
    for op in graph:
        touched = [handles[t] for t in op.inputs if t in handles]
        for other in touched[1:]:
            union(touched[0], other)
    return {name: find(name) for name in graph.variables}


def _forward_order(graph: Graph, handles: Mapping[str, str], unit: Mapping[str, str]
                   ) -> dict[str, int]:
    """unit representative -> the position of the first forward op reading it (through
    its handle or a read of it)."""
    first: dict[str, int] = {}
    for i, op in enumerate(graph):
        if op.role is not Role.FORWARD:
            continue
        for t in op.inputs:
            name = handles.get(t)
            if name is None:
                producer = graph.producer(t)
                if producer.type == "ReadVariableOp" and producer.inputs[0] in handles:
                    name = handles[producer.inputs[0]]
            if name is not None:
                first.setdefault(unit[name], i)
    return first


def stage_of_devices(ways: tuple[int, ...]) -> list[int]:
    """Per device (row-major over `ways`), its stage: its coordinate at the stage level."""
    n, per_stage = 1, 1
    for k in ways:
        n *= k
    for k in ways[1:]:
        per_stage *= k
    return [d // per_stage for d in range(n)]
