"""Small building blocks shared by op descriptions (no TensorFlow)."""

from __future__ import annotations

from typing import Sequence

from tofu_tf.op_semantics.tdl import Access, Const, Expr, TensorRef


def broadcast(ref: TensorRef, index: Sequence[Expr], out_shape: Sequence[int]) -> Access:
    """NumPy broadcasting: align `ref` to the right of the output; size-1 dims read 0."""
    offset = len(out_shape) - ref.rank
    if offset < 0:
        raise ValueError(f"input of rank {ref.rank} cannot broadcast to rank {len(out_shape)}")
    idx = []
    for d, size in enumerate(ref.shape):
        out_size = out_shape[offset + d]
        idx.append(Const(0) if size == 1 and out_size != 1 else index[offset + d])
    return ref[tuple(idx)]


def normalize_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def normalize_axes(axes, rank: int) -> tuple[int, ...]:
    """Axes as a sorted tuple of non-negative ints (a scalar or a list)."""
    try:
        items = list(axes)
    except TypeError:
        items = [axes]
    return tuple(sorted({normalize_axis(int(a), rank) for a in items}))
