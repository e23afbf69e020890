"""Samples for ops/sources.py: variable reads and in-place writes on real variables.
Const, Placeholder, PlaceholderWithDefault, VarHandleOp and NoOp need none."""

import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, sample, variable

sample("ReadVariableOp", "rank 2",
       lambda v: tf.raw_ops.ReadVariableOp(resource=v.handle, dtype=tf.float32),
       variable((4, 5)))
for op_type in ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"):
    sample(op_type, "rank 2",
           lambda v, x, op_type=op_type: getattr(tf.raw_ops, op_type)(resource=v.handle,
                                                                       value=x),
           variable((4, 5)), arg((4, 5)))
sample("VariableShape", "rank 2", lambda v: tf.raw_ops.VariableShape(input=v.handle),
       variable((4, 5)))
sample("PlaceholderWithDefault", "rank 2",
       lambda x: tf.raw_ops.PlaceholderWithDefault(input=x, shape=(4, 5)), arg((4, 5)))
