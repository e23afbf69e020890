"""Samples for ops/linalg.py: well-conditioned batches of matrices (diagonally dominant,
or a Gram matrix for Cholesky), broadcast batch dims for the triangular solve."""

import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, sample

R = tf.raw_ops


def _dominant(x):
    return x + 6.0 * tf.eye(x.shape[-1], batch_shape=x.shape[:-2])


sample("MatrixInverse", "batch of 4x4", lambda x: R.MatrixInverse(input=_dominant(x)),
       arg((3, 2, 4, 4)))
sample("MatrixInverse", "adjoint", lambda x: R.MatrixInverse(input=_dominant(x), adjoint=True),
       arg((4, 3, 3)))
sample("Cholesky", "Gram matrices",
       lambda x: R.Cholesky(input=tf.matmul(x, x, transpose_b=True) + tf.eye(4)),
       arg((3, 4, 4)))
sample("MatrixDeterminant", "batch", lambda x: R.MatrixDeterminant(input=_dominant(x)),
       arg((3, 2, 4, 4)))
sample("LogMatrixDeterminant", "batch",
       lambda x: R.LogMatrixDeterminant(input=_dominant(x) * tf.constant([1.0, -1.0, 1.0])
                                        [:, None, None]), arg((3, 4, 4)))
sample("MatrixSolve", "columns", lambda a, b: R.MatrixSolve(matrix=_dominant(a), rhs=b),
       arg((3, 4, 4)), arg((3, 4, 5)))
sample("MatrixSolve", "adjoint", lambda a, b: R.MatrixSolve(matrix=_dominant(a), rhs=b,
                                                            adjoint=True),
       arg((2, 3, 3, 3)), arg((2, 3, 3, 2)))
sample("MatrixTriangularSolve", "lower, broadcast matrix",
       lambda a, b: R.MatrixTriangularSolve(matrix=tf.linalg.band_part(_dominant(a), -1, 0),
                                            rhs=b, lower=True),
       arg((1, 4, 4)), arg((3, 4, 5)))
sample("MatrixTriangularSolve", "upper, adjoint",
       lambda a, b: R.MatrixTriangularSolve(matrix=tf.linalg.band_part(_dominant(a), 0, -1),
                                            rhs=b, lower=False, adjoint=True),
       arg((3, 4, 4)), arg((3, 4, 2)))
sample("MatrixDiagPartV3", "k = 1", lambda x: R.MatrixDiagPartV3(input=x, k=1, padding_value=0.0),
       arg((3, 4, 5)))
sample("MatrixDiagPartV3", "band -1..2, right-left aligned",
       lambda x: R.MatrixDiagPartV3(input=x, k=[-1, 2], padding_value=9.0, align="RIGHT_LEFT"),
       arg((2, 3, 4, 5)))
sample("MatrixSetDiagV3", "k = -1", lambda x, d: R.MatrixSetDiagV3(input=x, diagonal=d, k=-1),
       arg((3, 5, 4)), arg((3, 4)))
sample("MatrixSetDiagV3", "band 0..1",
       lambda x, d: R.MatrixSetDiagV3(input=x, diagonal=d, k=[0, 1], align="LEFT_RIGHT"),
       arg((2, 3, 4, 4)), arg((2, 3, 2, 4)))
sample("MatrixDiagV3", "k = 0, square",
       lambda d: R.MatrixDiagV3(diagonal=d, k=0, num_rows=-1, num_cols=-1, padding_value=0.0),
       arg((3, 2, 4)))
sample("MatrixDiagV3", "band -1..1, 4x5",
       lambda d: R.MatrixDiagV3(diagonal=d, k=[-1, 1], num_rows=4, num_cols=5,
                                padding_value=0.5), arg((3, 3, 4)))
sample("Cross", "vectors", lambda a, b: R.Cross(a=a, b=b), arg((4, 5, 3)), arg((4, 5, 3)))
