"""Normalisation: Softmax, LogSoftmax, FusedBatchNorm (V1-V3) and its gradients, LRN.

- Softmax over the last axis: out[.., j] = exp(x[.., j]) / sum_c exp(x[.., c]); the other
  dims split, the normalised axis is read whole by every element.
- Batch norm, training mode: y[n, h, w, c] uses the statistics of channel c over N, H, W;
  channels are independent and split, N/H/W are read whole. Inference mode: y is
  element-wise in x with per-channel constants, so every dim splits; the gradients of
  scale and offset are sums over N/H/W, so an N/H/W split leaves them partial sums.
- LRN: out[.., c] reads x[.., c-r .. c+r] (zeros past the edge): a channel split has a
  halo of r (2r for the gradient, whose norms reach r further).
"""

from __future__ import annotations

import inspect

from tofu_tf.op_semantics.localize import replace
from tofu_tf.op_semantics.registry import semantics
from tofu_tf.op_semantics.tdl import Fn, Opaque, ReduceN, Sum, Window

LAST_AXIS = ("{op} normalises over the last axis: each part's kernel would normalise "
             "over its share of that axis only")
BATCH_STATS = ("training-mode {op} uses statistics over {dims} of the whole batch: a "
               "part's kernel would use the statistics of its part only")


@semantics("Softmax", "LogSoftmax")
def softmax(ctx):
    x = ctx.inputs[0]

    def body(idx):
        total = Sum(lambda c: Fn("exp", x[tuple(idx[:-1]) + (c,)]))
        if ctx.type == "Softmax":
            return Fn("exp", x[idx]) / total
        return x[idx] - Fn("log", total)
    ctx.compute_nd(body)
    ctx.unsplittable(f"d{x.rank - 1}", LAST_AXIS.format(op=ctx.type))


# -- batch norm ------------------------------------------------------------------------


class _Layout:
    """A batch-norm tensor's dims named by data_format letters: 'c' the channel."""

    def __init__(self, ctx, rank: int):
        fmt = ctx.attr("data_format", "NHWC")
        if len(fmt) != rank or "C" not in fmt:
            ctx.fail(f"data_format {fmt} does not match an input of rank {rank}.")
        self.names = tuple(letter.lower() for letter in fmt)
        self.channel = self.names.index("c")
        self.batch = tuple(n for n in self.names if n != "c")   # reduced by statistics

    def compute(self, ctx, fn, output: int = 0) -> None:
        """ctx.compute with index variables named by the layout; fn gets their tuple."""
        def named(*idx):
            return fn(idx)
        named.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in self.names])
        ctx.compute(named, output=output)

    def over_batch(self, reducer: str, ref, c, element, prefix: str = ""):
        """reducer over the batch dims (N, H, W) of element(full index at channel c)."""
        def full(*batch):
            index = list(batch)
            index.insert(self.channel, c)
            return element(tuple(index))
        extents = [s for d, s in enumerate(ref.shape) if d != self.channel]
        return ReduceN(reducer, full, extents, names=[prefix + n for n in self.batch])

    def keep_batch_whole(self, ctx) -> None:
        reason = BATCH_STATS.format(op=ctx.type, dims="/".join(self.batch).upper())
        for name in self.batch:
            ctx.unsplittable(name, reason)
            ctx.unsplittable("s_" + name, reason)


def _batch_stats(layout: _Layout, x, c):
    """(mean, biased variance) of channel c over the batch dims."""
    mean = layout.over_batch("mean", x, c, lambda i: x[i], "s_")
    centred = lambda i: (x[i] - layout.over_batch("mean", x, c, lambda j: x[j], "t_")) ** 2
    return mean, layout.over_batch("mean", x, c, centred, "s_")


def _empty_outputs(ctx, first: int) -> None:
    """Outputs from `first` on carry no data (reserve spaces a CPU kernel leaves empty)."""
    for out in range(first, len(ctx.output_shapes)):
        ctx.compute_nd(lambda idx: 0.0, output=out, prefix=f"o{out}_")


@semantics("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def fused_batch_norm(ctx):
    """Outputs: y, batch mean, batch variance, reserve spaces (mean, variance, empty)."""
    x, scale, offset, mean, variance = ctx.inputs
    layout = _Layout(ctx, x.rank)
    eps = ctx.attr("epsilon", 1e-4)
    training = ctx.attr("is_training", True)
    stats = ((lambda c: _batch_stats(layout, x, c)) if training
             else (lambda c: (mean[c], variance[c])))

    def y(idx):
        c = idx[layout.channel]
        m, v = stats(c)
        return (x[idx] - m) * Fn("rsqrt", v + eps) * scale[c] + offset[c]
    layout.compute(ctx, y)
    statistics = (_training_statistics(ctx, layout, stats) if training
                  else (lambda c: mean[c], lambda c: variance[c]) * 2)
    for out, fn in enumerate(statistics, start=1):
        ctx.compute(_per_channel(fn), output=out)
    _empty_outputs(ctx, len(statistics) + 1)
    if training:
        layout.keep_batch_whole(ctx)


def _training_statistics(ctx, layout: _Layout, stats):
    """Running mean and unbiased variance (averaged with the inputs by the factor), then
    the batch mean and biased variance kept for the gradient."""
    _, _, _, mean, variance = ctx.inputs
    factor = ctx.attr("exponential_avg_factor", 1.0)
    count = _batch_count(ctx.inputs[0], layout)

    def running(old, new, c):
        return new if factor == 1.0 else old[c] * (1.0 - factor) + new * factor
    return (lambda c: running(mean, stats(c)[0], c),
            lambda c: running(variance, stats(c)[1] * count / max(1, count - 1), c),
            lambda c: stats(c)[0], lambda c: stats(c)[1])


def _per_channel(fn):
    return lambda c: fn(c)


def _batch_count(x, layout: _Layout) -> int:
    count = 1
    for d, size in enumerate(x.shape):
        count *= 1 if d == layout.channel else size
    return count


@semantics("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3")
def fused_batch_norm_grad(ctx):
    """Outputs: dx, d scale, d offset, two empty reserve spaces.

    reserve_space_1/2 hold the mean and variance the forward op normalised with.
    """
    dy, x, scale, saved_mean, saved_var = ctx.inputs[:5]
    layout = _Layout(ctx, x.rank)
    eps = ctx.attr("epsilon", 1e-4)
    training = ctx.attr("is_training", True)

    def inv_std(c):
        return Fn("rsqrt", saved_var[c] + eps)

    def x_hat(i):
        c = i[layout.channel]
        return (x[i] - saved_mean[c]) * inv_std(c)

    def dx(idx):
        c = idx[layout.channel]
        if not training:
            return dy[idx] * scale[c] * inv_std(c)
        mean_dy = layout.over_batch("mean", dy, c, lambda j: dy[j], "s_")
        mean_dy_xhat = layout.over_batch("mean", dy, c, lambda j: dy[j] * x_hat(j), "s_")
        return scale[c] * inv_std(c) * (dy[idx] - mean_dy - x_hat(idx) * mean_dy_xhat)
    layout.compute(ctx, dx)
    # Named like dx's batch dims: an N/H/W split gives dx a share and these partial sums.
    ctx.compute(lambda c: layout.over_batch("sum", dy, c, lambda j: dy[j] * x_hat(j)), 1)
    ctx.compute(lambda c: layout.over_batch("sum", dy, c, lambda j: dy[j]), 2)
    _empty_outputs(ctx, 3)
    if training:
        layout.keep_batch_whole(ctx)


# -- local response normalisation -------------------------------------------------------


def _crop_to_share(ctx, local):
    """The local kernel ran on the requested (halo-padded) region: crop to the share."""
    starts = [a for a, _ in ctx.requested[0]]
    crop = tuple((a - s, b - s) for (a, b), s in zip(local.output_slices[0], starts))
    return replace(local, output_crops=(crop,))


@semantics("LRN", localize=_crop_to_share)
def lrn(ctx):
    """out = x / (bias + alpha * sum_{|k| <= r} x[.., c + k]^2) ^ beta."""
    x = ctx.inputs[0]
    r = int(ctx.attr("depth_radius", 5))
    xp = x.padded(0.0)

    def body(idx):
        n, h, w, c = idx
        norm = Sum(lambda k: xp[n, h, w, c + k - r] ** 2, extents=(2 * r + 1,))
        return x[idx] / Fn("pow", ctx.attr("bias", 1.0) + ctx.attr("alpha", 1.0) * norm,
                           ctx.attr("beta", 0.5))
    ctx.compute_nd(body)


@semantics("LRNGrad", localize=_crop_to_share)
def lrn_grad(ctx):
    """dx[c] sums over j within r of c terms of dy[j], y[j] and the norm of j, which reads
    x within r of j. The kernel takes three inputs of one shape: all are read within 2r."""
    dy, x, y = (ref.padded(0.0) for ref in ctx.inputs)
    r = int(ctx.attr("depth_radius", 5))

    def body(idx):
        n, h, w, c = idx
        return Opaque("lrn_grad", Window(
            lambda k: Fn("lrn_grad_term", dy[n, h, w, c + k - 2 * r], x[n, h, w, c + k - 2 * r],
                         y[n, h, w, c + k - 2 * r]), extents=(4 * r + 1,)))
    ctx.compute_nd(body)
