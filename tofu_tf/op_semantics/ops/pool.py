"""Pooling: MaxPool, AvgPool and their gradients, 2-D and 3-D (MaxPool and its gradient also
as V2), and MaxPool's second-order gradient (MaxPoolGradGrad: a gradient penalty through a
max pool).

Per spatial dim, output o pools input o*s + k - p over taps k (stride s, padding p):

    MaxPool  y[n, o, c]  = Max(k: x.padded(-inf)[n, o*s + k - p, c])
    AvgPool  y[n, o, c]  = Sum(k: x[n, o*s + k - p, c], in range) / (taps in range)
    grads    dx[n, i, c] = Sum(k: dy[n, (i + p - k) / s, c] routed to tap k)

Every output dim splits with a halo. MaxPool's taps are a partial max (the local op runs
VALID over a region padded with -inf); unpadded AvgPool's taps are a partial mean. A SAME
average divides by the in-range count, so a zero-padded VALID part is wrong at the
borders: such a part runs SAME itself on a region that starts at a multiple of s and ends
where the input does modulo s, so its own padding equals the global one, and is cropped.
"""

from __future__ import annotations

import numpy as np

from tofu_tf.errors import PartitionError
from tofu_tf.op_semantics.analysis import top_reduce
from tofu_tf.op_semantics.hooks import zero_padded
from tofu_tf.op_semantics.localize import replace
from tofu_tf.op_semantics.registry import semantics
from tofu_tf.op_semantics.ops.conv import (Layout, axes_or_fail, compute_layout, gated,
                                           int_const, layout_from, layout_of, own_window,
                                           transposed_window, valid_attrs, window_axes)
from tofu_tf.op_semantics.tdl import Eq, Fn, Maximum, Minimum, Opaque, ReduceN

SAME_AVERAGE_REASON = ("SAME average pooling divides each window by its in-range count; "
                       "a part of the window cannot be rescaled by one factor")
ARGMAX_REASON = ("the kernel routes each window's gradient to the window's first maximum; "
                 "it cannot keep only some of the window's taps")


# -- geometry --------------------------------------------------------------------------


# The V2 ops take ksize and strides as constant inputs: their indices.
WINDOW_INPUTS = {"MaxPoolV2": (1, 2), "MaxPoolGradV2": (3, 4), "MaxPoolGradGradV2": (3, 4)}


def _pool_attrs(ctx) -> dict:
    """Attrs with ksize and strides (read from the constant inputs of the V2 ops)."""
    if ctx.type not in WINDOW_INPUTS:
        return ctx.attrs
    ksize, strides = (ctx.const(i) for i in WINDOW_INPUTS[ctx.type])
    return {**ctx.attrs, "ksize": tuple(int(v) for v in ksize),
            "strides": tuple(int(v) for v in strides)}


def _kernel(attrs, layout: Layout) -> tuple[int, ...]:
    ksize = tuple(attrs.get("ksize") or ())
    if len(ksize) != layout.rank or ksize[0] != 1 or ksize[layout.channel] != 1:
        raise ValueError(f"ksize {list(ksize)} must have {layout.rank} entries, 1 over batch "
                         "and channels (depth pooling is not described).")
    return tuple(int(ksize[d]) for d in layout.spatial)


def _axes(ctx, attrs, layout, in_shape, out_shape):
    try:
        kernel = _kernel(attrs, layout)
    except ValueError as err:
        ctx.fail(str(err))
    return axes_or_fail(ctx, attrs, layout, in_shape, out_shape, kernel)


def _hook_axes(sem, in_shape, out_shape):
    attrs = dict(sem.attrs)
    if sem.op_type in WINDOW_INPUTS:
        ksize, strides = (sem.constants[i] for i in WINDOW_INPUTS[sem.op_type])
        attrs.update(ksize=tuple(int(v) for v in ksize), strides=tuple(int(v) for v in strides))
    layout = layout_from(attrs, len(in_shape))
    return layout, window_axes(attrs, layout, in_shape, out_shape, _kernel(attrs, layout))


def _padded(axes) -> bool:
    return any(a.pad or a.pad_end for a in axes)


def _tap_names(layout: Layout, prefix: str = "k") -> tuple[str, ...]:
    return tuple(prefix + n for n in layout.spatial_names)


def _local_ksize(ctx, layout: Layout) -> tuple[int, ...]:
    """The part's window: the taps of the split tap variable, all taps elsewhere."""
    taps = {v.name: v.extent for v in top_reduce(ctx.sem.computes[0].body).vars}
    return layout.pack(1, [_tap_part(ctx, n, taps[n])[1] for n in _tap_names(layout)], 1)


def _tap_part(ctx, name: str, extent: int) -> tuple[int, int]:
    """(first tap, number of taps) of the part in the tap variable `name`."""
    strategy = ctx.strategy
    if strategy is not None and strategy.kind == "reduce" and strategy.var == name:
        lo, hi = ctx.part_range
        return lo, hi - lo + 1
    return 0, extent


def _count(axes, outs):
    """How many taps of the window of outputs `outs` are in range."""
    count = 1
    for axis, o in zip(axes, outs):
        count = count * (Minimum(o * axis.stride - axis.pad + axis.kernel, axis.size)
                         - Maximum(o * axis.stride - axis.pad, 0))
    return count


def _aligned_tile(axis) -> tuple[int, int]:
    """(lead, extent): output o's tile is input rows o*s - lead + [0, extent).

    lead = s*ceil(p/s) puts the tile's start on a multiple of s; the tile ends c - 1 past
    o*s with c >= K - p and c = size (mod s). A part whose region is a union of tiles
    (clamped) is a valid SAME input whose own padding equals the global p.
    """
    s, need = axis.stride, axis.kernel - axis.pad
    lead = s * -(-axis.pad // s)
    return lead, lead + need + (axis.size - need) % s


# -- max pooling ----------------------------------------------------------------------


def _max_pool_local(ctx, local):
    """VALID over the -inf padded region, with the part's taps."""
    sem = ctx.sem
    layout = layout_from(sem.attrs, len(sem.input_shapes[0]))
    ksize = _local_ksize(ctx, layout)
    whole_taps = ctx.strategy is None or ctx.strategy.kind != "reduce"
    own = own_window(sem, local, (0,), layout.spatial, filter_input=None) if whole_taps else None
    local = own or local            # split on batch or channels: the op's own padding
    attrs = local.attrs if own else valid_attrs(local.attrs)
    if sem.op_type == "MaxPoolV2":
        return replace(local, attrs=attrs, const_inputs={1: int_const(ksize)})
    return replace(local, attrs={**attrs, "ksize": ksize})


@semantics("MaxPool", "MaxPoolV2", "MaxPool3D", localize=_max_pool_local)
def max_pool(ctx):
    """y[n, o.., c] = Max(k..: x.padded(-inf)[n, o*s + k - p, c])."""
    x = ctx.inputs[0]
    layout = layout_of(ctx, x.rank)
    axes = _axes(ctx, _pool_attrs(ctx), layout, x.shape, ctx.output_shapes[0])
    xp = x.padded(-np.inf)

    def body(n, outs, c):
        return ReduceN("max", lambda *taps: xp[layout.pack(
            n, [a.tap(o, k) for a, o, k in zip(axes, outs, taps)], c)],
            [a.kernel for a in axes], names=_tap_names(layout))
    compute_layout(ctx, layout, ("n", _tap_names(layout, "o"), "c"), body)


def _max_pool_grad_local(ctx, local):
    """Fetch x for exactly the windows of the part's dy rows, run VALID, crop.

    Rows past the last window (a stride longer than the window leaves gaps) get no
    gradient; they arrive as -inf padding so the local op still spans the part.
    """
    sem = ctx.sem
    layout, axes = _hook_axes(sem, sem.input_shapes[0], sem.input_shapes[2])
    own = own_window(sem, local, (0, 1, 2), layout.spatial, filter_input=None)
    if own is not None:             # split on batch or channels: the op's own padding
        return own
    slices, pads = list(local.input_slices[0]), list(local.input_pads[0])
    out = local.output_slices[0]
    crop = [(0, b - a) for a, b in out]
    for axis, dim in zip(axes, layout.spatial):
        first, stop = ctx.requested[2][dim]
        length, crop[dim] = transposed_window(axis, out[dim][0], out[dim][1] - 1, first,
                                              stop - 1, 0, axis.kernel)
        start = first * axis.stride - axis.pad
        windows_end = (stop - 1) * axis.stride + axis.kernel - axis.pad
        begin = min(max(start, 0), axis.size)
        slices[dim] = (begin, max(min(windows_end, axis.size), begin))
        pads[dim] = (slices[dim][0] - start, start + length - slices[dim][1])
    return replace(local, attrs=valid_attrs(local.attrs),
                   input_slices=(tuple(slices), *local.input_slices[1:]),
                   input_pads=(tuple(pads), *local.input_pads[1:]),
                   output_crops=(tuple(crop),))


@semantics("MaxPoolGrad", "MaxPoolGradV2", "MaxPool3DGrad", localize=_max_pool_grad_local)
def max_pool_grad(ctx):
    """dx[n, i.., c] = Sum(k..: dy[n, o.., c] where o = (i + p - k) / s and tap k is the
    first maximum y[n, o.., c] of o's window) -- which reads o's whole window."""
    x, y, dy = ctx.inputs[:3]
    layout = layout_of(ctx, x.rank)
    axes = _axes(ctx, _pool_attrs(ctx), layout, x.shape, dy.shape)
    xp, yp, dyp = x.padded(-np.inf), y.padded(-np.inf), dy.padded(0)
    kernel = [a.kernel for a in axes]

    def body(n, ins, c):
        def term(*taps):
            outs = [a.source(i, k) for a, i, k in zip(axes, ins, taps)]
            window = ReduceN("window", lambda *ws: xp[layout.pack(
                n, [a.tap(o, w) for a, o, w in zip(axes, outs, ws)], c)],
                kernel, names=_tap_names(layout, "w"))
            first = Opaque("first_max_position", yp[layout.pack(n, outs, c)], window)
            flat = 0
            for k, size in zip(taps, kernel):
                flat = flat * size + k
            routed = [*(a.hits(i, k) for a, i, k in zip(axes, ins, taps)), Eq(first, flat)]
            return gated(routed, dyp[layout.pack(n, outs, c)])
        return ReduceN("sum", term, kernel, names=_tap_names(layout))
    compute_layout(ctx, layout, ("n", layout.spatial_names, "c"), body)
    for name in _tap_names(layout):
        ctx.unsplittable(name, ARGMAX_REASON)


def _max_pool_grad_grad_local(ctx, local):
    """As MaxPool's: VALID over x's region padded with -inf and the gradient's with zeros
    (the taps are whole); the op's own padding where the spatial dims arrive whole."""
    sem = ctx.sem
    layout = layout_from(sem.attrs, len(sem.input_shapes[0]))
    own = own_window(sem, local, (0, 2), layout.spatial, filter_input=None)
    return own or replace(local, attrs=valid_attrs(local.attrs))


@semantics("MaxPoolGradGrad", "MaxPoolGradGradV2", "MaxPool3DGradGrad",
           localize=_max_pool_grad_grad_local)
def max_pool_grad_grad(ctx):
    """ddy[n, o.., c] = Sum(k..: dgrad[n, o*s + k - p, c] where tap k is the first maximum
    y[n, o.., c] of o's window of x): MaxPoolGrad's gradient with respect to its dy."""
    x, y, grad = ctx.inputs[:3]
    layout = layout_of(ctx, x.rank)
    axes = _axes(ctx, _pool_attrs(ctx), layout, x.shape, y.shape)
    xp, gp = x.padded(-np.inf), grad.padded(0)
    kernel = [a.kernel for a in axes]

    def body(n, outs, c):
        window = ReduceN("window", lambda *ws: xp[layout.pack(
            n, [a.tap(o, w) for a, o, w in zip(axes, outs, ws)], c)],
            kernel, names=_tap_names(layout, "w"))
        first = Opaque("first_max_position", y[layout.pack(n, outs, c)], window)

        def term(*taps):
            flat = 0
            for k, size in zip(taps, kernel):
                flat = flat * size + k
            return gated([Eq(first, flat)], gp[layout.pack(
                n, [a.tap(o, k) for a, o, k in zip(axes, outs, taps)], c)])
        return ReduceN("sum", term, kernel, names=_tap_names(layout))
    compute_layout(ctx, layout, ("n", _tap_names(layout, "o"), "c"), body)
    for name in _tap_names(layout):
        ctx.unsplittable(name, ARGMAX_REASON)


# -- average pooling --------------------------------------------------------------------


def _avg_pool_local(ctx, local):
    """Unpadded: VALID with the part's taps. Padded: SAME on the aligned region, cropped."""
    sem = ctx.sem
    layout, axes = _hook_axes(sem, sem.input_shapes[0], sem.output_shapes[0])
    if not _padded(axes):
        return replace(local, attrs={**valid_attrs(local.attrs),
                                     "ksize": _local_ksize(ctx, layout)})
    crop = [(0, b - a) for a, b in local.output_slices[0]]
    for axis, dim in zip(axes, layout.spatial):
        start, stop = local.input_slices[0][dim]
        if start % axis.stride or (axis.size - stop) % axis.stride:
            raise PartitionError(f"rows [{start}, {stop}) are not aligned to stride "
                                 f"{axis.stride}.", node=sem.op_name, op_type=sem.op_type)
        lo, hi = local.output_slices[0][dim]
        crop[dim] = (lo - start // axis.stride, hi - start // axis.stride)
    return replace(local, output_crops=(tuple(crop),))


@semantics("AvgPool", "AvgPool3D", localize=_avg_pool_local)
def avg_pool(ctx):
    """Unpadded: y = Mean(k..: x[n, o*s + k, c]). Padded (SAME): the in-range taps of o's
    aligned tile (see _aligned_tile), summed, over their count."""
    x = ctx.inputs[0]
    layout = layout_of(ctx, x.rank)
    axes = _axes(ctx, ctx.attrs, layout, x.shape, ctx.output_shapes[0])
    names = ("n", _tap_names(layout, "o"), "c")
    if not _padded(axes):
        compute_layout(ctx, layout, names, lambda n, outs, c: ReduceN(
            "mean", lambda *taps: x[layout.pack(
                n, [a.tap(o, k) for a, o, k in zip(axes, outs, taps)], c)],
            [a.kernel for a in axes], names=_tap_names(layout)))
        return
    tiles = [_aligned_tile(a) for a in axes]

    def body(n, outs, c):
        def term(*ts):
            rows, conditions = [], []
            for a, o, t, (lead, _) in zip(axes, outs, ts, tiles):
                row = o * a.stride + t - lead
                rows.append(row)
                conditions.append(Fn("and", t >= lead - a.pad, t < lead - a.pad + a.kernel,
                                     row >= 0, row < a.size))
            return gated(conditions, x[layout.pack(n, rows, c)])
        total = ReduceN("sum", term, [e for _, e in tiles], names=_tap_names(layout, "t"))
        return total / _count(axes, outs)
    compute_layout(ctx, layout, names, body)
    for name in _tap_names(layout, "t"):
        ctx.unsplittable(name, SAME_AVERAGE_REASON)


def _avg_pool_grad_local(ctx, local):
    """Unpadded: a VALID transposed window with the part's taps (as Conv2DBackpropInput).
    Padded: SAME on an aligned region (`_same_grad_region`) with exactly its dy rows."""
    sem = ctx.sem
    layout, axes = _hook_axes(sem, _dx_shape(sem.constants[0]), sem.input_shapes[1])
    out = local.output_slices[0]
    sizes = [b - a for a, b in out]
    crop = [(0, b - a) for a, b in out]
    if not _padded(axes):
        for axis, dim, name in zip(axes, layout.spatial, _tap_names(layout)):
            first, stop = ctx.requested[1][dim]
            sizes[dim], crop[dim] = transposed_window(
                axis, out[dim][0], out[dim][1] - 1, first, stop - 1,
                *_tap_part(ctx, name, axis.kernel))
        return replace(local, attrs={**valid_attrs(local.attrs),
                                     "ksize": _local_ksize(ctx, layout)},
                       const_inputs={0: int_const(sizes)}, output_crops=(tuple(crop),))
    slices, pads = list(local.input_slices[1]), [(0, 0)] * len(sizes)
    for axis, dim in zip(axes, layout.spatial):
        (start, stop), slices[dim], pads[dim] = _same_grad_region(axis, out[dim][0],
                                                                  out[dim][1] - 1)
        sizes[dim], crop[dim] = stop - start, (out[dim][0] - start, out[dim][1] - start)
    return replace(local, input_slices=(None, tuple(slices)), **zero_padded(local, 1, pads),
                   const_inputs={0: int_const(sizes)}, output_crops=(tuple(crop),))


def _dx_shape(orig_input_shape) -> tuple[int, ...]:
    """The shape of the kernel's whole result: its orig_input_shape input. A local op may
    be described with the leading rows of it only; SAME's padding and counts are those of
    the whole."""
    return tuple(int(v) for v in orig_input_shape)


def _same_grad_region(axis, lo: int, hi: int):
    """Input rows [r0, r1), the dy rows to read and the zero dy rows around them, for
    input rows [lo, hi] of a SAME average gradient.

    The windows o in [a, b] that touch [lo, hi] must be whole in [r0, r1) so their counts
    are right; r0 = 0 (mod s) and r1 = size (mod s) make the local SAME padding the global
    one; the local op then needs exactly the dy rows of its windows.

    TensorFlow's CPU kernel misplaces windows over an input narrower than a window (orig
    11 x 4, 5x5 s3 SAME: window 0 spans 4 columns, not 3; the forward pool is right; the
    class of tensorflow/tensorflow#48773, "Wrong results of AvgPoolGrad ... in some
    specific shapes", closed unfixed). So the region is widened in whole strides to at
    least one window where the input allows, the windows it adds reading zeros (they reach
    only rows the crop drops).
    """
    s, k, p = axis.stride, axis.kernel, axis.pad
    first = max(-((k - 1 - lo - p) // s), 0)
    last = min((hi + p) // s, axis.out - 1)
    start = min(max(first * s - p, 0), lo)
    stop = max(min(last * s - p + k, axis.size), hi + 1)
    r0 = start - start % s
    r1 = stop + (axis.size - stop) % s
    rows = (r0 // s, -(-r1 // s))
    while r1 - r0 < k and (r0 > 0 or r1 < axis.size):
        r0, r1 = (r0 - s, r1) if r0 > 0 else (r0, min(r1 + s, axis.size))
    return (r0, r1), rows, (rows[0] - r0 // s, -(-r1 // s) - rows[1])


@semantics("AvgPoolGrad", "AvgPool3DGrad", localize=_avg_pool_grad_local)
def avg_pool_grad(ctx):
    """Unpadded: dx[n, i.., c] = Mean(k..: dy.padded(0)[n, (i - k) / s, c], s divides).
    Padded (SAME): Sum over the windows o near i that hold i of dy[n, o.., c] / count(o)."""
    _, dy = ctx.inputs
    dx_shape = _dx_shape(ctx.const(0))
    layout = layout_of(ctx, len(dx_shape))
    axes = _axes(ctx, ctx.attrs, layout, dx_shape, dy.shape)
    names = ("n", layout.spatial_names, "c")
    if not _padded(axes):
        dyp = dy.padded(0)
        compute_layout(ctx, layout, names, lambda n, ins, c: ReduceN(
            "mean", lambda *taps: gated(
                [a.hits(i, k) for a, i, k in zip(axes, ins, taps)],
                dyp[layout.pack(n, [a.source(i, k) for a, i, k in zip(axes, ins, taps)], c)]),
            [a.kernel for a in axes], names=_tap_names(layout)))
        return
    spans = [_window_span(a) for a in axes]

    def body(n, ins, c):
        def term(*us):
            outs, conditions = [], []
            for a, i, u, (below, _) in zip(axes, ins, us, spans):
                o = (i + a.pad) // a.stride + below - u
                outs.append(o)
                offset = i + a.pad - o * a.stride
                conditions.append(Fn("and", offset >= 0, offset < a.kernel, o >= 0,
                                     o < a.out))
            return gated(conditions, dy[layout.pack(n, outs, c)] / _count(axes, outs))
        return ReduceN("sum", term, [e for _, e in spans], names=_tap_names(layout, "u"))
    compute_layout(ctx, layout, names, body)
    for name in _tap_names(layout, "u"):
        ctx.unsplittable(name, SAME_AVERAGE_REASON)


def _window_span(axis) -> tuple[int, int]:
    """(below, extent): input i reads dy rows (i + p) // s + below - u, u in [0, extent).

    Beyond the windows holding i, this covers the rows `_same_grad_region` fetches: up to
    `below` windows after and ceil(p/s) windows before them.
    """
    s = axis.stride
    _, tile = _aligned_tile(axis)
    lead = -(-axis.pad // s)
    below = -(-(tile - s * lead) // s) - 1 + (1 if s > axis.kernel else 0)
    return below, below + -(-axis.kernel // s) + lead
