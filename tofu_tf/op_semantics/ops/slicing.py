"""Slices and pads: Slice, StridedSlice (every mask), StridedSliceGrad, Pad, PadV2, MirrorPad,
MirrorPadGrad.

A slice reads `begin + stride * i`, a pad reads `i - before` (or a fill, or a reflection),
so every output dim splits and each input is cut to the part's preimage. The hooks rewrite
begin/end/strides and paddings relative to the fetched region and to the edges a part
touches.
"""

from __future__ import annotations

import numpy as np

from tofu_tf.op_semantics.hooks import (const_ints, const_ints_of, set_item, sizes, crop_or_none, shifted)
from tofu_tf.op_semantics.localize import replace
from tofu_tf.op_semantics.registry import semantics
from tofu_tf.op_semantics.tdl import Const, Eq, Fn, Maximum, Minimum, Opaque, ReduceN, where

# -- slices ---------------------------------------------------------------------------------


def _slice_local(ctx, local):
    """Local begin = where the part's share starts in the fetched region; size = share."""
    begin = const_ints(ctx.sem, 1)
    share, fetched = local.output_slices[0], local.input_slices[0]
    local_begin = [b + s - a for b, (s, _), (a, _) in zip(begin, share, fetched)]
    return replace(local, const_inputs={1: np.asarray(local_begin, dtype=np.int64),
                                        2: np.asarray(sizes(share), dtype=np.int64)})


@semantics("Slice", localize=_slice_local)
def slice_(ctx):
    x = ctx.inputs[0]
    begin = const_ints_of(ctx, 1)
    ctx.const(2)
    ctx.compute_nd(lambda idx: x[tuple(shifted(v, b) for v, b in zip(idx, begin))])


MASKS = ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")


def _dim_entry(size, dim, begin, end, stride, bit, masks):
    """One x dim of a strided slice, canonicalised as TensorFlow's ValidateStridedSliceOp."""
    if masks["shrink_axis_mask"] & bit:
        return ("shrink", dim, begin + size if begin < 0 else begin)
    valid = (0, size) if stride > 0 else (-1, size - 1)

    def canonical(x, masked, which):
        if masked:
            return valid[which] if stride > 0 else valid[1 - which]
        x = x + size if x < 0 else x
        return min(max(x, valid[0]), valid[1])
    start = canonical(begin, masks["begin_mask"] & bit, 0)
    length = canonical(end, masks["end_mask"] & bit, 1) - start
    if length == 0 or (length < 0) != (stride < 0):
        return ("range", dim, start, stride, 0)
    return ("range", dim, start, stride, length // stride + (1 if length % stride else 0))


def strided_spec(shape, begin, end, strides, attrs) -> list[tuple]:
    """TensorFlow's dense slice spec, in output order: ("new",) a size-1 output dim,
    ("shrink", dim, index) no output dim, ("range", dim, start, stride, size)."""
    masks = {m: int(attrs.get(m) or 0) for m in MASKS}
    begin, end, strides = list(begin), list(end), list(strides)
    ellipsis = masks["ellipsis_mask"]
    if not ellipsis:                      # an implicit ellipsis at the end
        ellipsis = 1 << len(begin)
        begin, end, strides = begin + [0], end + [0], strides + [1]
    n, first = len(begin), (ellipsis & -ellipsis).bit_length() - 1
    new_after = sum(1 for i in range(first + 1, n) if masks["new_axis_mask"] >> i & 1)
    entries, dim = [], 0
    for i in range(n):
        bit = 1 << i
        if ellipsis & bit:
            stop = min(len(shape) - (n - i) + 1 + new_after, len(shape))
            entries += [("range", d, 0, 1, shape[d]) for d in range(dim, stop)]
            dim = max(dim, stop)
        elif masks["new_axis_mask"] & bit:
            entries.append(("new",))
        else:
            entries.append(_dim_entry(shape[dim], dim, begin[i], end[i], strides[i], bit, masks))
            dim += 1
    return entries


def _spec(ctx, shape) -> list[tuple]:
    return strided_spec(shape, const_ints_of(ctx, 1), const_ints_of(ctx, 2), const_ints_of(ctx, 3), ctx.attrs)


def _sem_spec(sem, shape) -> list[tuple]:
    return strided_spec(shape, const_ints(sem, 1), const_ints(sem, 2), const_ints(sem, 3),
                        sem.attrs)


def _spec_shape(entries) -> tuple[int, ...]:
    return tuple(1 if e[0] == "new" else e[4] for e in entries if e[0] != "shrink")


def _local_range(first: int, stride: int, count: int) -> tuple[int, int, bool]:
    """(begin, end, end masked) that take `count` elements from `first` by `stride`."""
    if count == 0:
        return 0, 0, False
    end = first + stride * (count - 1) + (1 if stride > 0 else -1)
    return first, max(end, 0), end < 0


class _LocalSpec:
    """A mask-free local strided-slice spec, built entry by entry."""

    def __init__(self):
        self.begin, self.end, self.strides = [], [], []
        self.masks = dict.fromkeys(MASKS, 0)

    def add(self, begin, end, stride, mask=None, end_masked=False):
        bit = 1 << len(self.begin)
        self.begin.append(begin), self.end.append(end), self.strides.append(stride)
        if mask:
            self.masks[mask] |= bit
        if end_masked:
            self.masks["end_mask"] |= bit

    def apply(self, local, **changes):
        consts = {**local.const_inputs,
                  **{i + 1: np.asarray(v, dtype=np.int64)
                     for i, v in enumerate((self.begin, self.end, self.strides))}}
        return replace(local, attrs={**local.attrs, **self.masks}, const_inputs=consts,
                       **changes)


def _strided_slice_local(ctx, local):
    """Rewrite the spec relative to the fetched region, without ellipsis or begin masks."""
    entries = _sem_spec(ctx.sem, ctx.sem.input_shapes[0])
    share, fetched = local.output_slices[0], local.input_slices[0]
    spec, out = _LocalSpec(), iter(share)
    for entry in entries:
        if entry[0] == "new":
            next(out)
            spec.add(0, 1, 1, "new_axis_mask")
        elif entry[0] == "shrink":
            _, d, index = entry
            spec.add(index - fetched[d][0], index - fetched[d][0] + 1, 1, "shrink_axis_mask")
        else:
            _, d, start, stride, _ = entry
            first, stop = next(out)
            b, e, masked = _local_range(start + stride * first - fetched[d][0], stride,
                                        stop - first)
            spec.add(b, e, stride, end_masked=masked)
    return spec.apply(local)


@semantics("StridedSlice", localize=_strided_slice_local)
def strided_slice(ctx):
    """y[i] = x[start + stride * i] per sliced dim, a fixed index on shrunk dims."""
    x = ctx.inputs[0]
    entries = _spec(ctx, x.shape)
    if _spec_shape(entries) != ctx.output_shapes[0]:
        ctx.fail(f"the slice spec gives shape {list(_spec_shape(entries))}, TensorFlow "
                 f"{list(ctx.output_shapes[0])}.")

    def body(idx):
        out, index = iter(idx), [None] * x.rank
        for entry in entries:
            if entry[0] == "new":
                next(out)
            elif entry[0] == "shrink":
                index[entry[1]] = Const(entry[2])
            else:
                index[entry[1]] = shifted(next(out), entry[2], entry[3])
        return x[tuple(index)]
    ctx.compute_nd(body)


def _grid_in(start, stride, count, lo, stop) -> tuple[int, int]:
    """Half-open [t0, t1) of the t in [0, count) with lo <= start + stride*t < stop."""
    if stride > 0:
        t0, t1 = -(-(lo - start) // stride), (stop - 1 - start) // stride + 1
    else:
        t0, t1 = -(-(start - stop + 1) // -stride), (start - lo) // -stride + 1
    t0, t1 = max(t0, 0), min(t1, count)
    return t0, max(t0, t1)


def _strided_slice_grad_local(ctx, local):
    """The part's shape and a spec over the grid points inside it; dy narrowed to them. A
    shrunk index outside the part writes to one extra slot that the crop drops."""
    shape = const_ints(ctx.sem, 0)
    share = local.output_slices[0]
    local_shape = sizes(share)
    dy_slices = list(local.input_slices[4])
    spec, dy_dim = _LocalSpec(), 0
    for entry in _sem_spec(ctx.sem, shape):
        if entry[0] == "new":
            spec.add(0, 1, 1, "new_axis_mask")
        elif entry[0] == "shrink":
            _, d, index = entry
            position = index - share[d][0]
            if not 0 <= position < share[d][1] - share[d][0]:
                position = share[d][1] - share[d][0]        # one slot past the share
                local_shape[d] = position + 1
            spec.add(position, position + 1, 1, "shrink_axis_mask")
            continue
        else:
            _, d, start, stride, count = entry
            t0, t1 = _grid_in(start, stride, count, *share[d])
            dy_slices[dy_dim] = (t0, t1)
            b, e, masked = _local_range(start + stride * t0 - share[d][0], stride, t1 - t0)
            spec.add(b, e, stride, end_masked=masked)
        dy_dim += 1
    crop = crop_or_none([(0, b - a) for a, b in share], local_shape)
    local = replace(local, const_inputs={0: np.asarray(local_shape, dtype=np.int64)},
                    input_slices=set_item(local.input_slices, 4, tuple(dy_slices)))
    return spec.apply(local, output_crops=(crop,))


@semantics("StridedSliceGrad", localize=_strided_slice_grad_local)
def strided_slice_grad(ctx):
    """dx[i] = dy[t] where i = start + stride * t on every sliced dim (and i is the index on
    shrunk dims), else 0: a part reads the dy rows whose grid points fall inside it."""
    shape = const_ints_of(ctx, 0)
    dy = ctx.inputs[4]
    entries = _spec(ctx, shape)

    def body(idx):
        index, conds = [], []
        for entry in entries:
            if entry[0] == "new":
                index.append(Const(0))
            elif entry[0] == "shrink":
                conds.append(Eq(idx[entry[1]], entry[2]))
            else:
                _, d, start, stride, count = entry
                offset = shifted(idx[d], -start) if stride > 0 else start - idx[d]
                step = abs(stride)
                index.append(offset if step == 1 else offset // step)
                conds += [offset >= 0, offset < step * (count - 1) + 1]
                if step > 1:
                    conds.append(Eq(offset % step, 0))
        value = dy[tuple(index)]
        for cond in conds:
            value = where(cond, value, 0)
        return value
    ctx.compute_nd(body)


# -- padding --------------------------------------------------------------------------------


def _pad_local(ctx, local):
    """Local paddings: the part of the share before and after the fetched x region."""
    paddings = np.asarray(ctx.sem.constants[1]).reshape(-1, 2)
    local_pads = []
    for (start, stop), (a, b), before in zip(local.output_slices[0], local.input_slices[0],
                                             paddings[:, 0]):
        lead = a + int(before) - start if b > a else stop - start
        local_pads.append((lead, stop - start - lead - (b - a)))
    return replace(local, const_inputs={**local.const_inputs,
                                        1: np.asarray(local_pads, dtype=np.int64)})


def _pad(ctx, fill) -> None:
    """y[i] = x[i - before] where that is inside x, else the fill."""
    x = ctx.inputs[0]
    paddings = np.asarray(ctx.const(1)).reshape(-1, 2).tolist()

    def body(idx):
        index, conds = [], []
        for d, (before, after) in enumerate(paddings):
            j = shifted(idx[d], -before)
            index.append(j)
            conds += ([j >= 0] if before else []) + ([j < x.shape[d]] if after else [])
        value = x[tuple(index)]
        for cond in conds:
            value = where(cond, value, fill)
        return value
    ctx.compute_nd(body)


@semantics("Pad", localize=_pad_local)
def pad(ctx):
    _pad(ctx, 0)


@semantics("PadV2", localize=_pad_local)
def pad_v2(ctx):
    _pad(ctx, ctx.inputs[2][()])


def _mirror(j, size: int, symmetric: bool):
    """The reflected source index of j (REFLECT skips the edge row, SYMMETRIC repeats it)."""
    e = int(symmetric)
    return Minimum(Maximum(j, -j - e), 2 * size - 2 + e - j)


def mirror_window(start, stop, before, size, symmetric):
    """For a share [start, stop) of a mirror-padded dim: the x rows [a, b) it needs, the
    local (before, after) paddings, and the crop of the local result."""
    if stop <= start:                       # an empty share (an uneven split's last part)
        return (0, 0), (0, 0), (0, 0)
    t = np.arange(start, stop) - before
    e = int(symmetric)
    source = np.minimum(np.maximum(t, -t - e), 2 * size - 2 + e - t)
    touches_before, touches_after = start < before, stop > before + size
    a = 0 if touches_before else int(source.min())
    b = size if touches_after else int(source.max()) + 1
    lead = before - start if touches_before else 0
    trail = stop - before - size if touches_after else 0
    origin = before + a - lead              # global row of local row 0
    return (a, b), (lead, trail), (start - origin, stop - origin)


def _mirror_pad_local(ctx, local):
    """Fetch just the rows the share reflects or copies; pad locally only at the edges the
    share touches (a halo the intervals cannot express: |j| is not affine)."""
    paddings = np.asarray(ctx.sem.constants[1]).reshape(-1, 2)
    symmetric = str(ctx.sem.attrs.get("mode", "REFLECT")).upper() == "SYMMETRIC"
    slices, local_pads, crops, local_y = [], [], [], []
    for (start, stop), (before, _), size in zip(local.output_slices[0], paddings,
                                                ctx.sem.input_shapes[0]):
        rows, pads, crop = mirror_window(start, stop, int(before), size, symmetric)
        slices.append(rows), local_pads.append(pads), crops.append(crop)
        local_y.append(rows[1] - rows[0] + sum(pads))
    return replace(local, input_slices=set_item(local.input_slices, 0, tuple(slices)),
                   const_inputs={1: np.asarray(local_pads, dtype=np.int64)},
                   output_crops=(crop_or_none(crops, local_y),))


@semantics("MirrorPad", localize=_mirror_pad_local)
def mirror_pad(ctx):
    """y[i] = x[m(i - before)], m the reflection at both edges (min/max of affine forms)."""
    x = ctx.inputs[0]
    paddings = np.asarray(ctx.const(1)).reshape(-1, 2).tolist()
    symmetric = str(ctx.attr("mode", "REFLECT")).upper() == "SYMMETRIC"
    ctx.compute_nd(lambda idx: x[tuple(
        _mirror(shifted(v, -before), x.shape[d], symmetric) if before or after else v
        for d, (v, (before, after)) in enumerate(zip(idx, paddings)))])


MIRROR_GRAD_REASON = ("MirrorPadGrad folds the reflected rows back onto the rows they mirror: "
                      "a part of a padded dim inside the reflected rows is not a "
                      "MirrorPadGrad of a part of the gradient")


@semantics("MirrorPadGrad")
def mirror_pad_grad(ctx):
    """dx[i] sums the gradient at i's own padded position and at those that reflect it. The
    padded dims stay whole (each reads its whole row of the gradient); the others split,
    each part with the op's own paddings."""
    grad = ctx.inputs[0]
    paddings = np.asarray(ctx.const(1)).reshape(-1, 2).tolist()
    padded = [d for d, (before, after) in enumerate(paddings) if before or after]

    def body(idx):
        if not padded:
            return grad[idx]

        def row(*js):
            at = dict(zip(padded, js))
            return grad[tuple(at.get(d, v) for d, v in enumerate(idx))]
        rows = ReduceN("window", row, [grad.shape[d] for d in padded],
                       names=[f"p{d}" for d in padded])
        return Opaque("mirror_pad_grad", rows, Fn("position", *(idx[d] for d in padded)))
    ctx.compute_nd(body)
    for d in padded:
        ctx.unsplittable(f"d{d}", MIRROR_GRAD_REASON)
