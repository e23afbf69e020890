"""Convolutions: Conv2D, Conv3D, depthwise, and their input and filter gradients; image
patches (ExtractImagePatches: a convolution's window without its filter).

Per spatial dim, output o reads input o*s + k*d - p for kernel taps k (stride s, dilation
d, padding p before the first element):

    y[n, o, co]   = sum_{k, ci}   x[n, o*s + k*d - p, ci] * w[k, ci, co]
    dx[n, i, ci]  = sum_{k, co}   dy[n, (i + p - k*d) / s, co] * w[k, ci, co]   (s divides)
    dw[k, ci, co] = sum_{n, o}    x[n, o*s + k*d - p, ci] * dy[n, o, co]

so every output dim splits (spatial dims read a halo of (K-1)*d input rows) and every
reduction var (taps, channels, batch, output positions) is a partial sum. Padding is a
zero fill: a part fetches its region padded with zeros and runs the op's own kernel with
VALID padding. A VALID input gradient over dy rows [a, b] yields input rows from
a*s + k0*d - p on: the part picks a local input size the kernel accepts and crops.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tofu_tf.errors import PartitionError
from tofu_tf.op_semantics.localize import replace
from tofu_tf.op_semantics.registry import semantics
from tofu_tf.op_semantics.tdl import Eq, ReduceN, where

SPATIAL_NAMES = {2: ("h", "w"), 3: ("d", "h", "w")}
DATA_FORMATS = ("NHWC", "NCHW", "NDHWC", "NCDHW")
DEPTHWISE_REASON = ("a part of the channel multiplier reads out_backprop channels c*M + m "
                    "for every c: a strided set no slice can fetch")
DILATED_GRADIENT_REASON = ("the CPU depthwise gradient kernels reject dilation unless the "
                           "padding is the op's own SAME, so a part cannot run on a halo")


# -- layouts and window geometry (shared with pool.py) ----------------------------------


@dataclass(frozen=True)
class Layout:
    """Where batch, channels and the spatial dims sit in a tensor of `rank` dims."""
    channels_first: bool
    rank: int

    @property
    def channel(self) -> int:
        return 1 if self.channels_first else self.rank - 1

    @property
    def spatial(self) -> tuple[int, ...]:
        first = 2 if self.channels_first else 1
        return tuple(range(first, first + self.rank - 2))

    @property
    def spatial_names(self) -> tuple[str, ...]:
        return SPATIAL_NAMES[self.rank - 2]

    def pack(self, batch: Any, spatial: Sequence[Any], channel: Any) -> tuple:
        """Batch, spatial and channel entries in tensor order."""
        out: list[Any] = [None] * self.rank
        out[0], out[self.channel] = batch, channel
        for dim, value in zip(self.spatial, spatial):
            out[dim] = value
        return tuple(out)

    def unpack(self, values: Sequence[Any]) -> tuple[Any, tuple, Any]:
        return values[0], tuple(values[d] for d in self.spatial), values[self.channel]


def layout_of(ctx, rank: int) -> Layout:
    fmt = ctx.attr("data_format", "NHWC")
    fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
    if fmt not in DATA_FORMATS or len(fmt) != rank or rank - 2 not in SPATIAL_NAMES:
        ctx.fail(f"data_format {fmt!r} does not fit a rank-{rank} input.",
                 fix="use NHWC/NCHW (2-D) or NDHWC/NCDHW (3-D).")
    return Layout(fmt.startswith("NC"), rank)


def layout_from(attrs: Mapping[str, Any], rank: int) -> Layout:
    """The layout in a localize hook (the description has already checked it)."""
    return Layout(str(attrs.get("data_format", "NHWC")).startswith("NC"), rank)


@dataclass(frozen=True)
class Axis:
    """One spatial dim of a sliding window: input `size`, output `out`, `kernel` taps,
    `stride`, `dilation`, and zero padding `pad` before / `pad_end` after the input."""
    size: int
    out: int
    kernel: int
    stride: int
    dilation: int
    pad: int
    pad_end: int

    def tap(self, o, k):
        """The input position tap k of output o reads."""
        return o * self.stride + k * self.dilation - self.pad

    def source(self, i, k):
        """The output whose tap k lands on input i (when `hits`)."""
        return (i + self.pad - k * self.dilation) // self.stride

    def hits(self, i, k):
        """Tap k of some output lands on input i; None when always (stride 1)."""
        if self.stride == 1:
            return None
        return Eq((i + self.pad - k * self.dilation) % self.stride, 0)


def window_axes(attrs: Mapping[str, Any], layout: Layout, in_shape: Sequence[int],
                out_shape: Sequence[int], kernel: Sequence[int]) -> tuple[Axis, ...]:
    """The geometry of every spatial dim; a ValueError says what does not fit."""
    strides = tuple(attrs.get("strides") or (1,) * layout.rank)
    dilations = tuple(attrs.get("dilations") or (1,) * layout.rank)
    padding = str(attrs.get("padding", "VALID"))
    explicit = tuple(attrs.get("explicit_paddings") or ())
    if len(strides) != layout.rank or len(dilations) != layout.rank:
        raise ValueError(f"strides {strides} / dilations {dilations} need {layout.rank} "
                         "entries.")
    for dim in (0, layout.channel):
        if strides[dim] != 1 or dilations[dim] != 1:
            raise ValueError("strides and dilations over batch or channels must be 1.")
    axes = []
    for i, dim in enumerate(layout.spatial):
        size, out, k = int(in_shape[dim]), int(out_shape[dim]), int(kernel[i])
        s, d = int(strides[dim]), int(dilations[dim])
        span = (out - 1) * s + (k - 1) * d + 1
        if padding == "VALID":
            before = 0
        elif padding == "SAME":
            # TensorFlow pads for its whole result, ceil(size / s) rows; a local op
            # described with fewer (the leading rows of a cropped result) pads the same.
            whole = (-(-size // s) - 1) * s + (k - 1) * d + 1 if out < -(-size // s) else span
            before = max(whole - size, 0) // 2
        elif padding == "EXPLICIT" and len(explicit) == 2 * layout.rank:
            before = int(explicit[2 * dim])
        else:
            raise ValueError(f"padding {padding!r} (explicit_paddings {list(explicit)}) is "
                             "not SAME, VALID or EXPLICIT with 2 entries per dim.")
        axes.append(Axis(size, out, k, s, d, before, max(span - size - before, 0)))
    return tuple(axes)


def axes_or_fail(ctx, attrs, layout, in_shape, out_shape, kernel) -> tuple[Axis, ...]:
    try:
        return window_axes(attrs, layout, in_shape, out_shape, kernel)
    except ValueError as err:
        ctx.fail(str(err))


def named(names: Sequence[str], fn: Callable) -> Callable:
    """`fn` with parameters called `names`, so the op's variables read n, oh, ow, co."""
    def call(*args):
        return fn(*args)
    call.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names])
    return call


def compute_layout(ctx, layout: Layout, names: tuple[str, Sequence[str], str],
                   body: Callable) -> None:
    """ctx.compute over a batch/spatial/channel output: body(n, spatial_vars, c)."""
    batch, spatial, channel = names
    order = layout.pack(batch, spatial, channel)
    ctx.compute(named(order, lambda *vars: body(*layout.unpack(vars))))


def gated(conditions: Sequence[Any], value: Any) -> Any:
    """`value` where every condition holds (None: always), else 0."""
    for cond in conditions:
        if cond is not None:
            value = where(cond, value, 0)
    return value


def transposed_window(axis: Axis, lo: int, hi: int, first: int, last: int,
                      tap_first: int, taps: int) -> tuple[int, tuple[int, int]]:
    """Local input size and crop of a VALID transposed window over outputs [first, last]
    and taps [tap_first, tap_first + taps) that must cover input rows [lo, hi].

    The local input row r is global row first*s + tap_first*d - p + r; a VALID window of
    `taps` taps over `length` rows has (length - (taps-1)*d - 1) // s + 1 outputs.
    """
    offset = first * axis.stride + tap_first * axis.dilation - axis.pad
    shortest = (last - first) * axis.stride + (taps - 1) * axis.dilation + 1
    length = max(shortest, hi - offset + 1)
    if lo < offset or length >= shortest + axis.stride:
        raise PartitionError(f"outputs [{first}, {last}] do not cover input rows "
                             f"[{lo}, {hi}] with one VALID window.")
    return length, (lo - offset, hi - offset + 1)


def valid_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The local op pads nothing: its region arrives padded."""
    out = {**attrs, "padding": "VALID"}
    if "explicit_paddings" in attrs:
        out["explicit_paddings"] = ()
    return out


def int_const(values: Sequence[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def _kernel_names(layout: Layout) -> tuple[str, ...]:
    return tuple("k" + n for n in layout.spatial_names)


def _out_names(layout: Layout) -> tuple[str, ...]:
    return tuple("o" + n for n in layout.spatial_names)


# -- forward ---------------------------------------------------------------------------


def own_window(sem, local, windowed: Sequence[int], output_dims: Sequence[int],
               filter_input: int | None = 1):
    """The local op with no halo pads, keeping the op's own padding and strides, when the
    windowed inputs' spatial dims, the filter's taps and the output's `output_dims` arrive
    whole (a split of batch or channels only); else None. `filter_input`: the input
    holding the filter (None: a pool, whose caller checks its window's taps). The VALID
    form a spatial part needs computes more than the part where the window overhangs it
    (a transposed convolution over a padded dy: k - 1 more outputs each side, 9x the
    work of a 2x2 image at k = 3), and every form makes a padded copy of its input."""
    layout = layout_from(sem.attrs, len(sem.input_shapes[windowed[0]]))
    for i in windowed:
        if local.input_slices[i] is None or any(
                local.input_slices[i][d] != (0, sem.input_shapes[i][d]) for d in layout.spatial):
            return None
    if any(local.output_slices[0][d] != (0, sem.output_shapes[0][d]) for d in output_dims):
        return None
    taps = local.input_slices[filter_input] if filter_input is not None else None
    if taps is not None and any(taps[d] != (0, sem.input_shapes[filter_input][d])
                                for d in range(len(sem.input_shapes[filter_input]) - 2)):
        return None
    pads = tuple(None if p is None else tuple((0, 0) for _ in p) for p in local.input_pads)
    return replace(local, input_pads=pads)


def _valid_local(ctx, local):
    sem = ctx.sem
    own = own_window(sem, local, (0,), layout_from(sem.attrs, len(sem.input_shapes[0])).spatial)
    return own or replace(local, attrs=valid_attrs(local.attrs))


@semantics("Conv2D", "Conv3D", localize=_valid_local)
def conv(ctx):
    """y[n, o.., co] = Sum(k.., ci: x.padded(0)[n, o*s + k*d - p, ci] * w[k.., ci, co])."""
    x, w = ctx.inputs
    layout = layout_of(ctx, x.rank)
    kernel, (cin, _) = w.shape[:-2], w.shape[-2:]
    if x.shape[layout.channel] != cin:
        ctx.fail(f"grouped convolution ({x.shape[layout.channel]} input channels, filter "
                 f"in_channels {cin}) is not described; the importer rewrites grouped "
                 "convolutions into depthwise or per-group ones.",
                 fix="import the graph through tofu_tf.optimize or tofu_tf.function.")
    axes = axes_or_fail(ctx, ctx.attrs, layout, x.shape, ctx.output_shapes[0], kernel)
    xp = x.padded(0)

    def body(n, outs, co):
        def term(*r):
            taps, ci = r[:-1], r[-1]
            return (xp[layout.pack(n, [a.tap(o, k) for a, o, k in zip(axes, outs, taps)], ci)]
                    * w[(*taps, ci, co)])
        return ReduceN("sum", term, (*kernel, cin), names=(*_kernel_names(layout), "ci"))
    compute_layout(ctx, layout, ("n", _out_names(layout), "co"), body)


def _depthwise_local(ctx, local):
    """VALID, and crop the output channels c*M + m to the part's (c is fetched whole)."""
    sem = ctx.sem
    layout = layout_from(sem.attrs, len(sem.input_shapes[0]))
    multiplier = sem.input_shapes[1][-1]
    first_c = local.input_slices[1][-2][0]
    crop = [(0, b - a) for a, b in local.output_slices[0]]
    lo, hi = local.output_slices[0][layout.channel]
    crop[layout.channel] = (lo - first_c * multiplier, hi - first_c * multiplier)
    own = own_window(sem, local, (0,), layout.spatial)
    return replace(own or replace(local, attrs=valid_attrs(local.attrs)),
                   output_crops=(tuple(crop),))


@semantics("DepthwiseConv2dNative", localize=_depthwise_local)
def depthwise_conv(ctx):
    """y[n, o.., c*M + m] = Sum(k..: x.padded(0)[n, o*s + k*d - p, c] * w[k.., c, m])."""
    x, w = ctx.inputs
    layout = layout_of(ctx, x.rank)
    kernel, multiplier = w.shape[:-2], w.shape[-1]
    axes = axes_or_fail(ctx, ctx.attrs, layout, x.shape, ctx.output_shapes[0], kernel)
    xp = x.padded(0)

    def body(n, outs, oc):
        c, m = (oc, 0) if multiplier == 1 else (oc // multiplier, oc % multiplier)
        return ReduceN("sum", lambda *taps: xp[layout.pack(
            n, [a.tap(o, k) for a, o, k in zip(axes, outs, taps)], c)] * w[(*taps, c, m)],
            kernel, names=_kernel_names(layout))
    compute_layout(ctx, layout, ("n", _out_names(layout), "oc"), body)


# -- gradients ---------------------------------------------------------------------------


def _dilated_depthwise_gradient(op_type: str, attrs: Mapping[str, Any]) -> bool:
    return (op_type.startswith("DepthwiseConv2dNativeBackprop")
            and any(int(d) != 1 for d in attrs.get("dilations") or ()))


def _whole_window(ctx, local, const_index: int, sizes: Sequence[int]):
    """Keep the op's own padding: spatial dims arrive whole, so drop the halo padding."""
    sem = ctx.sem
    layout = layout_from(sem.attrs, len(sem.input_shapes[2]))
    for i in (0, 2):                                  # x or dy (input 1 is the filter)
        if local.input_slices[i] is not None and any(
                local.input_slices[i][d] != (0, sem.input_shapes[i][d]) for d in layout.spatial):
            raise PartitionError("a dilated depthwise gradient needs whole spatial dims.",
                                 node=sem.op_name, op_type=sem.op_type)
    pads = tuple(None if p is None else tuple((0, 0) for _ in p) for p in local.input_pads)
    return replace(local, input_pads=pads, const_inputs={const_index: int_const(sizes)})


def _keep_spatial_whole(ctx, layout: Layout, inputs: Sequence[str], reductions: Sequence[str]):
    """Dilated depthwise gradients split only on batch and channels (see the reason)."""
    if _dilated_depthwise_gradient(ctx.type, ctx.attrs):
        for name in (*inputs, *reductions):
            ctx.unsplittable(name, DILATED_GRADIENT_REASON)


def _backprop_input_local(ctx, local):
    """VALID over the zero-padded dy region; local input_sizes; crop to the part."""
    sem = ctx.sem
    if _dilated_depthwise_gradient(sem.op_type, sem.attrs):
        return _whole_window(ctx, local, 0, ctx.output_shape(0))
    dx_shape, filter_shape, dy_shape = (sem.output_shapes[0], sem.input_shapes[1],
                                        sem.input_shapes[2])
    layout = layout_from(sem.attrs, len(dx_shape))
    axes = window_axes(sem.attrs, layout, dx_shape, dy_shape, filter_shape[:-2])
    out = local.output_slices[0]
    sizes, crop = [0] * layout.rank, [(0, 0)] * layout.rank
    own = own_window(sem, local, (2,), layout.spatial)
    for axis, dim, (tap0, tap1) in zip(axes, layout.spatial, local.input_slices[1]):
        if own is not None:
            sizes[dim], crop[dim] = dx_shape[dim], (0, dx_shape[dim])
            continue
        first, stop = ctx.requested[2][dim]
        sizes[dim], crop[dim] = transposed_window(axis, out[dim][0], out[dim][1] - 1, first,
                                                  stop - 1, tap0, tap1 - tap0)
    batch, channels, held = out[0], local.input_slices[1][-2], out[layout.channel]
    sizes[0], crop[0] = batch[1] - batch[0], (0, batch[1] - batch[0])
    sizes[layout.channel] = channels[1] - channels[0]
    crop[layout.channel] = (held[0] - channels[0], held[1] - channels[0])
    return replace(own or replace(local, attrs=valid_attrs(local.attrs)),
                   const_inputs={0: int_const(sizes)}, output_crops=(tuple(crop),))


def _input_gradient(ctx, channel_of: Callable, names: tuple[str, str]) -> Layout:
    """dx[n, i.., a] = Sum(k.., b: dy.padded(0)[n, (i + p - k*d) / s, channel_of(a, b)]
    * w[k.., a, b]) where s divides i + p - k*d."""
    _, w, dy = ctx.inputs
    ctx.const(0)
    dx_shape = ctx.output_shapes[0]
    layout = layout_of(ctx, len(dx_shape))
    kernel = w.shape[:-2]
    axes = axes_or_fail(ctx, ctx.attrs, layout, dx_shape, dy.shape, kernel)
    dyp = dy.padded(0)

    def body(n, ins, a):
        def term(*r):
            taps, b = r[:-1], r[-1]
            read = dyp[layout.pack(n, [ax.source(i, k) for ax, i, k in zip(axes, ins, taps)],
                                   channel_of(a, b))]
            hits = [ax.hits(i, k) for ax, i, k in zip(axes, ins, taps)]
            return gated(hits, read) * w[(*taps, a, b)]
        return ReduceN("sum", term, (*kernel, w.shape[-1]),
                       names=(*_kernel_names(layout), names[1]))
    compute_layout(ctx, layout, ("n", layout.spatial_names, names[0]), body)
    return layout


@semantics("Conv2DBackpropInput", "Conv3DBackpropInputV2", localize=_backprop_input_local)
def conv_backprop_input(ctx):
    _input_gradient(ctx, lambda ci, co: co, ("ci", "co"))


@semantics("DepthwiseConv2dNativeBackpropInput", localize=_backprop_input_local)
def depthwise_backprop_input(ctx):
    channels, multiplier = ctx.inputs[1].shape[-2:]
    layout = _input_gradient(ctx, lambda c, m: c * multiplier + m, ("c", "m"))
    if channels > 1:
        ctx.unsplittable("m", DEPTHWISE_REASON)
    _keep_spatial_whole(ctx, layout, layout.spatial_names, _kernel_names(layout))


# -- filter gradient -----------------------------------------------------------------------


def _backprop_filter_local(ctx, local):
    """VALID over the zero-padded input region; filter_sizes is the part's filter."""
    if _dilated_depthwise_gradient(ctx.sem.op_type, ctx.sem.attrs):
        return _whole_window(ctx, local, 1, ctx.output_shape(0))
    sizes = int_const(ctx.output_shape(0))
    taps = range(len(ctx.sem.output_shapes[0]) - 2)
    own = own_window(ctx.sem, local, (0, 2), taps, filter_input=None)
    return replace(own or replace(local, attrs=valid_attrs(local.attrs)),
                   const_inputs={1: sizes})


def _filter_gradient(ctx, channel_of: Callable, names: tuple[str, str]) -> Layout:
    """dw[k.., a, b] = Sum(n, o..: x.padded(0)[n, o*s + k*d - p, a]
    * dy[n, o.., channel_of(a, b)])."""
    x, _, dy = ctx.inputs
    ctx.const(1)
    layout = layout_of(ctx, x.rank)
    kernel = ctx.output_shapes[0][:-2]
    axes = axes_or_fail(ctx, ctx.attrs, layout, x.shape, dy.shape, kernel)
    xp = x.padded(0)
    outs = tuple(dy.shape[d] for d in layout.spatial)

    def body(*vars):
        taps, (a, b) = vars[:-2], vars[-2:]
        return ReduceN("sum", lambda n, *o: xp[layout.pack(
            n, [ax.tap(oi, k) for ax, oi, k in zip(axes, o, taps)], a)]
            * dy[layout.pack(n, o, channel_of(a, b))],
            (x.shape[0], *outs), names=("n", *_out_names(layout)))
    ctx.compute(named((*_kernel_names(layout), *names), body))
    return layout


@semantics("Conv2DBackpropFilter", "Conv3DBackpropFilterV2", localize=_backprop_filter_local)
def conv_backprop_filter(ctx):
    _filter_gradient(ctx, lambda ci, co: co, ("ci", "co"))


@semantics("DepthwiseConv2dNativeBackpropFilter", localize=_backprop_filter_local)
def depthwise_backprop_filter(ctx):
    channels, multiplier = ctx.output_shapes[0][-2:]
    layout = _filter_gradient(ctx, lambda c, m: c * multiplier + m, ("c", "m"))
    if channels > 1:
        ctx.unsplittable("m", DEPTHWISE_REASON)
    _keep_spatial_whole(ctx, layout, _kernel_names(layout), _out_names(layout))


PATCH_DEPTH_REASON = ("a patch's depth flattens its tap rows, tap columns and channels: a "
                      "part of it is no patch of a part of the image")


def _patches_local(ctx, local):
    """VALID over the zero-padded region (the op's own padding where it arrives whole)."""
    own = own_window(ctx.sem, local, (0,), (1, 2), filter_input=None)
    return own or replace(local, attrs=valid_attrs(local.attrs))


@semantics("ExtractImagePatches", localize=_patches_local)
def extract_image_patches(ctx):
    """y[n, oh, ow, (kh*KW + kw)*C + c] = x.padded(0)[n, oh*s + kh*r - p, ow*s + kw*r - p,
    c] (rates r): batch and output rows and columns split, with a halo."""
    x = ctx.inputs[0]
    layout = Layout(False, 4)
    kernel = tuple(int(k) for k in ctx.attr("ksizes"))[1:3]
    attrs = {**ctx.attrs, "dilations": ctx.attr("rates")}
    axes = axes_or_fail(ctx, attrs, layout, x.shape, ctx.output_shapes[0], kernel)
    channels, columns = x.shape[3], kernel[1]
    xp = x.padded(0)

    def body(n, oh, ow, d):
        kh, kw, c = d // (columns * channels), (d // channels) % columns, d % channels
        return xp[n, axes[0].tap(oh, kh), axes[1].tap(ow, kw), c]
    ctx.compute(body)
    ctx.unsplittable("d", PATCH_DEPTH_REASON)
