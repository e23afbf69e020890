"""Samples for ops/reduce.py: one axis, several axes, negative axes, keep_dims, to scalar."""

import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, const, sample


def _raw(op_type, keep_dims):
    fn = getattr(tf.raw_ops, op_type)
    return lambda x, axis: fn(input=x, axis=axis, keep_dims=keep_dims)


AXES = (  # label, input shape, axis, keep_dims
    ("axis 1", (4, 6), 1, False),
    ("axis -1 keep", (4, 3, 6), -1, True),
    ("axes 0,2", (4, 3, 5), [0, 2], False),
    ("axes -3,1 keep", (4, 3, 5), [-3, 1], True),
    ("to scalar", (4, 6), [0, 1], False),
    ("no axes", (4, 6), [], False),
)

for op_type in ("Sum", "Mean", "Max", "Min", "Prod", "EuclideanNorm"):
    for label, shape, axis, keep in AXES:
        data = arg(shape, low=0.5, high=1.5) if op_type == "Prod" else arg(shape)
        sample(op_type, label, _raw(op_type, keep), data, const(axis, "int32"))
for op_type in ("All", "Any"):
    for label, shape, axis, keep in AXES[:4]:
        sample(op_type, label, _raw(op_type, keep), arg(shape, "bool"), const(axis, "int32"))

sample("Sum", "int64 axis int32 data", _raw("Sum", False), arg((4, 6), "int32"),
       const([1], "int64"))
sample("Max", "int32", _raw("Max", True), arg((5, 6), "int32", low=-9, high=9),
       const(0, "int32"))
sample("Mean", "int32", _raw("Mean", False), arg((4, 6), "int32", low=0, high=9),
       const(1, "int32"))

for op_type in ("ArgMax", "ArgMin"):
    fn = getattr(tf.raw_ops, op_type)
    sample(op_type, "axis 1", lambda x, a, fn=fn: fn(input=x, dimension=a),
           arg((4, 6, 5)), const(1, "int32"))
    sample(op_type, "axis -1 int32", lambda x, a, fn=fn: fn(input=x, dimension=a,
                                                           output_type=tf.int32),
           arg((4, 6)), const(-1, "int64"))

# Random floats: no ties among a row's values, so the indices do not depend on the order
# the kernel compares them in.
sample("TopKV2", "k 3, rank 3", lambda x, k: tf.raw_ops.TopKV2(input=x, k=k),
       arg((4, 3, 7)), const(3, "int32"))
sample("TopKV2", "k 1, rank 2, int64 k", lambda x, k: tf.raw_ops.TopKV2(input=x, k=k),
       arg((6, 5)), const(1, "int64"))

sample("L2Loss", "rank 2", lambda x: tf.raw_ops.L2Loss(t=x), arg((4, 6)))
sample("L2Loss", "rank 3", lambda x: tf.raw_ops.L2Loss(t=x), arg((2, 3, 5)))
sample("BiasAddGrad", "NHWC", lambda dy: tf.raw_ops.BiasAddGrad(out_backprop=dy),
       arg((2, 3, 4, 5)))
sample("BiasAddGrad", "NCHW",
       lambda dy: tf.raw_ops.BiasAddGrad(out_backprop=dy, data_format="NCHW"),
       arg((2, 5, 3, 4)))
sample("BiasAddGrad", "rank 2", lambda dy: tf.raw_ops.BiasAddGrad(out_backprop=dy),
       arg((6, 5)))
for op_type in ("LowerBound", "UpperBound"):
    fn = getattr(tf.raw_ops, op_type)
    sample(op_type, "rows", lambda s, v, fn=fn: fn(sorted_inputs=tf.sort(s), values=v),
           arg((3, 7)), arg((3, 5)))
