"""Samples for ops/nn_loss.py: dense labels (same shape and broadcast rows), sparse labels
of both index types."""

import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, sample


def _dense(features, labels):
    return tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=features, labels=labels)


def _sparse(features, labels):
    return tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=features, labels=labels)


sample("SoftmaxCrossEntropyWithLogits", "same shape", _dense, arg((6, 5)),
       arg((6, 5), low=0.0, high=1.0))
sample("SoftmaxCrossEntropyWithLogits", "labels broadcast", _dense, arg((6, 5)),
       arg((1, 5), low=0.0, high=1.0))
sample("SparseSoftmaxCrossEntropyWithLogits", "int32 labels", _sparse, arg((6, 5)),
       arg((6,), "int32", low=0, high=5))
sample("SparseSoftmaxCrossEntropyWithLogits", "int64 labels", _sparse, arg((7, 4)),
       arg((7,), "int64", low=0, high=4))
