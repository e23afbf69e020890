"""Shape-like and data-movement ops: reshapes, transposes, concats and splits, slices, pads,
packs, tiles and broadcasts, shape queries, ranges, one-hot, reverse, cumsum.

Each output element is one input element at an index computed from the output index (a
Reshape unravels its flat index group by group, a StridedSlice reads `begin + stride * i`,
a Concat picks its piece with `where`), so every output dim splits and each input is cut
to the part's preimage. Local kernels then see the part's own shapes: hooks rewrite the
shape, begin, size and padding constants, and where a kernel needs a little more than the
part (whole tiles, a OneHot up to the part's last class, a Reshape of aligned rows) they
pad the fetched region with zeros that only land in what the crop drops.
"""

from __future__ import annotations

from functools import reduce
from math import gcd, prod

import numpy as np

from tofu_tf.errors import PartitionError
from tofu_tf.op_semantics.helpers import broadcast, normalize_axes, normalize_axis
from tofu_tf.op_semantics.hooks import (named, const_ints, const_ints_of, set_item, sizes, crop_or_none, split_dim, shifted, zero_padded, crop_split_outputs, shape_const_hook)
from tofu_tf.op_semantics.localize import replace
from tofu_tf.op_semantics.registry import opaque, semantics
from tofu_tf.op_semantics.tdl import Const, Eq, Fn, Prod, Sum, where

# -- Reshape ------------------------------------------------------------------------------


def reshape_groups(x_shape, y_shape) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The finest pairing of x dims with y dims of equal product (size-1 dims left out):
    [6, 4] -> [2, 3, 4] pairs x(0) with y(0, 1) and x(1) with y(2)."""
    xs = [d for d, n in enumerate(x_shape) if n != 1]
    ys = [d for d, n in enumerate(y_shape) if n != 1]
    groups, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        gx, gy = [xs[i]], [ys[j]]
        px, py = x_shape[xs[i]], y_shape[ys[j]]
        i, j = i + 1, j + 1
        while px != py:
            if px < py:
                gx.append(xs[i])
                px, i = px * x_shape[xs[i]], i + 1
            else:
                gy.append(ys[j])
                py, j = py * y_shape[ys[j]], j + 1
        groups.append((tuple(gx), tuple(gy)))
    return groups


def _strides(shape, dims) -> dict[int, int]:
    out, stride = {}, 1
    for d in reversed(dims):
        out[d] = stride
        stride *= shape[d]
    return out


def _group_index(x_shape, y_shape, group, idx) -> dict[int, object]:
    """x index of one group: unravel(ravel(y index)); no `% size` on the group's leading x
    dim (the flat index is in range) and no `// 1` on its last."""
    gx, gy = group
    y_strides, x_strides = _strides(y_shape, gy), _strides(x_shape, gx)
    flat = reduce(lambda a, b: a + b, [shifted(idx[d], 0, y_strides[d]) for d in gy])
    index = {}
    for n, d in enumerate(gx):
        value = flat if x_strides[d] == 1 else flat // x_strides[d]
        index[d] = value if n == 0 else value % x_shape[d]
    return index


def _reshape_local(ctx, local):
    """Give the local Reshape the part's shape. A split on the leading y dim of a group
    fetches whole rows of the group's leading x dim; rows are zero-padded to a multiple that
    reshapes exactly, and the crop keeps the part. A split on an inner y dim of a group pads
    the group's x dims to their full extent (the region is nearly whole anyway)."""
    sem = ctx.sem
    x_shape, y_shape = sem.input_shapes[0], sem.output_shapes[0]
    dim = split_dim(ctx)
    if dim is None or 0 in x_shape:
        return replace(local, const_inputs={1: np.asarray(y_shape, dtype=np.int64)})
    gx, gy = next(g for g in reshape_groups(x_shape, y_shape) if dim in g[1])
    slices, pads = local.input_slices[0], list(local.input_pads[0])
    share = local.output_slices[0]
    local_y, crop = list(y_shape), [(0, n) for n in y_shape]
    for d in gx[1:] if gy[0] == dim else gx:
        pads[d] = (slices[d][0], x_shape[d] - slices[d][1])
    if gy[0] == dim:
        lead = gx[0]
        inner_x = prod(x_shape[d] for d in gx[1:])
        inner_y = prod(y_shape[d] for d in gy[1:])
        align = inner_y // gcd(inner_y, inner_x)
        a, b = slices[lead]
        start, stop = a // align * align, -(-b // align) * align
        pads[lead] = (a - start, stop - b)
        offset = start * inner_x // inner_y
        local_y[dim] = (stop - start) * inner_x // inner_y
        crop[dim] = (share[dim][0] - offset, share[dim][1] - offset)
    else:
        crop[dim] = share[dim]
    return replace(local, **zero_padded(local, 0, pads),
                   const_inputs={1: np.asarray(local_y, dtype=np.int64)},
                   output_crops=(crop_or_none(crop, local_y),))


@semantics("Reshape", localize=_reshape_local)
def reshape(ctx):
    """y[i] = x[unravel(ravel(i))], per group of dims with equal products; a split on a
    group's leading y dim keeps rows of its leading x dim, an inner one widens soundly."""
    x = ctx.inputs[0]
    ctx.const(1)
    y_shape = ctx.output_shapes[0]
    if 0 in x.shape:
        for d in range(len(y_shape)):
            ctx.unsplittable(f"d{d}", "the tensor has no elements")
        ctx.compute_nd(lambda idx: Fn("empty"))
        return
    if prod(x.shape) != prod(y_shape):
        ctx.fail(f"reshapes {list(x.shape)} ({prod(x.shape)} elements) to {list(y_shape)} "
                 f"({prod(y_shape)} elements).", fix="give the output the input's size.")
    groups = reshape_groups(x.shape, y_shape)

    def body(idx):
        index = {d: Const(0) for d in range(x.rank)}
        for group in groups:
            index.update(_group_index(x.shape, y_shape, group, idx))
        return x[tuple(index[d] for d in range(x.rank))]
    ctx.compute_nd(body)


# -- permutations, reversals, size-1 dims, broadcasts ---------------------------------------


@semantics("Transpose", "ConjugateTranspose")
def transpose(ctx):
    """y[i] = x[j] with j[perm[d]] = i[d]."""
    view = ctx.inputs[0].transpose(const_ints_of(ctx, 1))
    if ctx.type == "ConjugateTranspose":
        ctx.compute_nd(lambda idx: Fn("conj", view[idx]))
    else:
        ctx.compute_nd(lambda idx: view[idx])


@semantics("ReverseV2")
def reverse(ctx):
    """y[i] = x[n - 1 - i] on the reversed axes: a part reads the mirrored range."""
    x = ctx.inputs[0]
    axes = normalize_axes(const_ints_of(ctx, 1), x.rank)
    ctx.compute_nd(lambda idx: x[tuple(x.shape[d] - 1 - v if d in axes else v
                                       for d, v in enumerate(idx))])


def _rolls(shifts, axes, shape) -> dict[int, int]:
    """Axis -> its total shift in [0, n) (TensorFlow adds the shifts of a repeated axis)."""
    out: dict[int, int] = {}
    for shift, axis in zip(shifts, axes):
        axis = normalize_axis(axis, len(shape))
        out[axis] = (out.get(axis, 0) + shift) % shape[axis] if shape[axis] else 0
    return out


ROLLED_AXIS_REASON = ("a part of a rolled axis reads rows that wrap for some parts and not "
                      "for others: the parts' local ops differ in shape, and the search "
                      "plans every part as its first")


def _roll_local(ctx, local):
    """The shifts in [0, n), so that a split axis whose shift is a multiple of its size
    (7 of 7) does not roll the part's 2 rows by 1."""
    rolls = _rolls(const_ints(ctx.sem, 1), const_ints(ctx.sem, 2), ctx.sem.input_shapes[0])
    axes = sorted(rolls)
    return replace(local, const_inputs={**local.const_inputs,
                                        1: np.asarray([rolls[d] for d in axes], np.int64),
                                        2: np.asarray(axes, np.int64)})


@semantics("Roll", localize=_roll_local)
def roll(ctx):
    """y[i] = x[(i - s) mod n] on a rolled axis (s its shift in [0, n)), which stays whole
    (ROLLED_AXIS_REASON); the other axes split."""
    x = ctx.inputs[0]
    rolls = {axis: shift for axis, shift in
             _rolls(const_ints_of(ctx, 1), const_ints_of(ctx, 2), x.shape).items() if shift}
    ctx.compute_nd(lambda idx: x[tuple(shifted(v, x.shape[d] - rolls[d]) % x.shape[d]
                                       if d in rolls else v for d, v in enumerate(idx))])
    for axis in rolls:
        ctx.unsplittable(f"d{axis}", ROLLED_AXIS_REASON)


@semantics("ExpandDims")
def expand_dims(ctx):
    x = ctx.inputs[0]
    axis = normalize_axis(const_ints_of(ctx, 1)[0], x.rank + 1)
    ctx.compute_nd(lambda idx: x[idx[:axis] + idx[axis + 1:]])


def _squeezed(attrs, shape) -> tuple[int, ...]:
    return normalize_axes(attrs.get("squeeze_dims") or (), len(shape)) or \
        tuple(d for d, n in enumerate(shape) if n == 1)


def _squeeze_local(ctx, local):
    """Name the squeezed dims: a part's share of another dim may have size 1."""
    dims = _squeezed(ctx.sem.attrs, ctx.sem.input_shapes[0])
    return replace(local, attrs={**local.attrs, "squeeze_dims": dims})


@semantics("Squeeze", localize=_squeeze_local)
def squeeze(ctx):
    """y[i] = x[i with 0 at every squeezed dim] (all size-1 dims when none are named)."""
    x = ctx.inputs[0]
    dims = _squeezed(ctx.attrs, x.shape)

    def body(idx):
        out = iter(idx)
        return x[tuple(Const(0) if d in dims else next(out) for d in range(x.rank))]
    ctx.compute_nd(body)


@semantics("BroadcastTo", localize=shape_const_hook(1))
def broadcast_to(ctx):
    x = ctx.inputs[0]
    ctx.const(1)
    out = ctx.output_shapes[0]
    ctx.compute_nd(lambda idx: broadcast(x, idx, out))


def _tile_local(ctx, local):
    """A part within one tile reads just its slice (multiple 1); a part across tiles tiles
    the whole dim over the tiles it touches and crops."""
    multiples = const_ints(ctx.sem, 1)
    dim = split_dim(ctx)
    size = ctx.sem.input_shapes[0][dim] if dim is not None else 0
    if dim is None or multiples[dim] == 1 or size == 0:
        return local
    start, stop = local.output_slices[0][dim]
    first, last = start // size, (stop - 1) // size
    slices = list(local.input_slices[0])
    if first == last:
        slices[dim] = (start - first * size, stop - first * size)
        multiples[dim], crop = 1, None
    else:
        multiples[dim] = last - first + 1
        local_y = [(b - a) * m for (a, b), m in zip(slices, multiples)]
        crop = crop_or_none(set_item([(0, n) for n in local_y], dim,
                          (start - first * size, stop - first * size)), local_y)
    return replace(local, input_slices=set_item(local.input_slices, 0, tuple(slices)),
                   const_inputs={1: np.asarray(multiples, dtype=np.int64)},
                   output_crops=(crop,))


@semantics("Tile", localize=_tile_local)
def tile(ctx):
    """y[i] = x[i % n] on tiled dims."""
    x = ctx.inputs[0]
    multiples = const_ints_of(ctx, 1)

    def index(d, v):
        if multiples[d] == 1:
            return v
        return Const(0) if x.shape[d] == 1 else v % x.shape[d]
    ctx.compute_nd(lambda idx: x[tuple(index(d, v) for d, v in enumerate(idx))])


# -- space to batch and back (how TensorFlow runs a dilated convolution) --------------------

_BLOCK_FIX = ("the description's regions and its local op disagree: run `python -m "
              "tofu_tf.tools.validate --op=SpaceToBatchND,BatchToSpaceND` and report the "
              "op's shapes")
BLOCK_BATCH_REASON = ("BatchToSpaceND interleaves every block offset's batch: a part of its "
                      "output batch reads rows spread over the whole input batch")


def _blocks(ctx):
    """(block shape, the number of spatial dims it blocks)."""
    block = const_ints_of(ctx, 1)
    return block, len(block)


def _block_offsets(q, block):
    """Per spatial dim, the offset inside the block of block index q (row-major)."""
    offsets, stride = [], 1
    for b in reversed(block):
        offsets.append((q // stride if stride > 1 else q) % b if b > 1 else Const(0))
        stride *= b
    return offsets[::-1]


def _space_to_batch_local(ctx, local):
    """Local paddings aligning the fetched rows to the part's output rows (zeros outside
    the tensor, as the global paddings), and the crop of the batch: the local op writes
    every block offset of the batch rows it fetched."""
    block = const_ints(ctx.sem, 1)
    m = len(block)
    before = np.asarray(ctx.sem.constants[2]).reshape(-1, 2)[:, 0]
    out, fetched = local.output_slices[0], local.input_slices[0]
    pads = []
    for k in range(m):
        (i0, i1), (a, e), b = out[1 + k], fetched[1 + k], block[k]
        lead = (a + int(before[k]) - i0 * b) if e > a else (i1 - i0) * b
        pads.append((lead, (i1 - i0) * b - lead - (e - a)))
    (n0, n1), (c0, c1) = out[0], fetched[0]
    batch, rows = ctx.sem.input_shapes[0][0], c1 - c0
    if n1 > n0 and (n0 // batch == (n1 - 1) // batch):
        q = n0 // batch
        first = q * rows + n0 % batch - c0
    elif (c0, c1) == (0, batch):
        first = n0
    else:
        raise PartitionError(f"output batch [{n0}, {n1}) spans block offsets but the part "
                             f"fetched input batch [{c0}, {c1}) only.",
                             node=ctx.sem.op_name, op_type=ctx.sem.op_type,
                             fix=_BLOCK_FIX)
    local_shape = [prod(block) * rows] + [i1 - i0 for i0, i1 in out[1:1 + m]] + \
        sizes(fetched[1 + m:])
    crop = [(first, first + n1 - n0)] + [(0, i1 - i0) for i0, i1 in out[1:1 + m]] + \
        [(a - c, b - c) for (a, b), (c, _) in zip(out[1 + m:], fetched[1 + m:])]
    return replace(local, const_inputs={**local.const_inputs,
                                        2: np.asarray(pads, dtype=np.int64)},
                   output_crops=(crop_or_none(crop, local_shape),))


@semantics("SpaceToBatchND", localize=_space_to_batch_local)
def space_to_batch_nd(ctx):
    """y[q B + b, i, r] = x[b, i * block + offset(q) - before, r] (the padded rows read 0):
    each spatial block's offsets become batches."""
    x = ctx.inputs[0]
    block, m = _blocks(ctx)
    paddings = np.asarray(ctx.const(2)).reshape(-1, 2).tolist()
    batch = x.shape[0]

    def body(idx):
        n = idx[0]
        q, b = (n // batch, n % batch) if batch > 1 else (n, Const(0))
        index, conds = [b], []
        for k, offset in enumerate(_block_offsets(q, block)):
            row = shifted(idx[1 + k], 0, block[k]) + offset if block[k] > 1 else idx[1 + k]
            row = shifted(row, -paddings[k][0])
            index.append(row)
            conds += ([row >= 0] if paddings[k][0] else []) + \
                ([row < x.shape[1 + k]] if paddings[k][1] else [])
        value = x[tuple(index) + tuple(idx[1 + m:])]
        for cond in conds:
            value = where(cond, value, 0)
        return value
    ctx.compute_nd(body)


def _batch_to_space_local(ctx, local):
    """Local crops keeping the part's rows of the rows the fetched input blocks cover. A
    part whose rows lie at some block offsets only fetched those offsets' batches: the
    others are zeros, which land in rows the crops drop (its output batch is never split,
    so the kernel sees every offset's batch)."""
    block = const_ints(ctx.sem, 1)
    m = len(block)
    before = np.asarray(ctx.sem.constants[2]).reshape(-1, 2)[:, 0]
    out, fetched = local.output_slices[0], local.input_slices[0]
    (c0, c1), rows = fetched[0], ctx.sem.input_shapes[0][0]
    if (c0, c1) != (0, rows):
        pads = local.input_pads[0] or tuple((0, 0) for _ in fetched)
        local = replace(local, **zero_padded(local, 0, set_item(pads, 0, (c0, rows - c1))))
    crops = []
    for k in range(m):
        (h0, h1), (r0, r1), b = out[1 + k], fetched[1 + k], block[k]
        lead = h0 + int(before[k]) - r0 * b if h1 > h0 else 0
        crops.append((lead, (r1 - r0) * b - lead - (h1 - h0)))
    return replace(local, const_inputs={**local.const_inputs,
                                        2: np.asarray(crops, dtype=np.int64)})


@semantics("BatchToSpaceND", localize=_batch_to_space_local)
def batch_to_space_nd(ctx):
    """y[b, h, r] = x[q(h + before) B + b, (h + before) // block, r], q the block index of
    the offsets (h + before) % block: the inverse of SpaceToBatchND, its gradient."""
    x = ctx.inputs[0]
    block, m = _blocks(ctx)
    crops = np.asarray(ctx.const(2)).reshape(-1, 2).tolist()
    batch = x.shape[0] // prod(block)

    def body(idx):
        q, rows = None, []
        for k in range(m):
            h = shifted(idx[1 + k], crops[k][0])
            offset = h % block[k] if block[k] > 1 else Const(0)
            rows.append(h // block[k] if block[k] > 1 else h)
            q = offset if q is None else q * block[k] + offset
        n = q * batch + idx[0] if batch > 1 else q
        return x[(n,) + tuple(rows) + tuple(idx[1 + m:])]
    ctx.compute_nd(body)
    ctx.unsplittable("d0", BLOCK_BATCH_REASON)


# -- depth to space and back, band masks: the batch (leading) dims split ------------------

WHOLE_BLOCKS_REASON = ("{op} moves each {bs}x{bs} block between its spatial and channel "
                       "dims: a part of either is not the op's own on a part")
BAND_REASON = ("MatrixBandPart keeps a band around the diagonal of the whole matrix: a part "
               "of its rows or columns would need the band shifted")


def _block_size(ctx) -> int:
    fmt = ctx.attr("data_format", "NHWC")
    if (fmt.decode() if isinstance(fmt, bytes) else fmt) != "NHWC":
        ctx.fail(f"data_format {fmt!r}: only NHWC is described.", fix="use NHWC.")
    return int(ctx.attr("block_size"))


@semantics("DepthToSpace")
def depth_to_space(ctx):
    """y[b, h, w, c] = x[b, h // bs, w // bs, ((h % bs) bs + w % bs) C + c]: each image
    splits off alone."""
    x, bs = ctx.inputs[0], _block_size(ctx)
    channels = ctx.output_shapes[0][3]
    ctx.compute_nd(lambda idx: x[idx[0], idx[1] // bs, idx[2] // bs,
                                 ((idx[1] % bs) * bs + idx[2] % bs) * channels + idx[3]])
    for var in ("d1", "d2", "d3"):
        ctx.unsplittable(var, WHOLE_BLOCKS_REASON.format(op=ctx.type, bs=bs))


@semantics("SpaceToDepth")
def space_to_depth(ctx):
    """y[b, h, w, (oh bs + ow) C + c] = x[b, h bs + oh, w bs + ow, c]: each image splits
    off alone."""
    x, bs = ctx.inputs[0], _block_size(ctx)
    channels = x.shape[3]

    def body(idx):
        b, h, w, k = idx
        return x[b, h * bs + k // (bs * channels), w * bs + (k // channels) % bs,
                 k % channels]
    ctx.compute_nd(body)
    for var in ("d1", "d2", "d3"):
        ctx.unsplittable(var, WHOLE_BLOCKS_REASON.format(op=ctx.type, bs=bs))


@semantics("MatrixBandPart")
def matrix_band_part(ctx):
    """y[.., i, j] = x[.., i, j] inside the band, else 0: the leading dims split."""
    x = ctx.inputs[0]
    ctx.const(1)
    ctx.const(2)
    rank = x.rank
    ctx.compute_nd(lambda idx: Fn("band", x[idx], idx[rank - 2], idx[rank - 1]))
    for var in (f"d{rank - 2}", f"d{rank - 1}"):
        ctx.unsplittable(var, BAND_REASON)


# -- concatenation and splitting ------------------------------------------------------------


def _concat(ctx, values, axis_input: int) -> None:
    """y[.., j, ..] = piece p at j - offset[p], the piece chosen by `where`: a part reads only
    the pieces it overlaps (the others' regions clamp to empty)."""
    axis = normalize_axis(const_ints_of(ctx, axis_input)[0], values[0].rank)
    sizes = [v.shape[axis] for v in values]
    offsets = np.cumsum([0] + sizes[:-1]).tolist()

    def body(idx):
        j = idx[axis]

        def piece(p):
            return values[p][idx[:axis] + (shifted(j, -offsets[p]),) + idx[axis + 1:]]
        value = piece(len(values) - 1)
        for p in reversed(range(len(values) - 1)):
            value = where(j < offsets[p] + sizes[p], piece(p), value)
        return value
    ctx.compute_nd(body)


@semantics("ConcatV2")
def concat_v2(ctx):
    _concat(ctx, ctx.inputs[:-1], len(ctx.inputs) - 1)


@semantics("Concat")
def concat(ctx):
    _concat(ctx, ctx.inputs[1:], 0)


def _split(ctx, x, axis: int, pieces: list[int]) -> None:
    """Output o is x[.., j + offset[o], ..], the offsets those of the kernel's `pieces`
    (an output may be narrower than its piece: a part's local op keeps its share of each
    piece). Equal pieces share their names, so a split of the axis takes the same share of
    every piece; unequal pieces split one at a time."""
    sizes = [s[axis] for s in ctx.output_shapes]
    offsets = np.cumsum([0] + pieces[:-1]).tolist()
    equal = len(set(sizes)) == 1 and len(set(pieces)) == 1
    for o, offset in enumerate(offsets):
        names = [f"d{d}" if d != axis or equal else f"o{o}_d{d}" for d in range(x.rank)]
        ctx.compute(named(lambda idx, offset=offset: x[
            idx[:axis] + (shifted(idx[axis], offset),) + idx[axis + 1:]], names), output=o)


def split_pieces(extent: int, count: int, size_splits: list[int] | None = None) -> list[int]:
    """The sizes along the axis of the pieces the Split (`size_splits` None: `count` equal
    ones) or SplitV kernel cuts an input of `extent` into."""
    if size_splits is None:
        return [extent // count] * count
    known = sum(s for s in size_splits if s >= 0)
    return [s if s >= 0 else extent - known for s in size_splits]


def _split_local(ctx, local, x_input: int, axis: int, pieces: list[int]):
    """The kernel cuts its input into `pieces` along the axis. Axis split of equal pieces:
    the region [lo, (n-1)*size + hi] is zero-padded to n*size so that each local piece
    starts at the part's first row; crop every piece. Axis split of one unequal piece: pad
    to the whole axis, crop that piece. Axis not split but its region narrower than the
    input (a level below a split of the axis, whose outputs are narrower than their
    pieces): pad to the whole axis, crop every piece to its share."""
    split = [o for o in range(len(local.output_slices)) if split_dim(ctx, o) == axis]
    (a, b), extent = local.input_slices[x_input][axis], ctx.sem.input_shapes[x_input][axis]
    crops = list(local.output_crops)
    if not split and (a, b) == (0, extent):
        return local

    def crop_piece(o: int, keep: tuple[int, int]):
        """Output o's kernel piece along the axis, cropped to `keep` there."""
        local_y = set_item(sizes(local.output_slices[o]), axis, pieces[o])
        return crop_or_none(set_item([(0, n) for n in local_y], axis, keep), local_y)

    if split and len(split) == len(crops):
        pad = (0, len(crops) * pieces[0] - (b - a))
        for o in split:
            start, stop = local.output_slices[o][axis]
            crops[o] = crop_piece(o, (0, stop - start))
    elif split:
        pad = (a, extent - b)
        for o in split:
            crops[o] = local.output_slices[o]
    else:
        pad = (a, extent - b)
        crops = [crop_piece(o, share[axis]) for o, share in enumerate(local.output_slices)]
    pads = set_item(local.input_pads[x_input], axis, pad)
    return replace(local, **zero_padded(local, x_input, pads), output_crops=tuple(crops))


def _split_hook(ctx, local):
    x_shape = ctx.sem.input_shapes[1]
    axis = normalize_axis(const_ints(ctx.sem, 0)[0], len(x_shape))
    pieces = split_pieces(x_shape[axis], len(ctx.sem.output_shapes))
    return _split_local(ctx, local, 1, axis, pieces)


def _split_v_hook(ctx, local):
    x_shape = ctx.sem.input_shapes[0]
    axis = normalize_axis(const_ints(ctx.sem, 2)[0], len(x_shape))
    pieces = split_pieces(x_shape[axis], len(ctx.sem.output_shapes), const_ints(ctx.sem, 1))
    return _split_local(ctx, local, 0, axis, pieces)


@semantics("Split", localize=_split_hook)
def split(ctx):
    x = ctx.inputs[1]
    axis = normalize_axis(const_ints_of(ctx, 0)[0], x.rank)
    _split(ctx, x, axis, split_pieces(x.shape[axis], len(ctx.output_shapes)))


@semantics("SplitV", localize=_split_v_hook)
def split_v(ctx):
    x = ctx.inputs[0]
    axis = normalize_axis(const_ints_of(ctx, 2)[0], x.rank)
    _split(ctx, x, axis, split_pieces(x.shape[axis], len(ctx.output_shapes),
                                      const_ints_of(ctx, 1)))


def _pack_local(ctx, local):
    """A split of the stacking axis: every part stacks all inputs and keeps its rows."""
    axis = normalize_axis(int(ctx.sem.attrs.get("axis", 0)), len(ctx.sem.output_shapes[0]))
    return crop_split_outputs(ctx, local) if split_dim(ctx) == axis else local


@semantics("Pack", localize=_pack_local)
def pack(ctx):
    """y[.., n, ..] = input n[..]; other dims split every input alike."""
    axis = normalize_axis(int(ctx.attr("axis", 0)), len(ctx.output_shapes[0]))
    values = ctx.inputs

    def body(idx):
        n, rest = idx[axis], idx[:axis] + idx[axis + 1:]
        value = values[-1][rest]
        for p in reversed(range(len(values) - 1)):
            value = where(Eq(n, p), values[p][rest], value)
        return value
    ctx.compute_nd(body)


@semantics("Unpack")
def unpack(ctx):
    """Output o is x[.., o, ..]; all outputs split jointly on their shared dims."""
    x = ctx.inputs[0]
    axis = normalize_axis(int(ctx.attr("axis", 0)), x.rank)
    for o in range(len(ctx.output_shapes)):
        ctx.compute_nd(lambda idx, o=o: x[idx[:axis] + (Const(o),) + idx[axis:]], output=o)


# -- generated tensors ----------------------------------------------------------------------


@semantics("Fill", localize=shape_const_hook(0))
def fill(ctx):
    ctx.const(0)
    value = ctx.inputs[1]
    ctx.compute_nd(lambda idx: value[()])


def _range_local(ctx, local):
    """The part's elements: start + first*delta on, as many as its share."""
    start, delta = (np.asarray(ctx.sem.constants[i]).item() for i in (0, 2))
    first, stop = local.output_slices[0][0]
    count = stop - first
    local_start = start + first * delta
    exact = np.asarray(ctx.sem.constants[0]).dtype.kind in "iu"
    limit = local_start + (count if exact else count - 0.5) * delta
    return replace(local, const_inputs={0: np.asarray(local_start), 1: np.asarray(limit),
                                        2: np.asarray(delta)})


@semantics("Range", localize=_range_local)
def range_(ctx):
    """y[i] = start + i * delta: no data input, every part makes its own share."""
    for i in range(3):
        ctx.const(i)
    ctx.compute(lambda i: Fn("range", i))


def _one_hot_local(ctx, local):
    """A split of the class axis: local depth up to the part's last class, then crop
    (indices beyond the local depth give all-off rows, as beyond the real depth)."""
    axis = normalize_axis(int(ctx.sem.attrs.get("axis", -1)), len(ctx.sem.output_shapes[0]))
    if split_dim(ctx) != axis:
        return local
    share = local.output_slices[0]
    local_y = set_item(sizes(share), axis, share[axis][1])
    return replace(local, const_inputs={1: np.asarray(share[axis][1])},
                   output_crops=(crop_or_none(set_item([(0, n) for n in local_y], axis, share[axis]),
                                       local_y),))


@semantics("OneHot", localize=_one_hot_local)
def one_hot(ctx):
    indices, _, on, off = ctx.inputs
    ctx.const(1)
    axis = normalize_axis(int(ctx.attr("axis", -1)), indices.rank + 1)
    ctx.compute_nd(lambda idx: where(Eq(indices[idx[:axis] + idx[axis + 1:]], idx[axis]),
                                     on[()], off[()]))


def _cumsum_local(ctx, local):
    """A part reads the prefix (suffix when reversed) of the scan axis up to its share, less
    the element an exclusive scan skips; zero-pad that to span [0, stop) ([start, n)
    reversed) and keep the share's positions."""
    x_shape = ctx.sem.input_shapes[0]
    axis = normalize_axis(const_ints(ctx.sem, 1)[0], len(x_shape))
    start, stop = local.output_slices[0][axis]
    low, high = (start, x_shape[axis]) if ctx.sem.attrs.get("reverse") else (0, stop)
    a, b = local.input_slices[0][axis]
    pads = set_item(local.input_pads[0], axis, (a - low, high - b))
    local_y = set_item(sizes(local.output_slices[0]), axis, high - low)
    crop = set_item([(0, n) for n in local_y], axis, (start - low, stop - low))
    return replace(local, **zero_padded(local, 0, pads),
                   output_crops=(crop_or_none(crop, local_y),))


def _scan(ctx, reducer, outside: int) -> int:
    """y[i] = reducer_r x[i - r] (x[i + r] reversed; one further when exclusive), r >= 0,
    `outside` past the axis's ends (the reducer's identity). Returns the scan axis."""
    x = ctx.inputs[0]
    axis = normalize_axis(const_ints_of(ctx, 1)[0], x.rank)
    reverse, shift = bool(ctx.attr("reverse")), int(bool(ctx.attr("exclusive")))
    size = x.shape[axis]

    def term(idx, r):
        j = idx[axis] + r + shift if reverse else idx[axis] - r - shift
        inside = j < size if reverse else j >= 0
        return where(inside, x[idx[:axis] + (j,) + idx[axis + 1:]], outside)
    ctx.compute_nd(lambda idx: reducer(lambda r: term(idx, r), extents=(max(size, 1),)))
    return axis


@semantics("Cumsum", localize=_cumsum_local)
def cumsum(ctx):
    """A running sum (_scan): a part of the scan axis reads its prefix. The offset r does
    not split: no single local Cumsum yields a window of offsets."""
    _scan(ctx, Sum, 0)
    ctx.unsplittable("r", "a part of the scan offsets is a window sum, which no single "
                          "local Cumsum computes; the scan axis itself splits")


@semantics("Cumprod", localize=_cumsum_local)
def cumprod(ctx):
    """A running product (_scan). The scan axis is read whole: a part's products would
    need the parts before it. The other dims split; the element an exclusive scan never
    reads is zero-padded back, as for Cumsum."""
    axis = _scan(ctx, Prod, 1)
    reason = "a running product reads every element before it along the scan axis"
    ctx.unsplittable("r", reason)
    ctx.unsplittable(f"d{axis}", reason)


# -- shape queries --------------------------------------------------------------------------


def shape_query(ctx):
    """The output depends on the input's static shape only: the input is never read."""
    for o in range(len(ctx.output_shapes)):
        prefix = "d" if len(ctx.output_shapes) == 1 else f"o{o}_d"
        ctx.compute_nd(lambda idx: Fn("shape_of", *idx), output=o, prefix=prefix)


semantics("Shape", "ShapeN", "Size", "Rank", localize=crop_split_outputs)(shape_query)

opaque("InvertPermutation",
       reason="y[x[i]] = i scatters to data-dependent positions; a few integers")
opaque("BroadcastArgs", "BroadcastGradientArgs",
       reason="shape arithmetic on a few integers (BroadcastGradientArgs' output length "
              "depends on the values)")
opaque("Where", reason="the number of output rows depends on the values")
