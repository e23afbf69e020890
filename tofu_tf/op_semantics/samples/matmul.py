"""Samples for ops/matmul.py."""

import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, sample

for ta in (False, True):
    for tb in (False, True):
        sample("MatMul", f"ta={ta} tb={tb}",
               lambda a, b, ta=ta, tb=tb: tf.matmul(a, b, transpose_a=ta, transpose_b=tb),
               arg((7, 5) if ta else (5, 7)), arg((6, 7) if tb else (7, 6)))

sample("BatchMatMulV2", "broadcast batch", lambda a, b: tf.matmul(a, b),
       arg((3, 1, 4, 6)), arg((5, 6, 7)))
sample("BatchMatMulV2", "adjoint", lambda a, b: tf.matmul(a, b, adjoint_a=True, adjoint_b=True),
       arg((2, 6, 5)), arg((2, 7, 6)))
sample("BatchMatMul", "v1", lambda a, b: tf.raw_ops.BatchMatMul(x=a, y=b),
       arg((2, 5, 6)), arg((2, 6, 4)))
sample("BatchMatMulV3", "v3", lambda a, b: tf.raw_ops.BatchMatMulV3(x=a, y=b, Tout=tf.float32),
       arg((2, 5, 6)), arg((1, 6, 4)))
sample("Einsum", "bij,jk->bik", lambda a, b: tf.einsum("bij,jk->bik", a, b),
       arg((2, 5, 6)), arg((6, 4)))
sample("Einsum", "bhqd,bhkd->bhqk", lambda a, b: tf.einsum("bhqd,bhkd->bhqk", a, b),
       arg((2, 3, 5, 4)), arg((2, 3, 6, 4)))
sample("Einsum", "ij->ji", lambda a: tf.einsum("ij->ji", a), arg((5, 6)))
# A sparse 6x5 matrix of 9 entries (one repeated), times a dense one; adjoints.
ENTRIES = [[0, 1], [2, 4], [5, 0], [3, 3], [0, 1], [1, 2], [4, 4], [5, 3], [2, 0]]
sample("SparseTensorDenseMatMul", "entries",
       lambda i, v, b: tf.raw_ops.SparseTensorDenseMatMul(a_indices=i, a_values=v,
                                                           a_shape=[6, 5], b=b),
       arg((9, 2), "int64", value=ENTRIES), arg((9,)), arg((5, 4)))
sample("SparseTensorDenseMatMul", "adjoint a and b",
       lambda i, v, b: tf.raw_ops.SparseTensorDenseMatMul(
           a_indices=i, a_values=v, a_shape=[6, 5], b=b, adjoint_a=True, adjoint_b=True),
       arg((9, 2), "int64", value=ENTRIES), arg((9,)), arg((3, 6)))
