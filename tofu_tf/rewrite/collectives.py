"""Combining partial results and gathering regions across devices.

`reduce_region` gives one device the reduction, over its group, of the partial results
the group's devices produced, restricted to the box that device stores:

- every member stores the same box (the result is replicated in the group) and it has a
  dim of at least the group's size: reduce-scatter then all-gather, as a ring all-reduce
  moves the data — member j sums chunk j from every member, then each member gathers the
  chunks — 2 (g-1)/g of the box per member;
- otherwise (the result is stored split): each member sums its own box from every member,
  a reduce-scatter, (g-1)/g of the whole per member.

On logical CPU devices the pieces travel as plain cross-device edges (TensorFlow's
Send/Recv), which keeps the byte count exact and the summation order fixed (group order),
so every member holds bit-identical values.
"""

from __future__ import annotations

import tensorflow as tf

from tofu_tf.errors import RewriteError

from tofu_tf.rewrite.partition import Box

def reduce_region(em, t: str, box: Box, d: int, group: tuple[int, ...], reducer: str,
                  op: str) -> tf.Tensor:
    produced = em.produced[t]
    ring = all(em.parts.stored[t][e] == box and _contains(produced[e].box, box)
               for e in group)
    axis = _chunk_axis(box, len(group)) if ring and len(group) > 1 else None
    if axis is not None:
        return _all_reduce(em, t, box, d, group, reducer, op, axis)

    def cell_value(cell: Box) -> tf.Tensor:
        """The reduction of a cell, over the group of the nearest device producing it."""
        holders = [e for e in range(em.n) if _contains(produced[e].box, cell)]
        if not holders:
            raise RewriteError(f"no device produced region {cell} of tensor '{t}'.",
                               node=op, fix="the plan's choices do not cover the tensor.")
        source = em._source(cell, d, produced)
        return _sum_on(em, t, cell, d, em.parts.group(source, em.partial[t][0]), reducer, op)

    return em.tile(t, box, d, [produced[e].box for e in range(em.n)], cell_value)


def _all_reduce(em, t, box, d, group, reducer, op, axis) -> tf.Tensor:
    """Reduce-scatter of `box` into chunks over the group, then all-gather on d."""
    chunks = _chunks(box, axis, len(group))
    pieces = []
    for owner, chunk in zip(group, chunks):
        key = ("chunk", t, chunk, owner)
        if key not in em.stored:
            with em._device(owner):
                em.stored[key] = _Chunk(_sum_on(em, t, chunk, owner, group, reducer, op))
        em.send("reduce", t, op, em.stored[key].tensor, owner, d, chunk)
        pieces.append(em.stored[key].tensor)
    with em._device(d):
        return tf.concat(pieces, axis, name=em._name(t.replace(":", "_") + "/gather"))


def _contains(outer: Box, inner: Box) -> bool:
    return all(a <= c and e <= b for (a, b), (c, e) in zip(outer, inner))


class _Chunk:
    def __init__(self, tensor):
        self.tensor = tensor


def _sum_on(em, t: str, box: Box, d: int, group, reducer: str, op: str) -> tf.Tensor:
    """On device d: the reduction over `group` of their partial results cut to `box`."""
    terms = []
    for e in group:
        value = em.produced[t][e]
        with em._device(e):
            terms.append(em._cut(value, box))
        em.send("reduce", t, op, terms[-1], e, d, box)
    with em._device(d):
        if len(terms) == 1:
            return terms[0]
        name = em._name(t.replace(":", "_") + "/reduce")
        if reducer in ("sum", "mean"):
            return tf.math.add_n(terms, name=name)
        combine = {"max": tf.math.maximum, "min": tf.math.minimum,
                   "prod": tf.math.multiply}[reducer]
        result = terms[0]
        for term in terms[1:]:
            result = combine(result, term)
        return tf.identity(result, name=name)


def _chunk_axis(box: Box, parts: int) -> int | None:
    """The largest dim with at least `parts` elements (None: none)."""
    sizes = [b - a for a, b in box]
    best = max(range(len(sizes)), key=lambda k: sizes[k], default=None)
    return best if best is not None and sizes[best] >= parts else None


def _chunks(box: Box, axis: int, parts: int) -> list[Box]:
    from tofu_tf.op_semantics.analysis import part_range
    a, b = box[axis]
    out = []
    for p in range(parts):
        lo, hi = part_range(b - a, parts, p)
        out.append(tuple((a + lo, a + hi + 1) if k == axis else r for k, r in enumerate(box)))
    return out
