"""Building blocks for localize hooks (no TensorFlow): constants, crops, pads, shapes."""

from __future__ import annotations

import inspect

import numpy as np

from tofu_tf.op_semantics.localize import replace

def named(fn, names):
    """`fn(index_tuple)` as a lambda with parameters `names`, for `ctx.compute`: outputs
    that share a name split jointly, a name of its own splits one output alone."""
    def call(*index):
        return fn(index)
    call.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    return call


def const_ints(sem, index: int) -> list[int]:
    """A meta input's value (kept in the semantics) as a flat list of ints."""
    return [int(v) for v in np.asarray(sem.constants[index]).reshape(-1)]


def const_ints_of(ctx, index: int) -> list[int]:
    return [int(v) for v in np.asarray(ctx.const(index)).reshape(-1)]


def set_item(items, index, value) -> tuple:
    items = list(items)
    items[index] = value
    return tuple(items)


def sizes(slices) -> list[int]:
    return [b - a for a, b in slices]


def crop_or_none(crop, local_shape):
    """The crop of a local output, or None when it keeps all of it."""
    crop = tuple((int(a), int(b)) for a, b in crop)
    return None if crop == tuple((0, int(n)) for n in local_shape) else crop


def split_dim(ctx, output: int = 0):
    """The output dim the strategy splits, or None (replicated, partial, or unsplit)."""
    if ctx.strategy is None or ctx.strategy.outputs[output].kind != "split":
        return None
    return ctx.strategy.outputs[output].dim


def shifted(var, offset: int, stride: int = 1):
    """`offset + stride * var`, without the trivial terms."""
    term = var if stride == 1 else var * stride
    return term if offset == 0 else term + offset


def zero_padded(local, index: int, pads) -> dict:
    """replace() changes that pad input `index` with zeros (what the crop drops)."""
    return dict(input_pads=set_item(local.input_pads, index, tuple(pads)),
                input_fills=set_item(local.input_fills, index, 0.0))


def crop_split_outputs(ctx, local):
    """Hook: the local op computes each split output whole; keep the part's share."""
    crops = tuple(local.output_slices[o] if split_dim(ctx, o) is not None else crop
                  for o, crop in enumerate(local.output_crops))
    return replace(local, output_crops=crops)


def shape_const_hook(index: int):
    """Hook: constant input `index` is the output shape; give it the part's shape."""
    def hook(ctx, local):
        shape = np.asarray(sizes(local.output_slices[0]), dtype=np.int64)
        return replace(local, const_inputs={**local.const_inputs, index: shape})
    return hook
