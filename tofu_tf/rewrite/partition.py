"""What every device holds and computes under a plan, in global coordinates (no TensorFlow).

The plan gives, per level, each tensor's stored state and each op's choice. A device is a
coordinate (p1, ..., pL), one part per level. Composing the levels:

- Stored region of a tensor on a device: start from the whole tensor; at each level a
  Split(d) state keeps part p_l of the current box along d (the usual uneven split, as in
  `part_range`), Replicated keeps it whole.
- Device op: level 1's local op of part p1 (`localize`) is re-described and level 2's
  choice — looked up by label, as the search did for part 0 — localizes it for part p2, and
  so on. Each level's input slice and pad compose into one global data box plus fill around
  it; each level's output share composes into one global box; Partial outputs remember the
  levels at which they are partial (their reduction groups) and the reducer.

A level whose local op crops its result to other than its leading block (a VALID
convolution over a halo, a pooled window) is re-described with the kernel's real result
shapes (the caller's shape inference); the crop stays in the window. Without them the
descent ends there: the device runs that level's local op, a superset of the deeper levels'
share, which is always sound. So does a level whose local op cannot be described, whose
part has no strategy with the plan's label, or whose part the op's localize hook cannot cut
(a PartitionError below level 1). An uneven part one element long on the variable an output
split cuts (3 rows cut 2x2: 2 + 1, then 1 + 0) is cut as its group's part 0 is, without the
hook: its first part keeps the op whole, the others produce none of the split outputs.

Ops with equal signatures (the catalog's id: type, attrs, shapes, dtypes, constants) and
equal choices at every level have equal device ops up to their name: each such class is
localized once (a ResNet repeats its blocks, an unrolled RNN its steps), and the kernel's
result shapes are asked once per distinct local op of the class.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tofu_tf.errors import PartitionError, RewriteError
from tofu_tf.graph import Graph
from tofu_tf.op_semantics.analysis import OutputState, Strategy, named_strategy, part_range
from tofu_tf.op_semantics.catalog import OpEntry
from tofu_tf.op_semantics.localize import LocalOp, localize, replace
from tofu_tf.op_semantics.memo import SemanticsMemo
from tofu_tf.op_semantics.registry import NAMING_ATTRS, Semantics, freeze
from tofu_tf.search.cost import Box, box_volume   # Box: [start, stop) per dim, global coords
from tofu_tf.search.plan import Plan
from tofu_tf.search.problem import opaque_local
from tofu_tf.search.pipeline import stage_of_devices
from tofu_tf.search.topology import coordinates

REPLICATE = "replicate"


@dataclass(frozen=True)
class InputPiece:
    """What a device op reads of one input: `data` from the tensor, `pads` of fill around."""
    data: Box
    pads: Box                                # (before, after) per dim
    fill: float | None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a + p0 + p1 for (a, b), (p0, p1) in zip(self.data, self.pads))


@dataclass(frozen=True)
class OutputPiece:
    """What a device op's (cropped) result holds of one output (or in-place update)."""
    box: Box
    crop: Box                                # where `box` lies in the kernel's result
    scale: float                             # factor before combining a partial result
    partial_levels: tuple[int, ...] = ()     # levels whose parts hold partial results
    reducer: str | None = None


@dataclass(frozen=True)
class DeviceOp:
    op: str
    device: int
    op_type: str
    attrs: Mapping[str, Any]
    const_inputs: Mapping[int, np.ndarray]   # local value of meta inputs
    inputs: tuple[InputPiece | None, ...]    # per input; None: meta or unused
    outputs: tuple[OutputPiece, ...]         # real outputs, then updates (sem order)
    depth: int                               # levels applied (< levels: ran a superset)
    result_shapes: tuple[tuple[int, ...], ...] | None = None   # the kernel's real outputs'
    #                                          shapes, before the crop (None: unknown)
    identity: bool = False                   # the part of a reduction is empty: its kernel
    #                                          is not run, each output is its reducer's identity
    elsewhere: bool = False                  # device 0 computes the op once (`computed_once`):
    #                                          this device runs nothing and receives what it
    #                                          reads of the results


@dataclass(frozen=True)
class Partition:
    ways: tuple[int, ...]
    stored: Mapping[str, tuple[Box | None, ...]]     # tensor -> box per device (None: the
    #                                                  device is outside the tensor's stage)
    ops: Mapping[str, tuple[DeviceOp, ...]]          # op -> one per device

    @property
    def num_devices(self) -> int:
        return math.prod(self.ways)

    def coordinates(self, device: int) -> tuple[int, ...]:
        return coordinates(device, self.ways)

    def group(self, device: int, levels: tuple[int, ...]) -> tuple[int, ...]:
        """Devices equal to `device` outside `levels` (its reduction group), in order."""
        mine = self.coordinates(device)
        return tuple(d for d in range(self.num_devices)
                     if all(c == m for i, (c, m) in enumerate(zip(self.coordinates(d), mine))
                            if i not in levels))


def parse_state(text: str) -> OutputState:
    from tofu_tf.op_semantics.analysis import REPLICATED, Split
    if text == "R":
        return REPLICATED
    if text.startswith("S(") and text.endswith(")"):
        return Split(int(text[2:-1]))
    raise RewriteError(f"stored state '{text}' is neither R nor S(d).")


def stored_box(shape: tuple[int, ...], states: list[OutputState], ways, coords) -> Box:
    box = [(0, n) for n in shape]
    for state, k, p in zip(states, ways, coords):
        if state.kind == "split":
            a, b = box[state.dim]
            lo, hi = part_range(b - a, k, p)
            box[state.dim] = (a + lo, a + hi + 1)
    return tuple(box)


def reduce_target(box: Box, levels, states, coords, ways, shape) -> Box | None:
    """The device's share of a partial result's region `box` after the reduce-scatter over
    `levels` (rewrite/collectives.py): cut at each level by the state there, outermost
    level first (innermost first when all are Replicated); None: an empty share. At a
    Split(d) level, part p's share is what the parts stored there at coordinate p hold of
    the box (`_stored_slabs`: each reduced element lands on the side that stores it), or,
    where that is not one range for every side, the box cut evenly."""
    box = list(box)
    # Replicated at every level: the innermost level cuts first, so that each side of the
    # inner-first reduce-scatter is one contiguous box (one slice, one sum per level).
    order = reversed(levels) if all(states[level].kind == "replicated" for level in levels) \
        else levels
    for level in order:
        state, k, p = states[level], ways[level], coords[level]
        if state.kind == "split":
            dim = state.dim
            slabs = _stored_slabs(shape[dim], states, ways, level, dim, box[dim])
            if slabs is not None:
                if slabs[p] is None:
                    return None
                box[dim] = slabs[p]
                continue
        else:
            sizes = [b - a for a, b in box]
            if not sizes or max(sizes) < 2:               # nothing to chunk: part 0 keeps it
                if p:
                    return None
                continue
            dim = max(range(len(sizes)), key=lambda i: sizes[i])
        a, b = box[dim]
        lo, hi = part_range(b - a, k, p)
        box[dim] = (a + lo, a + hi + 1)
    return tuple(box)


def _nested_ranges(n: int, states, ways, levels: int, dim: int):
    """The ranges along `dim` (extent n) the first `levels` levels cut, nested as
    `stored_box` cuts them, each with its part's coordinate at the last of those levels
    that splits `dim` (None before any)."""
    ranges = [((0, n), None)]
    for at in range(levels):
        if states[at].kind == "split" and states[at].dim == dim:
            ranges = [((a + lo, a + hi + 1), q) for (a, b), _ in ranges
                      for q in range(ways[at]) for lo, hi in [part_range(b - a, ways[at], q)]]
    return ranges


def reduce_regions(boxes: Sequence[Box | None], cut, states, ways, shape
                   ) -> list[list[Box | None]]:
    """The reductions a partial result over the levels `cut` runs as
    (rewrite/collectives.py), each given as the produced boxes (per device, None: none)
    it sums: one, of `boxes` whole; or, where at a Split(d) level of the cut a produced
    box's stored slabs are not one range per part (an op above produced past its group's
    part along d, across the ranges outer levels cut), one per outer range along d, each
    with the boxes cut to it: within one, every part's slab is one range, so each reduced
    element lands on the part that stores it."""
    bounds: list[set[int]] = [set() for _ in shape]
    for level in cut:
        state = states[level]
        if state.kind != "split":
            continue
        dim = state.dim
        if any(box is not None and _stored_slabs(shape[dim], states, ways, level, dim,
                                                 box[dim]) is None for box in boxes):
            bounds[dim].update(x for r, _ in _nested_ranges(shape[dim], states, ways, level,
                                                            dim) for x in r)
    if not any(bounds):
        return [list(boxes)]
    cuts = [sorted(b | {0, n}) for b, n in zip(bounds, shape)]
    out = []
    for region in itertools.product(*(list(zip(c[:-1], c[1:])) for c in cuts)):
        within = [None if box is None else _intersect(box, region) for box in boxes]
        within = [box if box is not None and nonempty(box) else None for box in within]
        if any(within):
            out.append(within)
    return out


def _stored_slabs(n: int, states, ways, level: int, dim: int, span: tuple[int, int]):
    """Per part p of `level`, the range of `span` (along `dim`, of extent n) that parts
    stored at coordinate p there hold (parts nest level by level, as `stored_box` cuts
    them); None for a part holding none of it. None where some part's is not one range."""
    ranges = _nested_ranges(n, states, ways, level + 1, dim)   # `level` splits dim
    out = []
    for p in range(ways[level]):
        pieces = [(max(a, span[0]), min(b, span[1])) for (a, b), q in ranges
                  if q == p and max(a, span[0]) < min(b, span[1])]
        if len(pieces) > 1 and any(x[1] != y[0] for x, y in zip(pieces, pieces[1:])):
            return None
        out.append((pieces[0][0], pieces[-1][1]) if pieces else None)
    return out


# -- what the emitter and the pricer (rewrite/pricing.py) decide alike ---------------------

# Reducers one CollectiveReduceV2 combines (its merge_op in rewrite/collectives.py).
V2_REDUCERS = ("sum", "mean", "max", "min", "prod")


def all_reduces(use_v2: bool, reducer: str, levels, states: list[OutputState]) -> bool:
    """Whether a partial result over `levels` reduces by one V2 all-reduce per group (its
    levels all Replicated), not by the hierarchical reduce-scatter and all-gather."""
    return use_v2 and reducer in V2_REDUCERS and all(states[level].kind == "replicated"
                                                     for level in levels)


# A partial result that is Replicated at each of its levels and whose produced region is
# at most this many bytes on every device is reduced by exchange (`exchanges`), level by
# level (`exchange_rounds`): a group of g sends its copies to one member (`exchange_root`),
# which combines them in member order; at the outermost level a pair swaps them instead
# (one message each way); the devices that read the result fetch it from the nearest
# holder. Per level 2 (g - 1) |D| bytes, what a ring reduce-scatter and all-gather move
# and the search prices, but no slices or concats and one combine per group: for a bias
# gradient the per-message cost is the whole cost.
EXCHANGE_BYTES = 2048


def exchange_root(t: str, members: Sequence[int]) -> int | None:
    """The member of a group that combines t's copies in an exchange (`exchanges`); None
    for a pair, which swaps them. Roots are spread over the members by tensor name, so
    that no device combines every small gradient of a step."""
    if len(members) <= 2:
        return None
    return members[zlib.crc32(t.encode()) % len(members)]


def exchanges(levels, states: list[OutputState], produced: Sequence[Box | None],
              itemsize: int, replicas: tuple[int, ...] = ()) -> bool:
    """Whether a partial result over `levels` with these states, produced as these
    per-device boxes, reduces by exchange (`exchange_rounds`)."""
    return (all(states[level].kind == "replicated" for level in replicas + tuple(levels)) and
            all(box is None or box_volume(box) * itemsize <= EXCHANGE_BYTES
                for box in produced))


def replica_levels(parts: Partition, levels, produced: Sequence[Box | None]) -> tuple[int, ...]:
    """The levels inside the outermost of `levels` (a partial result's) across which every
    device that produced it holds the same region: the op ran replicated there, and its
    copies are equal. The reduction cuts each copy's share at these levels too
    (rewrite/collectives.py): a copy reduces only its slice over `levels`, so the outer
    links carry each element once, as the search prices it, and the slices are gathered
    inside the group where the tensor is stored Replicated (search/problem.py prices that
    gathering where the op produces the reduced output replicated)."""
    out = []
    for level in range(min(levels) + 1, len(parts.ways)):
        if level in levels or parts.ways[level] == 1:
            continue
        if all(all(produced[m] == box for m in parts.group(d, (level,)))
               for d, box in enumerate(produced) if box is not None):
            out.append(level)
    return tuple(out)


def exchange_rounds(parts: Partition, t: str, levels, replicas: tuple[int, ...],
                    active: Sequence[int]) -> list[list[tuple[int, tuple[int, ...]]]]:
    """An exchange (`exchanges`), one round per level of `levels`, innermost first: per
    round [(receiver, group)], the receiver combining the group's values (the first round's
    groups: the producers outside `replicas`, one copy each; a later round's: the earlier
    round's receivers). A group sends its values to its root (`exchange_root`; a pair: its
    first member), except at the outermost level, where a pair swaps them and both hold the
    result. The last round's receivers hold it; readers fetch it from there. Per level, as
    the search prices a Replicated partial result: (g - 1) |D| to the root and as much
    fetched back by its readers, 2 (g - 1) |D|."""
    holders = [d for d in active if not any(parts.coordinates(d)[level] for level in replicas)]
    rounds = []
    for level in reversed(sorted(levels)):
        outermost = level == min(levels)
        steps = []
        for d in holders:
            group = tuple(m for m in parts.group(d, (level,)) if m in holders)
            if group[0] != d:
                continue
            root = exchange_root(t, group)
            if root is None and not outermost:
                root = group[0]
            steps += [(e, group) for e in (group if root is None else (root,))]
        rounds.append(steps)
        holders = [e for e, _ in steps]
    return rounds


def fetched_from(parts: Partition, t: str) -> list[int]:
    """The devices whose stored boxes of t a fetch (gathered on device 0) uses: the first
    holder's alone where it stores the whole tensor, else every holder's."""
    holders = [d for d, box in enumerate(parts.stored[t]) if box is not None]
    first = parts.stored[t][holders[0]]
    whole = all(contains(first, parts.stored[t][d]) for d in holders)
    return holders[:1] if whole else holders


def contains(outer: Box, inner: Box) -> bool:
    return all(a <= c and d <= b for (a, b), (c, d) in zip(outer, inner))


def nonempty(box: Box) -> bool:
    return all(b > a for a, b in box)


def shared_prefix(a, b) -> int:
    """How many leading level coordinates two devices share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))


# Ops that read a variable through its handle, and the op on its values in their place
# where a device needs more of the variable than its shard (a gather whose indices are
# split reads the whole table): the emitter reads those values off the shards, after the
# op's own control inputs, as it does for a ReadVariableOp off its shard.
ON_VALUES = {"ResourceGather": "GatherV2"}


def own_shard(piece: DeviceOp, i: int, stored: Box) -> bool:
    """Whether input i of the device op reads exactly the shard its device stores."""
    read = piece.inputs[i]
    return read is not None and read.data == stored and not any(
        p0 or p1 for p0, p1 in read.pads)


def reads_values(op_type: str, piece: DeviceOp, i: int, stored: Box) -> bool:
    """Whether input i, a variable handle, is read as values off the shards (ON_VALUES):
    the op has a values form and reads an unpadded region other than its device's shard."""
    read = piece.inputs[i]
    return (op_type in ON_VALUES and read is not None and not own_shard(piece, i, stored)
            and not any(p0 or p1 for p0, p1 in read.pads))


def narrow_update(op, sem: Semantics, piece: DeviceOp,
                  stored: Mapping[str, tuple[Box, ...]]) -> DeviceOp | None:
    """The in-place update narrowed to the shard its device stores (None: it stores none):
    a part that computes more than its shard (a level ran whole) writes only its shard.
    Element-wise updates read their other inputs over the written region, so those narrow
    alike."""
    n_real = len(op.outputs)
    written = [(c.alias, piece.outputs[n_real + u].box) for u, c in enumerate(sem.updates)]
    owns = [stored[op.inputs[alias]][piece.device] for alias, _ in written]
    if all(box == own for (_, box), own in zip(written, owns)):
        return piece
    if not any(nonempty(own) for own in owns):
        return None
    box, own = written[0][1], owns[0]
    if any(b != box for _, b in written) or any(o != own for o in owns):
        raise RewriteError("its updates write different regions on one device.",
                           node=op.name, op_type=op.type)
    inputs = list(piece.inputs)
    for i, read in enumerate(piece.inputs):
        if read is None or not read.data:
            continue
        if read.data != box or any(p0 or p1 for p0, p1 in read.pads):
            raise RewriteError(f"input {i} is not read element-wise with the update, "
                               "so the update cannot narrow to the device's shard.",
                               node=op.name, op_type=op.type,
                               fix="describe the op so its parts match the shards.")
        inputs[i] = dataclasses.replace(read, data=own)
    outputs = list(piece.outputs)
    for u in range(len(written)):
        outputs[n_real + u] = dataclasses.replace(outputs[n_real + u], box=own)
    return dataclasses.replace(piece, inputs=tuple(inputs), outputs=tuple(outputs))


ResultShapes = Callable[[str, LocalOp, list], "list[tuple[int, ...]] | None"]


def partition(graph: Graph, entries: Mapping[str, OpEntry], plan: Plan,
              result_shapes: ResultShapes | None = None, once_below: int = 0) -> Partition:
    """`result_shapes(op, local op, local input shapes)`: the shapes the local kernel
    really returns (before its crop), from the caller's shape inference; with it, a level
    that crops its result still hands its local op to the next level. `once_below`: an op
    every device would run alike whose results have fewer elements than this runs on device
    0 only (`computed_once`)."""
    ways = tuple(level.ways for level in plan.levels)
    n = int(np.prod(ways))
    coords = [coordinates(d, ways) for d in range(n)]
    stored = {}
    boxes: dict[tuple, tuple[Box, ...]] = {}            # (shape, states) -> box per device
    for name, tensor in graph.tensors.items():
        if name not in plan.groups:
            continue
        texts = tuple(plan.state(level, name) for level in range(len(ways)))
        if (tensor.shape, texts) not in boxes:
            states = [parse_state(text) for text in texts]
            boxes[(tensor.shape, texts)] = tuple(stored_box(tensor.shape, states, ways, c)
                                                 for c in coords)
        stored[name] = boxes[(tensor.shape, texts)]
    memo = SemanticsMemo()
    ops = {}
    alike: dict[tuple, tuple[DeviceOp, ...]] = {}       # class of equal ops -> device ops
    for op in graph:
        entry = entries[op.name]
        if entry.semantics is None:
            continue
        labels = tuple(level.choices.get(op.name, REPLICATE) for level in plan.levels)
        key = _class_key(op, entry, labels)
        if key is not None and once_below and plan.stages:   # computed once in its stage
            key = key + (plan.stages.get(op.name),)
        if key is not None and key in alike:     # its class decided computing once too
            ops[op.name] = tuple(_renamed(piece, op.name) for piece in alike[key])
            continue
        dtypes = ([graph.tensors[t].dtype for t in op.inputs],
                  [graph.tensors[t].dtype for t in op.outputs])
        pieces = device_ops(entry.semantics, entry.strategies, labels, ways, coords, memo,
                            dtypes, _asked_once(result_shapes))
        if (once_below and computed_once(op, entry.semantics, pieces, graph, once_below)) \
                or side_effect_only(op, entry.semantics, graph):
            first = _first_device(plan.stages.get(op.name), ways)
            pieces = tuple(piece if piece.device == first
                           else dataclasses.replace(piece, elsewhere=True) for piece in pieces)
        ops[op.name] = pieces
        if key is not None:
            alike[key] = pieces
    if plan.stages:
        ops, stored = _staged(graph, plan.stages, ways, ops, stored)
    return Partition(ways, stored, ops)


def _first_device(stage: int | None, ways) -> int:
    """Where an op computed once runs: device 0, or its pipeline stage's first device."""
    return 0 if stage is None else stage * math.prod(ways[1:])


def _staged(graph: Graph, stages: Mapping[str, int], ways, ops, stored):
    """Pipeline stages (search/pipeline.py): an op's pieces outside its stage's devices
    run nothing (`elsewhere`), and its results are stored on its stage's devices alone."""
    stage_of = stage_of_devices(ways)
    ops = {name: pieces if stages.get(name) is None else tuple(
        piece if stage_of[piece.device] == stages[name]
        else dataclasses.replace(piece, elsewhere=True) for piece in pieces)
        for name, pieces in ops.items()}
    stored = dict(stored)
    for op in graph:
        if stages.get(op.name) is None:
            continue
        for t in op.outputs:
            if t in stored:
                stored[t] = tuple(box if stage_of[d] == stages[op.name] else None
                                  for d, box in enumerate(stored[t]))
    return ops, stored


# Ops every device runs as itself: sources, and reads of a variable's own copy.
_PER_DEVICE = frozenset({"Placeholder", "PlaceholderWithDefault", "Const", "VarHandleOp",
                         "ReadVariableOp"})


def computed_once(op, sem: Semantics, pieces: tuple[DeviceOp, ...], graph: Graph,
                  below: int) -> bool:
    """Whether every device would run the op alike (the same kernel on the same input
    regions, each result whole, none partial) on results of fewer than `below` elements
    each, so that one device may compute it for all. Logical CPU devices share the host's
    cores: there the op's N runs cost N times its kernel and executor time, where one run
    and a transfer to each reader cost one (small tensors cross by reference)."""
    if op.type in _PER_DEVICE or not op.outputs or sem.updates:
        return False
    if any(graph.tensors[t].is_resource for t in op.inputs):
        return False
    first = pieces[0]
    for o, t in enumerate(op.outputs):
        shape = graph.tensors[t].shape
        if math.prod(shape) >= below or first.outputs[o].box != tuple((0, n) for n in shape):
            return False
    return all(_alike(piece, first) for piece in pieces[1:]) and not first.identity and \
        not any(out.partial_levels or out.scale != 1.0 for out in first.outputs)


def side_effect_only(op, sem: Semantics, graph: Graph) -> bool:
    """An op kept whole that returns nothing and writes no variable (tf.print's PrintV2, an
    Assert): its effect happens once per step, on one device, not once per device."""
    return (sem.is_opaque and not op.outputs and not sem.updates and op.type != "NoOp"
            and not any(graph.tensors[t].is_resource for t in op.inputs))


def _alike(a: DeviceOp, b: DeviceOp) -> bool:
    """Whether two device ops run the same kernel on the same regions to the same boxes."""
    return (a.op_type == b.op_type and a.inputs == b.inputs and a.outputs == b.outputs
            and a.identity == b.identity and freeze(a.attrs) == freeze(b.attrs)
            and freeze(dict(a.const_inputs)) == freeze(dict(b.const_inputs)))


def _renamed(piece: DeviceOp, name: str) -> DeviceOp:
    return dataclasses.replace(piece, op=name)


def _asked_once(result_shapes: ResultShapes | None) -> ResultShapes | None:
    """`result_shapes` for the ops of one class, asked once per distinct local op."""
    if result_shapes is None:
        return None
    answers: dict[tuple, list | None] = {}

    def ask(name: str, local: LocalOp, in_shapes):
        key = (local.op_type, freeze(local.attrs), freeze(local.const_inputs),
               freeze(in_shapes), tuple(s is None for s in local.input_slices))
        if key not in answers:
            answers[key] = result_shapes(name, local, in_shapes)
        return answers[key]
    return ask


def _class_key(op, entry: OpEntry, labels: tuple[str, ...]) -> tuple | None:
    """Ops with equal keys have equal device ops up to their name (None: no class)."""
    if entry.signature is None:
        return None
    naming = tuple(sorted((k, str(v)) for k, v in op.attrs.items() if k in NAMING_ATTRS))
    return entry.signature, labels, naming


# Reducers whose groups may count a whole result once by scaling the other copies by 0;
# max and min may count it any number of times.
_ADDITIVE = ("sum", "mean")
_IDEMPOTENT = ("max", "min")


def device_ops(sem: Semantics, strategies, labels, ways, coords, memo: SemanticsMemo,
               dtypes, result_shapes: ResultShapes | None = None) -> tuple[DeviceOp, ...]:
    """Every device's op (`device_op`), agreeing on where each output is partial.

    The devices of one reduction group must produce the same region of a partial output.
    Below a split of a reduction (a convolution's taps), the parts' local ops differ (each
    has its own taps), and a deeper split of their results can cut them differently; the
    descent then ends above the level where they diverge, so each device runs a superset
    of its share (always sound)."""
    steps: dict = {}
    depth = len(labels)
    while True:
        pieces = tuple(device_op(sem, strategies, labels[:depth], ways[:depth], c[:depth], d,
                                 memo, dtypes, result_shapes, steps)
                       for d, c in enumerate(coords))
        if depth == 1 or not _groups_diverge(pieces, coords):
            return tuple(_reads_nothing(p) for p in _count_once(pieces, coords))
        depth -= 1


def _reads_nothing(piece: DeviceOp) -> DeviceOp:
    """A piece whose kernel would read an empty input (the last part of an uneven split
    of a reduction, two rows cut three ways) while every output it holds is partial: its
    share of the reduction is empty, so it holds the reducers' identities. TensorFlow's
    kernels do not promise that (a filter gradient over no rows returns its buffer
    unwritten; a convolution over no taps fails), so the kernel must not run."""
    if not any(p is not None and 0 in p.shape for p in piece.inputs):
        return piece
    held = [out for out in piece.outputs if nonempty(out.box)]
    if not held or not all(out.partial_levels for out in held):
        return piece
    return dataclasses.replace(piece, identity=True)


def reducer_identity(reducer: str, dtype) -> Any:
    """x with combine(reducer, x, y) == y for every y of `dtype`."""
    dtype = np.dtype(dtype)
    if reducer in ("sum", "mean"):
        return dtype.type(0)
    if reducer == "prod":
        return dtype.type(1)
    if dtype.kind == "b":
        return reducer == "min"
    if dtype.kind in "fc":
        return dtype.type(-np.inf if reducer == "max" else np.inf)
    info = np.iinfo(dtype)
    return info.min if reducer == "max" else info.max


def _groups_diverge(pieces: tuple[DeviceOp, ...], coords) -> bool:
    """Whether two devices of one reduction group hold different boxes of a partial output."""
    for o in range(len(pieces[0].outputs)):
        levels = {lvl for p in pieces for lvl in p.outputs[o].partial_levels}
        if not levels:
            continue
        boxes: dict[tuple, Box] = {}
        for piece, c in zip(pieces, coords):
            group = tuple(p for lvl, p in enumerate(c) if lvl not in levels)
            if boxes.setdefault(group, piece.outputs[o].box) != piece.outputs[o].box:
                return True
    return False


def _count_once(pieces: tuple[DeviceOp, ...], coords) -> tuple[DeviceOp, ...]:
    """Makes the pieces of one op agree on where each output is partial.

    A device whose descent ended early (an uneven part too small for a level's strategy)
    holds its share whole where the other devices hold partial results at the deeper
    levels, yet its result is combined with its reduction groups at those levels like
    theirs. So every piece takes the union of the partial levels, and for an additive
    reducer a whole result counts once: the copy at coordinate 0 of each level it did not
    split keeps its scale, the others get scale 0 (max and min need nothing)."""
    out = list(pieces)
    for o in range(len(pieces[0].outputs)):
        levels = tuple(sorted({lvl for p in pieces for lvl in p.outputs[o].partial_levels}))
        if not levels:
            continue
        reducer = next(p.outputs[o].reducer for p in pieces if p.outputs[o].partial_levels)
        for d, piece in enumerate(out):
            mine = piece.outputs[o]
            missing = [lvl for lvl in levels if lvl not in mine.partial_levels]
            if not missing:
                continue
            if reducer not in _ADDITIVE + _IDEMPOTENT:
                raise RewriteError(
                    f"an uneven part is too small to split like the others, and its whole "
                    f"result cannot be combined in a partial '{reducer}'.",
                    node=piece.op, op_type=piece.op_type,
                    fix="use a device count that divides the reduced dimension, or plan "
                        "with fewer devices.")
            once = reducer in _IDEMPOTENT or all(coords[d][lvl] == 0 for lvl in missing)
            fixed = dataclasses.replace(mine, partial_levels=levels, reducer=reducer,
                                        scale=mine.scale if once else 0.0)
            out[d] = dataclasses.replace(
                piece, outputs=piece.outputs[:o] + (fixed,) + piece.outputs[o + 1:])
    return tuple(out)


def _find(strategies, label: str) -> Strategy | None:
    for s in strategies:
        if s.label == label:
            return s
    return None


def device_op(sem: Semantics, strategies, labels, ways, coords, device: int,
              memo: SemanticsMemo, dtypes, result_shapes: ResultShapes | None = None,
              steps: dict | None = None) -> DeviceOp:
    """The composite local op of one device (see the module docstring). `steps`: the
    levels' local ops, shared by the devices of one op (a level's depends only on the
    device's coordinates up to it)."""
    steps = {} if steps is None else steps
    name = sem.op_name
    n_in, n_out = len(sem.input_shapes), len(sem.output_shapes)
    in_origin = [(0,) * len(s) for s in sem.input_shapes]
    in_data: list[Box] = [tuple((0, d) for d in s) for s in sem.input_shapes]
    fills: list[float | None] = [None] * n_in
    out_origin = [(0,) * len(s) for s in sem.output_shapes]
    window: list[Box] = [tuple((0, d) for d in s) for s in sem.output_shapes]
    scale = [1.0] * n_out
    partial: list[list[int]] = [[] for _ in range(n_out)]
    reducer: list[str | None] = [None] * n_out
    n_real = sem.num_outputs if sem.num_outputs is not None else n_out
    local: LocalOp | None = None
    local_sem = sem
    depth = 0
    for level, (label, k, p) in enumerate(zip(labels, ways, coords)):
        strategy = None if label == REPLICATE else _find(strategies, label)
        whole = False                               # part 0 of a one-element variable
        if strategy is None and label != REPLICATE and local is not None:
            short = _once(steps, ("short", tuple(coords[:level])),   # one per group
                          lambda: named_strategy(sem, label))
            if short is None or short.kind != "output":
                break                               # the part has no such strategy
            # A smaller part of an uneven split above, one element long on the split
            # variable (3 rows cut 2x2), cut as its group's part 0 is: its first part
            # keeps the op whole, the others produce none of the split outputs (no hook
            # is asked to cut an extent of 1).
            if p:
                for o, state in enumerate(short.outputs):
                    if state.kind == "split":
                        box = list(window[o])
                        box[state.dim] = (box[state.dim][1],) * 2     # as stored_box
                        window[o] = tuple(box)
                depth = level + 1
                break
            whole = True
        if strategy is None and label != REPLICATE and not whole:
            raise RewriteError(f"the plan's choice '{label}' is not a strategy of the op.",
                               node=name, op_type=sem.op_type,
                               fix="plan again for this graph.")
        prefix = tuple(coords[:level + 1])
        try:
            found = _once(steps, ("local", prefix), lambda: _localize(sem, strategy, k, p))
        except PartitionError:
            if local is None:
                raise
            break                    # a deeper part the hook cannot cut: run the superset
        if local is not None and local.const_inputs:
            # This level's op was described with the constants the levels above set (a
            # Roll's shifts, a Tile's multiples); its kernel runs with them too, unless
            # its own hook sets them again.
            found = replace(found, const_inputs={**local.const_inputs, **found.const_inputs})
        local, local_sem = found, sem
        depth = level + 1
        for i in range(n_in):
            sl, pads = local.input_slices[i], local.input_pads[i]
            if sl is None:
                continue
            pads = pads or tuple((0, 0) for _ in sl)
            shifted = tuple((a + o, b + o) for (a, b), o in zip(sl, in_origin[i]))
            in_data[i] = _intersect(in_data[i], shifted)
            in_origin[i] = tuple(o + a - p0 for o, (a, _), (p0, _) in
                                 zip(in_origin[i], sl, pads))
            if local.input_fills[i] is not None:
                fills[i] = local.input_fills[i]
        for o in range(n_out):
            share, crop = local.output_slices[o], local.output_crops[o]
            window[o] = _intersect(window[o], tuple((a + g, b + g) for (a, b), g in
                                                    zip(share, out_origin[o])))
            out_origin[o] = tuple(g + a - (c[0] if crop else 0) for g, (a, _), c in
                                  zip(out_origin[o], share, crop or share))
            scale[o] *= local.output_scales[o]
            if strategy is not None and strategy.outputs[o].kind == "partial":
                partial[o].append(level)
                reducer[o] = strategy.outputs[o].reducer
        if level + 1 == len(ways):
            break
        described = _once(steps, ("next", prefix),
                          lambda: _next_level(sem, local, memo, dtypes, result_shapes))
        if described is None:
            break
        sem, strategies = described
    inputs = []
    for i in range(n_in):
        if local.input_slices[i] is None:
            inputs.append(None)
            continue
        shape = local.local_input_shape(i)
        requested = tuple((o, o + d) for o, d in zip(in_origin[i], shape))
        data = _intersect(requested, in_data[i])
        pads = tuple((a - ra, rb - b) for (ra, rb), (a, b) in zip(requested, data))
        inputs.append(InputPiece(data, pads, fills[i]))
    outputs = [OutputPiece(window[o], tuple((a - g, b - g) for (a, b), g in
                                            zip(window[o], out_origin[o])),
                           scale[o], tuple(partial[o]), reducer[o]) for o in range(n_out)]
    return DeviceOp(name, device, local.op_type, dict(local.attrs),
                    dict(local.const_inputs), tuple(inputs), tuple(outputs), depth,
                    _kernel_shapes(local_sem, local, n_real, result_shapes))


def _kernel_shapes(sem: Semantics, local: LocalOp, n_real: int,
                   result_shapes: ResultShapes | None) -> tuple[tuple[int, ...], ...] | None:
    """The shapes of the local kernel's real outputs: the caller's shape inference (a
    local op may compute more than its share, e.g. a Tile keeping its multiples), else
    the shares when the op crops nothing; None when unknown."""
    in_shapes = [local.local_input_shape(i) or shape for i, shape in enumerate(sem.input_shapes)]
    shapes = result_shapes(sem.op_name, local, in_shapes) if result_shapes else None
    if shapes is not None:
        return tuple(tuple(s) for s in shapes[:n_real])
    if all(crop is None for crop in local.output_crops[:n_real]):
        return tuple(tuple(b - a for a, b in share) for share in local.output_slices[:n_real])
    return None


def _once(steps: dict, key: tuple, compute: Callable[[], Any]) -> Any:
    if key not in steps:
        steps[key] = compute()
    return steps[key]


def _next_level(sem: Semantics, local: LocalOp, memo: SemanticsMemo, dtypes,
                result_shapes: ResultShapes | None):
    """(semantics, strategies) of a level's local op for the next level to split, or None
    when it cannot be described."""
    out_shapes = [tuple(b - a for a, b in share) for share in local.output_slices]
    if not all(_leading(c, share) for c, share in
               zip(local.output_crops, local.output_slices)):
        in_shapes = [local.local_input_shape(i) or shape
                     for i, shape in enumerate(sem.input_shapes)]
        out_shapes = result_shapes(sem.op_name, local, in_shapes) if result_shapes else None
        if out_shapes is None:
            return None
        # The next level splits the kernel's whole result (out_origin maps its
        # coordinates to the tensor's); the window keeps this level's crop.
    return _describe(sem, local, memo, dtypes, out_shapes)


def _leading(crop: Box | None, share: Box) -> bool:
    """Whether a crop keeps the result's leading share-sized block (or there is none): the
    local op is then described with the share's shape, as the search did."""
    return crop is None or all(c == (0, b - a) for c, (a, b) in zip(crop, share))


def _localize(sem: Semantics, strategy: Strategy | None, k: int, p: int) -> LocalOp:
    return opaque_local(sem) if sem.is_opaque else localize(sem, strategy, k, p)


def _describe(sem: Semantics, local: LocalOp, memo: SemanticsMemo, dtypes, out_shapes):
    """(semantics, strategies) of a part's local op, or None if it cannot be described."""
    if sem.is_opaque:
        return None
    in_shapes = [local.local_input_shape(i) or shape
                 for i, shape in enumerate(sem.input_shapes)]
    n_real = sem.num_outputs if sem.num_outputs is not None else len(out_shapes)
    in_dtypes, out_dtypes = dtypes
    constants = {**sem.constants, **local.const_inputs}
    try:
        local_sem, strategies, _ = memo.get(sem.op_name, local.op_type, local.attrs,
                                            in_shapes, in_dtypes, out_shapes[:n_real],
                                            out_dtypes[:n_real], constants)
    except Exception:        # noqa: BLE001 — a local op the descriptions cannot take
        return None
    if local_sem.is_opaque:
        return None
    return local_sem, strategies


def _intersect(a: Box, b: Box) -> Box:
    out = []
    for (a0, a1), (b0, b1) in zip(a, b):
        lo, hi = max(a0, b0), min(a1, b1)
        out.append((lo, max(lo, hi)))
    return tuple(out)
