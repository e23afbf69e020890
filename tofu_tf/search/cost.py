"""The cost of one k-way cut: bytes moved between the k parts.

A stored tensor of shape (n_0, ..., n_{r-1}) with N elements of `itemsize` bytes is in one
state: Split(d) — part p holds the p-th uneven slice of dim d (`part_range`) — or R, every
part holds all of it. Partial(reducer) is only produced by an op; it is reduced before it
is stored. H_p(X) is the box part p holds in state X.

Fetch — op input read as the boxes R_p (one per part) from state X:
    bytes = itemsize * sum_p (|R_p| - |R_p ∩ H_p(X)|)
  (halo, all-gather and all-to-all are all this one formula.)
Convert — op output produced as boxes B_p (Split or R), stored in state X:
    bytes = itemsize * sum_p (|H_p(X)| - |H_p(X) ∩ B_p|)
Convert — a Partial output (ring collectives, k parts):
    stored Split(d): reduce-scatter, bytes = itemsize * (k - 1) * N
    stored R:        all-reduce,     bytes = itemsize * 2 * (k - 1) * N
A view (problem.with_views: what the ops that share a tensor read it through) may also be
G(d): assembled whole on every part once, from what the parts produced (its conversion
R's, a Partial one the all-reduce), its fetches nothing; stored as Split(d) (memory).
With a topology level, time = bytes / (k * bandwidth) + latency per transfer: the k parts
move their shares in parallel over their own links.

The volumes |R_p ∩ H_p(X)| for every state X at once are the inner loop of the search;
`overlaps` computes them for a whole batch of regions, in C++ when the custom op is built
(tofu_tf/cc) and in NumPy otherwise, with identical answers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from tofu_tf.cc import cost_op
from tofu_tf.op_semantics.analysis import REPLICATED, OutputState, Split, part_range

Box = tuple[tuple[int, int], ...]          # half-open [start, stop) per dim

# Ring collectives move each element this many times per (k - 1) parts:
REDUCE_SCATTER_FACTOR = 1
ALL_REDUCE_FACTOR = 2        # reduce-scatter, then all-gather


@functools.lru_cache(maxsize=None)
def tensor_states(shape: tuple[int, ...], k: int, replicate_below: int | None = 0,
                  gathers: bool = False) -> tuple[OutputState, ...]:
    """Stored states of a tensor at a k-way cut: Split(d) for every dim of size >= k; R
    only for a tensor that cannot be split or has fewer than `replicate_below` elements
    (None: always allowed). Every other tensor is stored partitioned; with `gathers`, also
    G(d) for each of its splits: stored as Split(d) and assembled whole on every part
    once, for all the ops that read it (last, so that ties keep the plain states)."""
    splits = tuple(Split(d) for d, n in enumerate(shape) if n >= k)
    if replicate_below is None or not splits or \
            int(np.prod(shape, dtype=np.int64)) < replicate_below:
        return splits + (REPLICATED,)
    if gathers:
        return splits + tuple(gathered(s) for s in splits)
    return splits


def gathered(state: OutputState) -> OutputState:
    """G(d) of Split(d); the plain Split(d) of G(d) is `stored(...)`."""
    return OutputState("split", dim=state.dim, gathered=True)


def stored(state: OutputState) -> OutputState:
    """What a state keeps on each part: Split(d) for G(d), else the state itself."""
    return Split(state.dim) if state.gathered else state


def held_box(shape: tuple[int, ...], state: OutputState, k: int, part: int) -> Box:
    box = [(0, n) for n in shape]
    if state.kind == "split":
        lo, hi = part_range(shape[state.dim], k, part)
        box[state.dim] = (lo, hi + 1)
    return tuple(box)


def box_volume(box: Box) -> int:
    return int(math.prod([max(b - a, 0) for a, b in box]))


def union_volume(boxes) -> int:
    """The volume of the union of `boxes`, by inclusion-exclusion over the intersections
    that are not empty (boxes of parts meet their neighbours only: few are)."""
    boxes = [box for box in dict.fromkeys(boxes) if box_volume(box)]

    def meet(one: Box, other: Box) -> Box | None:
        out = []
        for (a, b), (c, d) in zip(one, other):
            start, stop = (a if a > c else c), (b if b < d else d)
            if stop <= start:
                return None
            out.append((start, stop))
        return tuple(out)

    def after(start: int, common: Box, sign: int) -> int:
        total = 0
        for i in range(start, len(boxes)):
            both = meet(common, boxes[i])
            if both is not None:
                total += sign * box_volume(both) + after(i + 1, both, -sign)
        return total
    return sum(box_volume(box) + after(i + 1, box, -1) for i, box in enumerate(boxes))


def part_bounds(n: int, k: int) -> np.ndarray:
    """[k, 2] half-open bounds of the uneven k-way split of n."""
    base, extra = divmod(n, k)
    sizes = np.full(k, base, dtype=np.int64)
    sizes[:extra] += 1
    stops = np.cumsum(sizes)
    return np.stack([stops - sizes, stops], axis=1)


def partners(boxes: np.ndarray, shapes: np.ndarray, k: int) -> np.ndarray:
    """Transfers as the emitter makes them, for boxes [M, k, D, 2] (part p's box of entry
    m) and shapes [M, D]: in column d < D, the (p, q != p) pairs where part q's slice of
    dim d (Split(d)) meets p's nonempty box — one message each way the box is cut across
    holders; in column D, (k - 1) x the nonempty boxes — each sent to every other part (a
    gather into R). Returns int64 [M, D + 1]."""
    m, _, d, _ = boxes.shape
    nonempty = np.all(boxes[..., 1] > boxes[..., 0], axis=2)             # [M, k]
    out = np.empty((m, d + 1), dtype=np.int64)
    out[:, d] = (k - 1) * nonempty.sum(axis=1)
    parts = np.arange(k)[None, :]
    for dim in range(d):
        base, extra = np.divmod(shapes[:, dim], k)
        base, extra = np.maximum(base, 1)[:, None], extra[:, None]       # [M, 1]
        boundary = extra * (base + 1)

        def part_of(x):
            return np.where(x < boundary, x // (base + 1), extra + (x - boundary) // base)
        first = part_of(boxes[:, :, dim, 0])
        last = np.minimum(part_of(boxes[:, :, dim, 1] - 1), k - 1)
        mine = (first <= parts) & (parts <= last)
        out[:, dim] = np.where(nonempty, last - first + 1 - mine, 0).sum(axis=1)
    return out


def overlaps(boxes: np.ndarray, shapes: np.ndarray, k: int) -> np.ndarray:
    """The overlap volumes of `tofu_tf.cc.reference.overlaps_numpy`, through the C++ op
    when it is available."""
    return cost_op.overlaps(boxes, shapes, k)


@dataclass(frozen=True)
class CostModel:
    """Byte costs of one k-way cut; with a bandwidth, also time."""
    k: int

    def fetch_bytes(self, shape, itemsize: int, regions: list[Box]) -> np.ndarray:
        """Bytes to fetch per-part regions, one entry per state of
        `tensor_states(shape, k, None)` (every split, then R)."""
        vols = self._state_overlaps(shape, regions)
        return itemsize * (vols[-1] - vols)

    def convert_bytes(self, shape, itemsize: int, produced: OutputState,
                      produced_boxes: list[Box] | None) -> np.ndarray:
        """Bytes to store an output produced in `produced`, one entry per state of
        `tensor_states(shape, k, None)`."""
        states = tensor_states(tuple(shape), self.k, None)
        n = int(np.prod(shape, dtype=np.int64))
        if produced.kind == "partial":
            return itemsize * (self.k - 1) * n * np.array(
                [ALL_REDUCE_FACTOR if s.kind == "replicated" else REDUCE_SCATTER_FACTOR
                 for s in states], dtype=np.int64)
        if produced.kind == "replicated":
            return np.zeros(len(states), dtype=np.int64)
        vols = self._state_overlaps(shape, produced_boxes)
        held = np.array([sum(box_volume(held_box(tuple(shape), s, self.k, p))
                             for p in range(self.k)) for s in states], dtype=np.int64)
        return itemsize * (held - vols)

    def _state_overlaps(self, shape, regions: list[Box]) -> np.ndarray:
        """sum_p |R_p ∩ H_p(X)| for X in tensor_states(shape), in that order."""
        shape = tuple(shape)
        rank = max(len(shape), 1)
        boxes = np.zeros((1, self.k, rank, 2), dtype=np.int64)
        boxes[..., 1] = 1
        for p, box in enumerate(regions):
            for d, (a, b) in enumerate(box):
                boxes[0, p, d] = (a, b)
        shapes = np.ones((1, rank), dtype=np.int64)
        shapes[0, :len(shape)] = shape
        vols = overlaps(boxes, shapes, self.k)[0]
        keep = [rank if s.kind == "replicated" else s.dim
                for s in tensor_states(shape, self.k, None)]
        return vols[keep]

    @staticmethod
    def seconds(num_bytes: float, k: int, bandwidth: float, latency: float,
                transfers: int = 1) -> float:
        """Time of a cut's transfers: k parts move their shares over their own links."""
        return num_bytes / (k * bandwidth) + latency * transfers
