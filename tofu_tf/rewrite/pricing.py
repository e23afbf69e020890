"""The bytes a partitioned step moves between devices, predicted from the Partition alone.

The search prices each level's cut inside its groups, and every op's read on its own
(search/cost.py), as Tofu's recursion does; the emitted graph moves each region a device
lacks from the nearest device that holds it, once, so the two differ (the emitted step
moves 8-22% less on the reference models at 2x2x2, and up to a third less over the
outermost links; with Options.shared_reads the outermost links agree, bench/results/
search.md). This module prices what the emitter realises, from the per-device boxes (no
TensorFlow), with the rules the emitter follows:

- read: an op on device d reads box B of a tensor stored as S_d on d (an op computed once,
  `partition.computed_once`, reads on device 0 only). B within what d holds moves nothing;
  otherwise every element of B that d lacks comes from the nearest device holding it (the
  longest shared prefix of level coordinates). What d holds of a tensor is S_d plus the
  regions it assembled from remote elements before (relaying: the second device of a group
  that needs a remote region reads it from the first, over an inner link). A variable read
  off its shard (ReadVariableOp) reads the shards only: an update may change them between
  two reads.
- convert: a tensor's stored box S_e on device e, assembled from what the devices produced
  (P_e on e, and regions received before): what e lacks of S_e, once per device where the
  stored box is used. It is used on d by a read within S_d, on every device by a read
  outside any S_d, and by every fetch.
- reduce: a partial result over levels Λ (rewrite/collectives.py), cut also at the levels
  where the op ran replicated inside Λ's outermost (partition.replica_levels), one
  reduction per region of partition.reduce_regions:
  reduce-scatter, innermost level first — at a level of Λ each member of a level group
  receives every other member's copy of the pieces destined to its side (at a replica
  level it keeps its own); then all-gather, outermost first, at the levels where the
  tensor is Replicated — each member receives the pieces (by distinct box) it lacks. With
  V2 collectives (a reduction group whose levels are all Replicated): one ring all-reduce
  per group, 2 (g - 1) |D| / g per member of g. A small replicated one
  (partition.exchanges): level by level, innermost first, each group's root receives its
  other members' copies (partition.exchange_rounds; at the outermost level a pair swaps
  them); the last round's receivers hold the result. The stored box is then assembled
  from the reduced pieces (and received regions) the device holds.

Each transfer is attributed to the outermost level at which its two devices differ (the
link it crosses). Feeds and fetched results are outside the step, as in the ledger.
"""

from __future__ import annotations

import itertools
from typing import Mapping, Sequence

from tofu_tf.graph import DTYPE_SIZES, Graph
from tofu_tf.op_semantics.catalog import OpEntry
from tofu_tf.rewrite.partition import (Box, DeviceOp, Partition, all_reduces, contains,
                                      exchange_rounds, exchanges, fetched_from, narrow_update,
                                      nonempty, own_shard, parse_state, reads_values,
                                      reduce_regions, reduce_target, replica_levels,
                                      shared_prefix)
from tofu_tf.search.cost import box_volume
from tofu_tf.search.plan import Plan


def predict_bytes(graph: Graph, entries: Mapping[str, OpEntry], plan: Plan,
                  parts: Partition, *, use_v2: bool = False,
                  expose: Sequence[str] = ()) -> tuple[int, ...]:
    """Bytes the step emitted for `plan` (whose partition is `parts`) moves, per level.
    `use_v2`: partial results reduce with V2 collectives; `expose`: tensors also
    assembled on device 0 (their stored boxes are used)."""
    def states(t: str) -> list[str]:
        return [plan.state(level, t) for level in range(len(plan.levels))]
    return _Pricer(graph, entries, parts, states, use_v2).run(expose)


class _Pricer:
    def __init__(self, graph: Graph, entries, parts: Partition, plan_states, use_v2: bool):
        self.graph, self.entries, self.parts = graph, entries, parts
        self.plan_states, self.use_v2 = plan_states, use_v2
        self.n = parts.num_devices
        self.coords = [parts.coordinates(d) for d in range(self.n)]
        self.per_level = [0] * len(parts.ways)
        self.produced: dict[str, list[Box | None]] = {}
        self.partial: dict[str, tuple[tuple[int, ...], str]] = {}
        self.used: set[tuple[str, int]] = set()
        self.held: dict[str, list[list[Box]]] = {}              # partial t -> per device
        self.received: dict[str, dict[int, list[Box]]] = {}     # t -> device -> regions
        self.handles = {v.handle for v in graph.variables.values()}

    def run(self, expose: Sequence[str]) -> tuple[int, ...]:
        for op in self.graph:
            for piece in self.parts.ops[op.name]:
                self._op(op, piece)
            for o, t in enumerate(op.outputs):
                out = self.parts.ops[op.name][0].outputs[o]
                if out.partial_levels:
                    self.partial[t] = (out.partial_levels, out.reducer)
        for t in list(self.graph.fetches) + list(expose):
            if ":" in t:
                for e in fetched_from(self.parts, t):
                    self._use(t, e)
        return tuple(self.per_level)

    def level(self, src: int, dst: int) -> int:
        """The outermost level at which two devices differ (the link between them)."""
        return next(i for i, (a, b) in enumerate(zip(self.coords[src], self.coords[dst]))
                    if a != b)

    def move(self, t: str, src: int, dst: int, elements: int) -> None:
        if src != dst and elements > 0:
            self.per_level[self.level(src, dst)] += (
                elements * DTYPE_SIZES.get(self.graph.tensors[t].dtype, 4))

    # -- ops -------------------------------------------------------------------------------
    def _op(self, op, piece: DeviceOp) -> None:
        d = piece.device
        if piece.elsewhere:
            return
        if op.type in ("Placeholder", "Const", "VarHandleOp"):
            if op.type != "VarHandleOp":
                self._produce(op, piece)
            return
        empty = piece.outputs and not any(nonempty(out.box) for out in piece.outputs)
        if empty or piece.identity:               # reads nothing
            self._produce(op, piece)
            return
        if op.type == "ReadVariableOp" and not own_shard(piece, 0, self.parts.stored[op.inputs[0]][d]):
            t = op.inputs[0]
            self._read_from(t, piece.inputs[0].data, d, self.parts.stored[t], relay=False)
            self._produce(op, piece)
            return
        sem = self.entries[op.name].semantics
        if sem.updates:
            piece = narrow_update(op, sem, piece, self.parts.stored)
            if piece is None:
                return
        for i, t in enumerate(op.inputs):
            if t in self.handles and reads_values(op.type, piece, i, self.parts.stored[t][d]):
                self._read_from(t, piece.inputs[i].data, d, self.parts.stored[t], relay=False)
                continue
            if t in self.handles or i in piece.const_inputs:
                continue
            read = piece.inputs[i]
            if read is None:
                if t not in self.graph.constants:
                    self._read(t, tuple((0, s) for s in self.graph.tensors[t].shape), d)
            elif nonempty(read.data):
                self._read(t, read.data, d)
        self._produce(op, piece)

    def _produce(self, op, piece: DeviceOp) -> None:
        for o, t in enumerate(op.outputs):
            self.produced.setdefault(t, [None] * self.n)[piece.device] = piece.outputs[o].box

    # -- reads and stored boxes ------------------------------------------------------------
    def _read(self, t: str, box: Box, d: int) -> None:
        stored = self.parts.stored[t]
        if stored[d] is not None and contains(stored[d], box):
            self._use(t, d)
            return
        for e in range(self.n):
            if stored[e] is not None:
                self._use(t, e)
        self._read_from(t, box, d, stored)

    def _read_from(self, t: str, box: Box, d: int, sources: Sequence[Box | None],
                   relay: bool = True) -> None:
        """Box of t on d from per-device boxes (None: holds none): what d lacks comes
        from the holders."""
        self._receive(t, box, d, [(e, [b] if b is not None else [])
                                  for e, b in enumerate(sources)], relay)

    def _use(self, t: str, e: int) -> None:
        if (t, e) in self.used:
            return
        self.used.add((t, e))
        box = self.parts.stored[t][e]
        if t in self.partial:
            held = self._reduce(t)
            self._receive(t, box, e, list(enumerate(held)))
        else:
            produced = self.produced.get(t, [None] * self.n)
            self._receive(t, box, e, [(f, [b] if b is not None else [])
                                      for f, b in enumerate(produced)])

    def _receive(self, t: str, box: Box, d: int, holders: Sequence[tuple[int, list[Box]]],
                 relay: bool = True) -> None:
        """Device d assembles `box` of t: every element it lacks comes from the holder the
        emitter picks for it (its own first, then the longest shared level prefix). With
        `relay`, the regions devices assembled from remote cells earlier hold too (and d
        keeps this one when it received any of it)."""
        received = self.received.setdefault(t, {})
        if relay:
            holders = list(holders) + [(e, cells) for e, cells in received.items()]
        mine = [h for e, boxes in holders if e == d for h in boxes]
        if any(contains(h, box) for h in mine) or not nonempty(box):
            return
        cuts = [sorted({lo, hi} | {x for _, boxes in holders for b in boxes for x in b[k]
                                   if lo < x < hi}) for k, (lo, hi) in enumerate(box)]
        moved = False
        for cell in itertools.product(*(list(zip(c[:-1], c[1:])) for c in cuts)):
            if any(contains(h, cell) for h in mine):
                continue
            sources = [e for e, boxes in holders if any(contains(b, cell) for b in boxes)]
            if sources:
                src = max(sources, key=lambda e: (shared_prefix(self.coords[e], self.coords[d]), -e))
                self.move(t, src, d, box_volume(cell))
                moved = True
        if relay and moved:
            received.setdefault(d, []).append(box)

    # -- partial results -------------------------------------------------------------------
    def _reduce(self, t: str) -> list[list[Box]]:
        """The reduced pieces each device holds (moves priced once per tensor)."""
        if t in self.held:
            return self.held[t]
        levels, reducer = self.partial[t]
        levels = tuple(sorted(levels))
        states = [parse_state(s) for s in self.plan_states(t)]
        produced = self.produced[t]
        active = [d for d in range(self.n) if produced[d] is not None]   # its stage's
        replicas = replica_levels(self.parts, levels, produced)
        shape = self.graph.tensors[t].shape
        if all_reduces(self.use_v2, reducer, levels, states):
            targets = self._targets(t, produced, replicas, states)
            self._all_reduce(t, levels, targets, active)
            pieces = {d: [d] for d in active if targets[d] is not None}
            return self._gathered(t, pieces, replicas, states, targets)
        if exchanges(levels, states, produced, DTYPE_SIZES.get(self.graph.tensors[t].dtype, 4),
                     replicas):
            holders = active
            for steps in exchange_rounds(self.parts, t, levels, replicas, active):
                for e, group in steps:
                    for m in group:
                        self.move(t, m, e, box_volume(produced[m]))
                holders = [e for e, _ in steps]
            self.held[t] = [[produced[d]] if d in holders else [] for d in range(self.n)]
            return self.held[t]
        cut = tuple(sorted(levels + replicas))
        held = [[] for _ in range(self.n)]
        for within in reduce_regions(produced, cut, states, self.parts.ways, shape):
            for d, boxes in enumerate(self._reduce_scatter(t, within, levels, cut, states)):
                held[d].extend(boxes)
        self.held[t] = held
        return held

    def _reduce_scatter(self, t: str, produced, levels, cut, states) -> list[list[Box]]:
        """One reduction (partition.reduce_regions) of the `produced` boxes: the
        reduce-scatter over `cut`, then the all-gather; the pieces each device holds."""
        group = self.parts.group
        active = [d for d in range(self.n) if produced[d] is not None]
        targets = self._targets(t, produced, cut, states)
        pieces = {d: [e for e in group(d, cut) if targets[e] is not None]
                  for d in active}
        for level in reversed(cut):                          # reduce-scatter, inner first
            new = {}
            for d in active:
                mine = [e for e in pieces[d] if self.coords[e][level] == self.coords[d][level]]
                if level in levels:          # (a replica level: d keeps its own copy's)
                    for e in sorted(mine):
                        for m in group(d, (level,)):
                            self.move(t, m, d, box_volume(targets[e]))
                new[d] = sorted(mine)
            pieces = new
        return self._gathered(t, pieces, cut, states, targets)

    def _targets(self, t: str, produced, cut, states) -> list[Box | None]:
        """Each device's share (partition.reduce_target) of its produced box over `cut`."""
        return [None if box is None else reduce_target(
            box, cut, states, self.coords[d], self.parts.ways, self.graph.tensors[t].shape)
            for d, box in enumerate(produced)]

    def _gathered(self, t: str, pieces, levels, states, targets) -> list[list[Box]]:
        """The all-gather at the `levels` whose state is Replicated, outermost first:
        each member receives the pieces (by distinct box) it lacks; the pieces each device
        then holds, remembered for `t`."""
        for level in levels:
            if states[level].kind != "replicated":
                continue
            new = {d: list(p) for d, p in pieces.items()}
            for d in pieces:
                boxes = {targets[e] for e in new[d]}
                for m in self.parts.group(d, (level,)):
                    for e in pieces.get(m, ()):
                        if e in new[d] or targets[e] in boxes:
                            continue
                        self.move(t, m, d, box_volume(targets[e]))
                        new[d].append(e)
                        boxes.add(targets[e])
            pieces = new
        self.held[t] = [[targets[e] for e in pieces.get(d, ())] for d in range(self.n)]
        return self.held[t]

    def _all_reduce(self, t: str, levels, targets, active) -> None:
        """V2 all-reduces of each member's target: 2 (g - 1) / g of it per member."""
        itemsize = DTYPE_SIZES.get(self.graph.tensors[t].dtype, 4)
        for d in active:
            if targets[d] is None:
                continue
            group = self.parts.group(d, levels)
            size = len(group)
            nbytes = 2 * (size - 1) * box_volume(targets[d]) * itemsize // size
            src = group[(group.index(d) - 1) % size]
            if src != d and nbytes:
                self.per_level[self.level(src, d)] += nbytes
