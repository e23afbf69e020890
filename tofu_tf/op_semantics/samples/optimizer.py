"""Samples for ops/optimizer.py: every update on resource variables with scalar
hyper-parameters in their usual ranges, nesterov and slot-update variants, sparse updates
and scatters with vector, matrix and scalar indices."""

import tensorflow as tf

from tofu_tf.op_semantics.ops import optimizer as family
from tofu_tf.op_semantics.samples import arg, sample, variable

SLOT_RANGES = {"var": (-1.0, 1.0), "m": (-1.0, 1.0), "mom": (-1.0, 1.0), "mg": (-0.5, 0.5),
               "linear": (-1.0, 1.0), "gradient_accumulator": (-1.0, 1.0),
               "ms": (1.0, 2.0)}                       # others: positive accumulators
SCALAR_RANGES = {"beta1_power": (0.5, 0.9), "beta2_power": (0.5, 0.9), "beta1": (0.8, 0.95),
                 "beta2": (0.9, 0.999), "epsilon": (1e-3, 1e-2), "rho": (0.8, 0.95),
                 "momentum": (0.5, 0.9), "beta": (0.8, 0.95), "lr_power": (-0.6, -0.4),
                 "logbase": (0.5, 1.0), "sign_decay": (0.5, 1.0), "l1": (0.0, 0.01),
                 "l2": (0.0, 0.01), "l2_shrinkage": (0.0, 0.01)}   # others: a learning rate
VARIANTS = {"ResourceApplyMomentum": "use_nesterov", "ResourceApplyKerasMomentum":
            "use_nesterov", "ResourceApplyAdam": "use_nesterov",
            "ResourceApplyAdagrad": "update_slots", "ResourceApplyAdagradV2": "update_slots",
            "ResourceApplyFtrl": "multiply_linear_by_lr",
            "ResourceSparseApplyMomentum": "use_nesterov",
            "ResourceSparseApplyKerasMomentum": "use_nesterov"}


def _handles(tensors):
    return [t.handle if isinstance(t, tf.Variable) else t for t in tensors]


def _build(op_type, names, **attrs):
    fn = getattr(tf.raw_ops, op_type)
    return lambda *ts: fn(**dict(zip(names, _handles(ts))), **attrs)


def _args(names, shape, rows):
    """Variables of `shape`, a gradient (of `rows` rows when sparse), indices, scalars."""
    out = []
    for name in names:
        if name in family.SLOTS:
            out.append(variable(shape, low=SLOT_RANGES.get(name, (0.1, 1.0))[0],
                                high=SLOT_RANGES.get(name, (0.1, 1.0))[1]))
        elif name in family.GRADIENTS:
            out.append(arg(shape if rows is None else (rows,) + shape[1:]))
        elif name == "indices":
            out.append(arg((rows,), "int32", low=0, high=shape[0]))
        elif name == "global_step":
            out.append(arg((), "int64", low=1, high=9))
        else:
            low, high = SCALAR_RANGES.get(name, (0.01, 0.1))
            out.append(arg((), low=low, high=high))
    return out


def _samples(op_type, names, shape, rows=None):
    flag = VARIANTS.get(op_type)
    for value in ((False, True) if flag else (None,)):
        attrs = {flag: value} if flag else {}
        label = f"{shape}" + (f" {flag}={value}" if flag else "")
        sample(op_type, label, _build(op_type, names, **attrs), *_args(names, shape, rows))


for op_type, names in family.DENSE.items():
    _samples(op_type, names, (4, 6))
_samples("ResourceApplyAdam", family.DENSE["ResourceApplyAdam"], (5, 3, 2))
_samples("ResourceApplyGradientDescent", family.DENSE["ResourceApplyGradientDescent"], (7,))
for op_type, names in family.SPARSE.items():
    _samples(op_type, names, (6, 4), rows=3)
_samples("ResourceSparseApplyAdagrad", family.SPARSE["ResourceSparseApplyAdagrad"],
         (6, 3, 4), rows=5)


def _scatter(op_type):
    fn = getattr(tf.raw_ops, op_type)
    return lambda var, indices, updates: fn(resource=var.handle, indices=indices,
                                            updates=updates)


for op_type in family.SCATTERS:
    low, high = (0.5, 2.0) if op_type in ("ResourceScatterDiv", "ResourceScatterMul") \
        else (-2.0, 2.0)
    sample(op_type, "vector indices", _scatter(op_type), variable((6, 4)),
           arg((3,), "int32", low=0, high=6), arg((3, 4), low=low, high=high))
    sample(op_type, "matrix indices", _scatter(op_type), variable((6, 3, 4)),
           arg((2, 3), "int32", low=0, high=6), arg((2, 3, 3, 4), low=low, high=high))
sample("ResourceScatterAdd", "scalar index", _scatter("ResourceScatterAdd"),
       variable((6, 4)), arg((), "int32", low=0, high=6), arg((4,)))
sample("ResourceScatterUpdate", "scalar update", _scatter("ResourceScatterUpdate"),
       variable((6, 4)), arg((3,), "int64", low=0, high=6), arg(()))
