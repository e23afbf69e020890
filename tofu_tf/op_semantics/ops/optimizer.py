"""Optimizer updates: ResourceApply* (dense), ResourceSparseApply* and ResourceScatter*.

They write variables in place and have no outputs; each written variable (the var and its
slots m, v, accum ...) is described by its new value. Dense updates are element-wise in
the variable's coordinates, e.g. Adam:

    m'[x] = b1 * m[x] + (1 - b1) * g[x]         v'[x] = b2 * v[x] + (1 - b2) * g[x]^2
    var'[x] = var[x] - lr * sqrt(1 - b2^t) / (1 - b1^t) * m'[x] / (sqrt(v'[x]) + eps)

so every dim splits, with var, slots and gradient cut alike and the scalar
hyper-parameters (lr, beta1_power, ...) read whole. Sparse updates and scatters write the
rows named by `indices`: a row of the variable depends on the data in `indices`, so the
first dim stays whole and the trailing dims split.
"""

from __future__ import annotations

from tofu_tf.op_semantics.helpers import broadcast
from tofu_tf.op_semantics.registry import opaque, semantics
from tofu_tf.op_semantics.tdl import Eq, Fn, Opaque, ReduceN, where

# Input names of each op, in order. Slots are written in place; "grad"/"delta" has the
# variable's shape (its rows, for sparse updates); every other input is a scalar.
SLOTS = frozenset({"var", "accum", "m", "v", "vhat", "ms", "mom", "mg", "accum_update",
                   "linear", "gradient_accumulator", "gradient_squared_accumulator"})
GRADIENTS = frozenset({"grad", "delta"})

DENSE = {
    "ResourceApplyGradientDescent": ("var", "alpha", "delta"),
    "ResourceApplyProximalGradientDescent": ("var", "alpha", "l1", "l2", "delta"),
    "ResourceApplyMomentum": ("var", "accum", "lr", "grad", "momentum"),
    "ResourceApplyKerasMomentum": ("var", "accum", "lr", "grad", "momentum"),
    "ResourceApplyAdam": ("var", "m", "v", "beta1_power", "beta2_power", "lr", "beta1",
                          "beta2", "epsilon", "grad"),
    "ResourceApplyAdamWithAmsgrad": ("var", "m", "v", "vhat", "beta1_power", "beta2_power",
                                     "lr", "beta1", "beta2", "epsilon", "grad"),
    "ResourceApplyAdaMax": ("var", "m", "v", "beta1_power", "lr", "beta1", "beta2",
                            "epsilon", "grad"),
    "ResourceApplyRMSProp": ("var", "ms", "mom", "lr", "rho", "momentum", "epsilon", "grad"),
    "ResourceApplyCenteredRMSProp": ("var", "mg", "ms", "mom", "lr", "rho", "momentum",
                                     "epsilon", "grad"),
    "ResourceApplyAdagrad": ("var", "accum", "lr", "grad"),
    "ResourceApplyAdagradV2": ("var", "accum", "lr", "epsilon", "grad"),
    "ResourceApplyProximalAdagrad": ("var", "accum", "lr", "l1", "l2", "grad"),
    "ResourceApplyAdagradDA": ("var", "gradient_accumulator", "gradient_squared_accumulator",
                               "grad", "lr", "l1", "l2", "global_step"),
    "ResourceApplyAdadelta": ("var", "accum", "accum_update", "lr", "rho", "epsilon", "grad"),
    "ResourceApplyFtrl": ("var", "accum", "linear", "grad", "lr", "l1", "l2", "lr_power"),
    "ResourceApplyFtrlV2": ("var", "accum", "linear", "grad", "lr", "l1", "l2",
                            "l2_shrinkage", "lr_power"),
    "ResourceApplyAddSign": ("var", "m", "lr", "alpha", "sign_decay", "beta", "grad"),
    "ResourceApplyPowerSign": ("var", "m", "lr", "logbase", "sign_decay", "beta", "grad"),
}

SPARSE = {
    "ResourceSparseApplyProximalGradientDescent": ("var", "alpha", "l1", "l2", "grad",
                                                   "indices"),
    "ResourceSparseApplyMomentum": ("var", "accum", "lr", "grad", "indices", "momentum"),
    "ResourceSparseApplyKerasMomentum": ("var", "accum", "lr", "grad", "indices", "momentum"),
    "ResourceSparseApplyRMSProp": ("var", "ms", "mom", "lr", "rho", "momentum", "epsilon",
                                   "grad", "indices"),
    "ResourceSparseApplyCenteredRMSProp": ("var", "mg", "ms", "mom", "lr", "rho", "momentum",
                                           "epsilon", "grad", "indices"),
    "ResourceSparseApplyAdagrad": ("var", "accum", "lr", "grad", "indices"),
    "ResourceSparseApplyAdagradV2": ("var", "accum", "lr", "epsilon", "grad", "indices"),
    "ResourceSparseApplyProximalAdagrad": ("var", "accum", "lr", "l1", "l2", "grad",
                                           "indices"),
    "ResourceSparseApplyAdagradDA": ("var", "gradient_accumulator",
                                     "gradient_squared_accumulator", "grad", "indices", "lr",
                                     "l1", "l2", "global_step"),
    "ResourceSparseApplyAdadelta": ("var", "accum", "accum_update", "lr", "rho", "epsilon",
                                    "grad", "indices"),
    "ResourceSparseApplyFtrl": ("var", "accum", "linear", "grad", "indices", "lr", "l1", "l2",
                                "lr_power"),
    "ResourceSparseApplyFtrlV2": ("var", "accum", "linear", "grad", "indices", "lr", "l1",
                                  "l2", "l2_shrinkage", "lr_power"),
}

SCATTERS = ("ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul",
            "ResourceScatterDiv", "ResourceScatterMin", "ResourceScatterMax",
            "ResourceScatterUpdate")

ROWS_BY_INDEX = ("{op} writes the rows named by the values of `indices`: a part's kernel "
                 "would need those global row numbers rebased to its own rows")

REF_OPS = ("ApplyAdaMax", "ApplyAdadelta", "ApplyAdagrad", "ApplyAdagradDA", "ApplyAdagradV2",
           "ApplyAdam", "ApplyAddSign", "ApplyCenteredRMSProp", "ApplyFtrl", "ApplyFtrlV2",
           "ApplyGradientDescent", "ApplyMomentum", "ApplyPowerSign", "ApplyProximalAdagrad",
           "ApplyProximalGradientDescent", "ApplyRMSProp", "SparseApplyAdadelta",
           "SparseApplyAdagrad", "SparseApplyAdagradDA", "SparseApplyAdagradV2",
           "SparseApplyCenteredRMSProp", "SparseApplyFtrl", "SparseApplyFtrlV2",
           "SparseApplyMomentum", "SparseApplyProximalAdagrad",
           "SparseApplyProximalGradientDescent", "SparseApplyRMSProp")

opaque(*REF_OPS, reason="ref variables are not supported, use resource variables",
       family=__name__)


def _update_all(ctx, names, row_gradient=None) -> None:
    """Every slot's new value: a function of the same coordinate of every slot, of the
    gradient (dense, or `row_gradient(idx)` for row updates) and of the scalars."""
    refs = dict(zip(names, ctx.inputs))
    slots = [n for n in names if n in SLOTS]
    scalars = [n for n in names if n not in SLOTS and n not in GRADIENTS and n != "indices"]
    shape = refs["var"].shape

    def new_value(slot):
        def body(idx):
            grad = (row_gradient(idx) if row_gradient is not None
                    else [refs[n][idx] for n in names if n in GRADIENTS][0])
            return Fn(f"{ctx.type}.{slot}", *[refs[n][idx] for n in slots], grad,
                      *[broadcast(refs[n], idx, shape) for n in scalars])
        return body
    for slot in slots:
        ctx.update(names.index(slot), new_value(slot))


@semantics(*DENSE)
def dense_update(ctx):
    _update_all(ctx, DENSE[ctx.type])


def _rows_of(indices, values):
    """The values scattered onto row idx[0]: values[p, idx[1:]] where indices[p] == idx[0].

    `values` has indices' dims then the variable's trailing dims, or is a scalar."""
    def gather(idx):
        def at(*p):
            p = p[:indices.rank]             # a scalar index binds one unused position
            value = values[()] if values.rank == 0 else values[p + tuple(idx[1:])]
            return where(Eq(indices[p], idx[0]), value, 0)
        return Opaque("rows", ReduceN("window", at, indices.shape or (1,),
                                      names=[f"p{i}" for i in range(max(1, indices.rank))]))
    return gather


@semantics(*SPARSE)
def sparse_update(ctx):
    names = SPARSE[ctx.type]
    refs = dict(zip(names, ctx.inputs))
    _update_all(ctx, names, _rows_of(refs["indices"], refs["grad"]))
    ctx.unsplittable("d0", ROWS_BY_INDEX.format(op=ctx.type))


@semantics(*SCATTERS)
def scatter(ctx):
    var, indices, updates = ctx.inputs
    rows = _rows_of(indices, updates)
    ctx.update(0, lambda idx: Fn(ctx.type, var[idx], rows(idx)))
    ctx.unsplittable("d0", ROWS_BY_INDEX.format(op=ctx.type))
