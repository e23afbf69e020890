"""Losses: SoftmaxCrossEntropyWithLogits and its sparse form.

loss[i] = sum_j labels[i, j] * (logsumexp_c x[i, c] - x[i, j]); backprop[i, j] =
softmax(x)[i, j] - labels[i, j]. Rows are independent: the batch dim splits both outputs.
The class dim is normalised by the log-sum-exp of the whole row, so it stays whole.
"""

from __future__ import annotations

from tofu_tf.op_semantics.helpers import broadcast
from tofu_tf.op_semantics.registry import semantics
from tofu_tf.op_semantics.tdl import Eq, Fn, Sum, where

CLASS_AXIS = ("{op} normalises each row over the class dim: a part's kernel would take "
              "the log-sum-exp of its share of the classes only")


def _sum_exp(logits, i):
    """sum_c exp(logits(i, c)) over the whole row."""
    return Sum(lambda c: Fn("exp", logits(i, c)))


@semantics("SoftmaxCrossEntropyWithLogits")
def softmax_cross_entropy(ctx):
    """features and labels broadcast to [batch, classes]."""
    features, labels = ctx.inputs
    shape = ctx.output_shapes[1]
    x = lambda i, j: broadcast(features, (i, j), shape)
    y = lambda i, j: broadcast(labels, (i, j), shape)
    ctx.compute(lambda i: Sum(lambda j: y(i, j) * (Fn("log", _sum_exp(x, i)) - x(i, j))), 0)
    ctx.compute(lambda i, j: Fn("exp", x(i, j)) / _sum_exp(x, i) - y(i, j), 1)
    ctx.unsplittable("j", CLASS_AXIS.format(op=ctx.type))


@semantics("SparseSoftmaxCrossEntropyWithLogits")
def sparse_softmax_cross_entropy(ctx):
    """labels[i] is the class index of row i."""
    features, labels = ctx.inputs
    x = lambda i, j: features[i, j]
    ctx.compute(lambda i: Fn("log", _sum_exp(x, i)) - features[i, labels[i]], 0)
    ctx.compute(lambda i, j: Fn("exp", x(i, j)) / _sum_exp(x, i)
                - where(Eq(j, labels[i]), 1.0, 0.0), 1)
    ctx.unsplittable("j", CLASS_AXIS.format(op=ctx.type))
