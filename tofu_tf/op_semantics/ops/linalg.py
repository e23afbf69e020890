"""Matrix functions: MatrixInverse, Cholesky, MatrixDeterminant, LogMatrixDeterminant,
MatrixSolve, MatrixTriangularSolve (the transforms of Keras's RandomRotation and kin are
inverted per image; least squares and Gaussian process losses solve), and diagonals:
MatrixDiagV3, MatrixDiagPartV3, MatrixSetDiagV3 (tf.linalg.diag, diag_part, set_diag,
keras.ops.diagonal, Cholesky's gradient); Cross (the cross product of 3-vectors).

Each output matrix (or determinant) is a function of its whole input matrix: the two
matrix dims stay whole and the batch dims split. A solve's right-hand side columns are
independent: they split too (each part solves its own columns with the whole matrix). The
diagonal ops keep their matrices and diagonals whole too (a block of a matrix holds its
diagonals at other offsets and lengths, not described); their batch dims split.
"""

from __future__ import annotations

from tofu_tf.op_semantics.helpers import whole_inner
from tofu_tf.op_semantics.registry import semantics
from tofu_tf.op_semantics.tdl import Const, Fn, Opaque, ReduceN

MATRIX_REASON = "{op} is a function of the whole matrix: a part of it is no {op} of a part"


def _batch(ref, lead) -> tuple:
    """ref's batch index (all but its innermost two dims) at the output's batch index
    `lead`: broadcast, ref's batch dims align to the right and size-1 dims read 0."""
    offset = len(lead) - (ref.rank - 2)
    return tuple(Const(0) if size == 1 else lead[offset + d]
                 for d, size in enumerate(ref.shape[:-2]))


def _matrix(ref, lead):
    """ref's whole innermost matrix at the output's batch index `lead`."""
    index = _batch(ref, lead)
    return ReduceN("window", lambda a, b: ref[index + (a, b)], ref.shape[-2:],
                   names=["ma", "mb"])


@semantics("MatrixInverse", "Cholesky")
def square(ctx):
    """y[.., i, j] = f(x[.., :, :])[i, j]."""
    whole_inner(ctx, ctx.inputs[:1], 2, MATRIX_REASON.format(op=ctx.type))


@semantics("MatrixDeterminant", "LogMatrixDeterminant")
def determinant(ctx):
    """y[..] = det(x[.., :, :]) (LogMatrixDeterminant: its sign and log |det|)."""
    x = ctx.inputs[0]
    for o in range(len(ctx.output_shapes)):         # one kernel: the outputs split alike
        ctx.compute_nd(lambda idx, o=o: Opaque(f"{ctx.type.lower()}_{o}",
                                               _matrix(x, idx)), output=o)


@semantics("MatrixSolve", "MatrixTriangularSolve")
def solve(ctx):
    """y[.., i, k] = (matrix[.., :, :] solved against rhs[.., :, k])[i]."""
    matrix, rhs = ctx.inputs[:2]
    lead = len(ctx.output_shapes[0]) - 2

    def body(idx):
        batch = _batch(rhs, idx[:lead])
        column = ReduceN("window", lambda r: rhs[batch + (r, idx[lead + 1])],
                         [rhs.shape[-2]], names=["r"])
        return Opaque(ctx.type.lower(), _matrix(matrix, idx[:lead]), column,
                      Fn("position", idx[lead]))
    ctx.compute_nd(body)
    ctx.unsplittable(f"d{lead}", MATRIX_REASON.format(op=ctx.type))


@semantics("MatrixDiagPartV3")
def diag_part(ctx):
    """y[.., (d,) t] = the diagonal(s) k of x[.., :, :] at t (padding_value past one's end)."""
    ctx.const(1)
    whole_inner(ctx, ctx.inputs[:1], 2, MATRIX_REASON.format(op=ctx.type),
                extra=[ctx.inputs[2][()]])               # padding_value


@semantics("MatrixSetDiagV3")
def set_diag(ctx):
    """y[.., i, j] = diagonal(s)[..] where (i, j) lies on diagonal k, else x[.., i, j]."""
    x, diagonal = ctx.inputs[:2]
    ctx.const(2)
    lead = x.rank - 2
    ctx.compute_nd(lambda idx: Opaque("matrix_set_diag", _matrix(x, idx[:lead]),
                                      _diagonals(diagonal, idx[:lead]),
                                      Fn("position", *idx[lead:])))
    for d in (lead, lead + 1):
        ctx.unsplittable(f"d{d}", MATRIX_REASON.format(op=ctx.type))


@semantics("MatrixDiagV3")
def diag(ctx):
    """y[.., i, j] = diagonal(s)[..] where (i, j) lies on diagonal k, else padding_value."""
    diagonal, padding = ctx.inputs[0], ctx.inputs[4]
    for i in (1, 2, 3):                          # k, num_rows, num_cols
        ctx.const(i)
    lead = len(ctx.output_shapes[0]) - 2
    ctx.compute_nd(lambda idx: Opaque("matrix_diag", _diagonals(diagonal, idx[:lead]),
                                      padding[()], Fn("position", *idx[lead:])))
    for d in (lead, lead + 1):
        ctx.unsplittable(f"d{d}", MATRIX_REASON.format(op=ctx.type))


def _diagonals(diagonal, lead):
    """All of `diagonal` at batch index `lead` (its dims past the batch: one diagonal's
    positions, or a band's diagonals and positions)."""
    rest = diagonal.shape[len(lead):]
    return ReduceN("window", lambda *r: diagonal[tuple(lead) + r], rest,
                   names=[f"g{d}" for d in range(len(rest))])


@semantics("Cross")
def cross(ctx):
    """y[.., i] = (a[.., :] x b[.., :])[i]: each vector whole, the batch dims split."""
    whole_inner(ctx, ctx.inputs, 1, "a cross product's component reads the other two")
