"""Matrix products: MatMul, BatchMatMul (V1-V3), Einsum, SparseTensorDenseMatMul.

out[i, j] = sum_k A[i, k] * B[k, j]: i and j split the output, k is a partial sum.
Batch dims of BatchMatMulV2/V3 broadcast like element-wise ops. A sparse A (a graph's
adjacency in a GCN) sums over its entries e: out[i, j] = sum_e (v[e] * B[c[e], j] where
r[e] == i); j and e split (e a partial sum), and i, an index held as data, as a segment
sum's segments do: each part computes every row and keeps its own.
"""

from __future__ import annotations

from tofu_tf.op_semantics.hooks import crop_split_outputs, split_dim
from tofu_tf.op_semantics.registry import semantics
from tofu_tf.op_semantics.tdl import Const, Eq, ReduceN, Sum, where


@semantics("MatMul")
def matmul(ctx):
    a, b = ctx.inputs
    A = a.T if ctx.attr("transpose_a", False) else a
    B = b.T if ctx.attr("transpose_b", False) else b
    ctx.compute(lambda i, j: Sum(lambda k: A[i, k] * B[k, j]))


def _batch_operand(ref, batch_vars, out_batch_shape, row, col, adjoint):
    """Index a batched operand: broadcast batch dims, then [row, col] (swapped if adjoint)."""
    last = (col, row) if adjoint else (row, col)
    offset = len(out_batch_shape) - (ref.rank - 2)
    idx = []
    for d in range(ref.rank - 2):
        size, out_size = ref.shape[d], out_batch_shape[offset + d]
        idx.append(Const(0) if size == 1 and out_size != 1 else batch_vars[offset + d])
    return ref[tuple(idx) + last]


@semantics("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def batch_matmul(ctx):
    a, b = ctx.inputs
    adj_a = bool(ctx.attr("adj_x", False))
    adj_b = bool(ctx.attr("adj_y", False))
    out_shape = ctx.output_shapes[0]
    batch_shape = out_shape[:-2]

    def body(idx):
        batch, i, j = idx[:-2], idx[-2], idx[-1]
        return Sum(lambda k: _batch_operand(a, batch, batch_shape, i, k, adj_a)
                   * _batch_operand(b, batch, batch_shape, k, j, adj_b))
    ctx.compute_nd(body)


@semantics("Einsum")
def einsum(ctx):
    """Einsum without ellipsis: output labels are output vars, the rest are summed."""
    equation = ctx.attr("equation").replace(" ", "")
    lhs, _, out = equation.partition("->")
    operands = lhs.split(",")
    if "." in equation or len(operands) != len(ctx.inputs):
        ctx.fail(f"einsum equation '{equation}' is not supported (ellipsis or operand count).",
                 fix="rewrite the contraction without '...'.")
    sizes = {}
    for labels, ref in zip(operands, ctx.inputs):
        for label, size in zip(labels, ref.shape):
            sizes[label] = max(size, sizes.get(label, 1))
    summed = [l for l in dict.fromkeys("".join(operands)) if l not in out]
    out_vars = {}

    def read(ref, labels, env):
        return ref[tuple(Const(0) if ref.shape[p] == 1 and sizes[l] != 1 else env[l]
                         for p, l in enumerate(labels))]

    def product(env):
        value = read(ctx.inputs[0], operands[0], env)
        for ref, labels in zip(ctx.inputs[1:], operands[1:]):
            value = value * read(ref, labels, env)
        return value

    def body(idx):
        out_vars.update(zip(out, idx))
        if not summed:
            return product(out_vars)
        return ReduceN("sum", lambda *red: product({**out_vars, **dict(zip(summed, red))}),
                       [sizes[l] for l in summed], names=[f"r_{l}" for l in summed])
    ctx.compute_nd(body, prefix="o_")



def _sparse_matmul_local(ctx, local):
    """A split of the output's rows (indexed by data): every part computes every row, keeps
    its own (the kernel checks each index against the dense shape)."""
    return crop_split_outputs(ctx, local) if split_dim(ctx) == 0 else local


@semantics("SparseTensorDenseMatMul", localize=_sparse_matmul_local)
def sparse_dense_matmul(ctx):
    """y[i, j] = Sum(e: values[e] * B[c(e), j] where r(e) == i), (r, c) the entry's row and
    column (swapped by adjoint_a), B transposed by adjoint_b."""
    indices, values, _, dense = ctx.inputs
    ctx.const(2)                                            # a_shape
    row, col = (1, 0) if ctx.attr("adjoint_a", False) else (0, 1)
    adjoint_b = bool(ctx.attr("adjoint_b", False))

    def body(i, j):
        def entry(e):
            k = indices[e, Const(col)]
            return where(Eq(indices[e, Const(row)], i),
                         values[e] * (dense[j, k] if adjoint_b else dense[k, j]), 0)
        return Sum(entry, [values.shape[0]])
    ctx.compute(body)
