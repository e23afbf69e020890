"""Small building blocks shared by op descriptions (no TensorFlow)."""

from __future__ import annotations

from typing import Sequence

from tofu_tf.op_semantics.tdl import Access, Const, Expr, Fn, Opaque, ReduceN, TensorRef


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


def whole_inner(ctx, inputs: Sequence[TensorRef], n: int, reason: str,
                extra: Sequence[Expr] = ()) -> None:
    """y[lead.., p..] = f(each input's innermost `n` dims, whole, at lead; `extra`) at
    position p: the leading (batch) dims split, the output's own dims past them stay whole
    (`reason`). A matrix function, a Fourier transform, a pixel's colour conversion."""
    lead = inputs[0].rank - n
    inner = len(ctx.output_shapes[0]) - lead

    def body(idx):
        wholes = [ReduceN("window", lambda *js, ref=ref: ref[tuple(idx[:lead]) + js],
                          ref.shape[lead:], names=[f"w{d}" for d in range(n)])
                  for ref in inputs]
        position = (Fn("position", *idx[lead:]),) if inner else ()
        return Opaque(ctx.type.lower(), *wholes, *extra, *position)
    ctx.compute_nd(body)
    for d in range(lead, lead + inner):
        ctx.unsplittable(f"d{d}", reason)
