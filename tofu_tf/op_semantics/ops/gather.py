"""Gathers, scatters and segment reductions: GatherV2, Gather, ResourceGather, GatherNd,
ScatterNd, TensorScatterUpdate / Add / Sub / Max / Min and UnsortedSegmentSum / Max / Min /
Prod.

A gathered element is params[.., indices[i], ..]: the index is data, so a split on an
indices dim cuts indices and takes params whole along the gathered axis, and a split on
another params dim cuts params and takes indices whole. A segment reduction
out[s] = R_i (data[i] where ids[i] == s) splits on i (each part reduces its own rows:
Partial), on the trailing dims, and on s (every part reduces all rows into all segments
and keeps its own: the kernel rejects ids beyond num_segments, so it cannot be narrowed).
ScatterNd (the gradient of GatherNd and of TopKV2) is a segment sum whose segment is a
coordinate of `depth` dims: likewise. TensorScatterUpdate and its kin write the updates
into a copy of their tensor: a split of the trailing dims cuts tensor and updates alike; a
split of an indexed dim runs the whole op and keeps the part's share (an update's order
among duplicates, and the kernel's bounds check, need all of it).
"""

from __future__ import annotations

import numpy as np

from tofu_tf.op_semantics.helpers import normalize_axis
from tofu_tf.op_semantics.hooks import crop_split_outputs, sizes, split_dim
from tofu_tf.op_semantics.localize import replace
from tofu_tf.op_semantics.registry import semantics
from tofu_tf.op_semantics.tdl import Const, Eq, Fn, Opaque, ReduceN, where


def _gather(ctx, params, indices, axis: int, batch_dims: int) -> None:
    """y[outer, picks, inner] = params[outer, indices[outer[:batch_dims], picks], inner]."""
    picked = indices.rank - batch_dims

    def body(idx):
        outer, picks, inner = idx[:axis], idx[axis:axis + picked], idx[axis + picked:]
        index = indices[tuple(outer[:batch_dims]) + tuple(picks)]
        return params[tuple(outer) + (index,) + tuple(inner)]
    ctx.compute_nd(body)


@semantics("GatherV2")
def gather_v2(ctx):
    params, indices = ctx.inputs[:2]
    batch_dims = normalize_axis(int(ctx.attr("batch_dims", 0) or 0), indices.rank)
    axis = normalize_axis(int(ctx.const(2)), params.rank)
    _gather(ctx, params, indices, axis, batch_dims)


@semantics("Gather")
def gather(ctx):
    params, indices = ctx.inputs
    _gather(ctx, params, indices, 0, 0)


@semantics("ResourceGather")
def resource_gather(ctx):
    """The resource input stands for the variable's value; it gathers on dim batch_dims."""
    variable, indices = ctx.inputs
    batch_dims = int(ctx.attr("batch_dims", 0) or 0)
    _gather(ctx, variable, indices, batch_dims, batch_dims)


@semantics("GatherNd")
def gather_nd(ctx):
    """y[lead, inner] = params[lead[:b], indices[lead, 0], .., indices[lead, q-1], inner]."""
    params, indices = ctx.inputs
    batch_dims = int(ctx.attr("batch_dims", 0) or 0)
    depth, lead_rank = indices.shape[-1], indices.rank - 1

    def body(idx):
        lead, inner = tuple(idx[:lead_rank]), tuple(idx[lead_rank:])
        coords = tuple(indices[lead + (Const(c),)] for c in range(depth))
        return params[lead[:batch_dims] + coords + inner]
    ctx.compute_nd(body)


SEGMENT_REDUCERS = {"UnsortedSegmentSum": "sum", "UnsortedSegmentMax": "max",
                    "UnsortedSegmentMin": "min", "UnsortedSegmentProd": "prod"}
IDENTITY = {"sum": 0, "prod": 1, "max": float("-inf"), "min": float("inf")}


def _segment_local(ctx, local):
    """A split of the segments: each part computes every segment and keeps its own."""
    return crop_split_outputs(ctx, local) if split_dim(ctx) == 0 else local


@semantics(*SEGMENT_REDUCERS, localize=_segment_local)
def unsorted_segment(ctx):
    """out[s, rest] = R over ids' dims r of (data[r, rest] where ids[r] == s)."""
    data, ids = ctx.inputs[:2]
    if ctx.is_const(2):
        ctx.const(2)
    reducer = SEGMENT_REDUCERS[ctx.type]
    identity = IDENTITY[reducer]

    def element(s, r, rest):
        return where(Eq(ids[r], s), data[r + rest], identity)

    def body(idx):
        s, rest = idx[0], tuple(idx[1:])
        if ids.rank == 0:
            return element(s, (), rest)
        return ReduceN(reducer, lambda *r: element(s, r, rest), ids.shape)
    ctx.compute_nd(body)


def _splits_an_indexed_dim(ctx, indices: int) -> bool:
    """Whether the strategy splits an output dim that input `indices` addresses."""
    dim = split_dim(ctx)
    return dim is not None and dim < ctx.sem.input_shapes[indices][-1]


def _scatter_nd_local(ctx, local):
    """A split of an indexed dim: each part scatters every update it has into the whole of
    that dim and keeps its own share (the kernel rejects indices past the shape). Else the
    shape input's trailing dims are the part's (its indexed dims stay as they are: a level
    above may have kept them whole)."""
    if _splits_an_indexed_dim(ctx, 0):
        return crop_split_outputs(ctx, local)
    depth = ctx.sem.input_shapes[0][-1]
    shape = np.array(ctx.sem.constants[2])
    shape[depth:] = sizes(local.output_slices[0])[depth:]
    return replace(local, const_inputs={**local.const_inputs, 2: shape})


@semantics("ScatterNd", localize=_scatter_nd_local)
def scatter_nd(ctx):
    """out[c, inner] = sum over the updates' leading dims r of (updates[r, inner] where
    indices[r, :] == c); duplicate indices add."""
    indices, updates = ctx.inputs[:2]
    ctx.const(2)
    depth, lead = indices.shape[-1], indices.shape[:-1]

    def element(c, r, inner):
        value = updates[r + inner]
        for k in reversed(range(depth)):
            value = where(Eq(indices[r + (Const(k),)], c[k]), value, 0)
        return value

    def body(idx):
        c, inner = tuple(idx[:depth]), tuple(idx[depth:])
        if not lead:
            return element(c, (), inner)
        return ReduceN("sum", lambda *r: element(c, r, inner), lead)
    ctx.compute_nd(body)


TENSOR_SCATTERS = ("TensorScatterUpdate", "TensorScatterAdd", "TensorScatterSub",
                   "TensorScatterMax", "TensorScatterMin")


def _tensor_scatter_local(ctx, local):
    """A split of an indexed dim: the whole op, the part's share kept."""
    return crop_split_outputs(ctx, local) if _splits_an_indexed_dim(ctx, 1) else local


@semantics(*TENSOR_SCATTERS, localize=_tensor_scatter_local)
def tensor_scatter(ctx):
    """out[c, inner] = tensor[c, inner] combined with every updates[r, inner] whose
    indices[r, :] == c: a function of the tensor's whole indexed dims (the kernel checks
    every index against them) and of all the updates, at the trailing position `inner`."""
    tensor, indices, updates = ctx.inputs[:3]
    depth, lead = indices.shape[-1], indices.shape[:-1]

    def body(idx):
        c, inner = tuple(idx[:depth]), tuple(idx[depth:])
        whole = ReduceN("window", lambda *cs: tensor[cs + inner], tensor.shape[:depth],
                        names=[f"c{d}" for d in range(depth)])

        def row(*r):
            return Fn("row", *(indices[r + (Const(k),)] for k in range(depth)),
                      updates[r + inner])
        rows = (ReduceN("window", row, lead, names=[f"r{d}" for d in range(len(lead))])
                if lead else row())
        return Opaque(ctx.type.lower(), whole, rows, Fn("position", *c))
    ctx.compute_nd(body)
