"""Reductions: Sum, Mean, Max, Min, Prod, All, Any, EuclideanNorm, ArgMax/ArgMin, L2Loss,
BiasAddGrad; row searches: TopKV2, LowerBound / UpperBound (searchsorted).

out[kept] = R(lambda r: x[kept, r]): a kept dim splits the output and the input alike; a
reduced dim splits the input and leaves a Partial output combined with the reducer
(sum(a ++ b) = sum(a) + sum(b), likewise max, min, prod; a mean is the parts' means
weighted by their shares). All is a min and Any a max over booleans. EuclideanNorm and
ArgMax/ArgMin are not linear in their reduction: only the kept dims split.
"""

from __future__ import annotations

from tofu_tf.op_semantics.helpers import normalize_axes, normalize_axis
from tofu_tf.op_semantics.registry import semantics
from tofu_tf.op_semantics.tdl import Fn, Opaque, ReduceN

REDUCERS = {"Sum": "sum", "Mean": "mean", "Max": "max", "Min": "min", "Prod": "prod",
            "All": "min", "Any": "max"}

INTEGER_MEAN = ("an integer mean truncates each part's mean, so the parts' weighted "
                "means do not add up to the whole mean")


def _reduced_name(axis: int) -> str:
    return f"r{axis}"


def _reduction(ctx, reducer: str, element, axes: tuple[int, ...], keep_dims: bool,
               outer=lambda total: total) -> None:
    """out[kept] = outer(reducer over x's `axes` of element(x's full index))."""
    x = ctx.inputs[0]
    kept = [d for d in range(x.rank) if d not in axes]

    def body(idx):
        out_kept = [idx[d] for d in kept] if keep_dims else list(idx)

        def full_index(*reduced):
            index = [None] * x.rank
            for d, v in zip(kept, out_kept):
                index[d] = v
            for d, v in zip(axes, reduced):
                index[d] = v
            return tuple(index)
        if not axes:
            return outer(element(full_index()))
        return outer(ReduceN(reducer, lambda *r: element(full_index(*r)),
                             [x.shape[a] for a in axes],
                             names=[_reduced_name(a) for a in axes]))
    ctx.compute_nd(body)


@semantics(*REDUCERS)
def reduce(ctx):
    x = ctx.inputs[0]
    axes = normalize_axes(ctx.const(1), x.rank)
    _reduction(ctx, REDUCERS[ctx.type], lambda index: x[index], axes,
               bool(ctx.attr("keep_dims", False)))
    if ctx.type == "Mean" and not ctx.input_dtypes[0].startswith(("float", "bfloat",
                                                                  "complex")):
        for a in axes:
            ctx.unsplittable(_reduced_name(a), INTEGER_MEAN)


@semantics("EuclideanNorm")
def euclidean_norm(ctx):
    """sqrt(sum x^2): the square root of a partial sum is no partial; kept dims split."""
    x = ctx.inputs[0]
    axes = normalize_axes(ctx.const(1), x.rank)
    _reduction(ctx, "sum", lambda index: x[index] * x[index], axes,
               bool(ctx.attr("keep_dims", False)), outer=lambda total: Fn("sqrt", total))


@semantics("ArgMax", "ArgMin")
def arg_reduce(ctx):
    """out[kept] = position of the extreme along `axis`: that axis is read whole."""
    x = ctx.inputs[0]
    axis = normalize_axis(int(ctx.const(1)), x.rank)

    def body(idx):
        def element(r):
            return x[tuple(idx[:axis]) + (r,) + tuple(idx[axis:])]
        return Opaque(ctx.type.lower(), ReduceN("window", element, [x.shape[axis]],
                                                names=[_reduced_name(axis)]))
    ctx.compute_nd(body)


@semantics("TopKV2")
def top_k(ctx):
    """values, indices[lead.., j] = the j-th largest of x[lead.., :] and its position: each
    row is read whole, and the k positions come from one sort of it (a part holding some
    of them would rank its own)."""
    x = ctx.inputs[0]
    ctx.const(1)
    last = x.rank - 1
    for output, name in enumerate(("top_k_values", "top_k_indices")):
        def body(idx, name=name):
            def element(r):
                return x[tuple(idx[:last]) + (r,)]
            return Opaque(name, idx[last], ReduceN("window", element, [x.shape[last]],
                                                   names=[_reduced_name(last)]))
        ctx.compute_nd(body, output=output)
    ctx.unsplittable(f"d{last}", "TopKV2 ranks the whole row: a part of the k positions "
                                 "is not the top k of a part")


@semantics("LowerBound", "UpperBound")
def bound(ctx):
    """y[lead.., m] = where values[lead.., m] would go in the sorted row
    sorted_inputs[lead.., :] (read whole); the values split with the batch dims."""
    rows, values = ctx.inputs[:2]
    last = values.rank - 1

    def body(idx):
        row = ReduceN("window", lambda r: rows[tuple(idx[:last]) + (r,)], [rows.shape[last]],
                      names=[_reduced_name(last)])
        return Opaque(ctx.type.lower(), row, values[idx])
    ctx.compute_nd(body)


@semantics("L2Loss")
def l2_loss(ctx):
    """sum(x^2) / 2 over every dim: each dim splits into a partial sum."""
    x = ctx.inputs[0]
    ctx.compute(lambda: ReduceN("sum", lambda *r: x[r] * x[r], x.shape,
                                names=[_reduced_name(a) for a in range(x.rank)]) * 0.5)


@semantics("BiasAddGrad")
def bias_add_grad(ctx):
    """db[c] = sum of dy over every dim but the channel (last for NHWC, 1 for NCHW)."""
    dy = ctx.inputs[0]
    channel = 1 if ctx.attr("data_format", "NHWC") == "NCHW" else dy.rank - 1
    others = [d for d in range(dy.rank) if d != channel]

    def element(c, *r):
        index = list(r)
        index.insert(channel, c)
        return dy[tuple(index)]
    ctx.compute(lambda c: ReduceN("sum", lambda *r: element(c, *r),
                                  [dy.shape[d] for d in others],
                                  names=[_reduced_name(d) for d in others]))
