"""Samples for ops/norm.py: softmax ranks, batch norm in training and inference mode (both
layouts, V1-V3, with a running-average factor), their gradients, LRN."""

import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, sample

sample("Softmax", "rank 2", lambda x: tf.raw_ops.Softmax(logits=x), arg((4, 6)))
sample("Softmax", "rank 3", lambda x: tf.raw_ops.Softmax(logits=x), arg((4, 3, 6)))
sample("LogSoftmax", "rank 2", lambda x: tf.raw_ops.LogSoftmax(logits=x), arg((4, 6)))
sample("LogSoftmax", "rank 3", lambda x: tf.raw_ops.LogSoftmax(logits=x), arg((3, 4, 6)))

NHWC, NCHW = (2, 4, 3, 5), (2, 5, 4, 3)
CHANNELS = (5,)


def _bn(op_type, training, data_format="NHWC", factor=1.0):
    fn = getattr(tf.raw_ops, op_type)
    extra = {} if op_type == "FusedBatchNorm" else {"exponential_avg_factor": factor}
    return lambda x, s, o, m, v: fn(x=x, scale=s, offset=o, mean=m, variance=v,
                                    is_training=training, data_format=data_format,
                                    epsilon=1e-3, **extra)


def _stats_args(shape, training, factor):
    size = CHANNELS if not training or factor != 1.0 else (0,)
    return arg(CHANNELS), arg(CHANNELS), arg(size), arg(size, low=0.5, high=2.0)


for op_type in ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"):
    for training in (True, False):
        for fmt, shape in (("NHWC", NHWC), ("NCHW", NCHW)):
            sample(op_type, f"training={training} {fmt}", _bn(op_type, training, fmt),
                   arg(shape), *_stats_args(shape, training, 1.0))
for op_type in ("FusedBatchNormV2", "FusedBatchNormV3"):
    sample(op_type, "training running average", _bn(op_type, True, factor=0.3),
           arg(NHWC), *_stats_args(NHWC, True, 0.3))


def _bn_grad(op_type, training, data_format="NHWC"):
    forward = "FusedBatchNormV3" if op_type.endswith("V3") else "FusedBatchNorm"

    def build(dy, x, s, m, v):
        # Inference reads the population statistics, as TensorFlow's gradient passes them
        # (the forward op's reserve spaces are not written then: heap garbage, maybe NaN).
        out = _bn(forward, training, data_format)(x, s, s, m, v)
        spaces = {"reserve_space_3": out[5]} if op_type.endswith("V3") else {}
        mean, variance = (out[3], out[4]) if training else (m, v)
        return getattr(tf.raw_ops, op_type)(
            y_backprop=dy, x=x, scale=s, reserve_space_1=mean, reserve_space_2=variance,
            is_training=training, data_format=data_format, epsilon=1e-3, **spaces)
    return build


for op_type in ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"):
    for training in (True, False):
        for fmt, shape in (("NHWC", NHWC), ("NCHW", NCHW)):
            sample(op_type, f"training={training} {fmt}", _bn_grad(op_type, training, fmt),
                   arg(shape), arg(shape), arg(CHANNELS),
                   *_stats_args(shape, training, 1.0)[2:])


def _lrn(**attrs):
    return lambda x: tf.raw_ops.LRN(input=x, **attrs)


def _lrn_grad(**attrs):
    def build(dy, x):
        return tf.raw_ops.LRNGrad(input_grads=dy, input_image=x,
                                  output_image=tf.raw_ops.LRN(input=x, **attrs), **attrs)
    return build


for r in (1, 2):
    attrs = dict(depth_radius=r, bias=1.0, alpha=0.5, beta=0.75)
    sample("LRN", f"radius {r}", _lrn(**attrs), arg((2, 3, 4, 9)))
    sample("LRNGrad", f"radius {r}", _lrn_grad(**attrs), arg((2, 3, 4, 9)), arg((2, 3, 4, 9)))
