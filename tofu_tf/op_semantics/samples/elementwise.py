"""Samples for ops/elementwise.py: every op type once, on inputs in its domain."""

import inspect

import tensorflow as tf

from tofu_tf.op_semantics.ops import elementwise as family
from tofu_tf.op_semantics.samples import arg, const, sample

POSITIVE = {"Log", "Sqrt", "Rsqrt", "Lgamma", "Digamma", "Reciprocal", "Inv", "Log1p",
            "Acosh", "Pow", "Xlogy", "Xdivy", "Xlog1py", "BesselY0", "BesselY1", "BesselK0",
            "BesselK1", "BesselK0e", "BesselK1e", "Expint", "Spence", "Igamma", "Igammac",
            "IgammaGradA", "RandomGammaGrad"}
PROBABILITY = {"Ndtri"}
COMPLEX = {"Real", "Imag", "ComplexAbs", "Conj", "Angle"}
UNIT = {"Acos", "Asin", "Atanh", "Erfinv"}
INTEGER = {"Invert", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "LeftShift", "RightShift",
           "FloorMod", "TruncateMod", "Mod", "FloorDiv", "TruncateDiv"}
BOOLEAN = {"LogicalNot", "LogicalAnd", "LogicalOr"}
SKIP = {"Bitcast", "EnsureShape", "CheckNumerics",   # sampled below with their own attrs
        "Polygamma", "Zeta"}                          # and domains


def _arg(op_type, shape):
    if op_type in BOOLEAN:
        return arg(shape, "bool")
    if op_type in INTEGER:
        return arg(shape, "int32", low=1, high=9)
    if op_type in POSITIVE:
        return arg(shape, low=0.5, high=3.0)
    if op_type in UNIT:
        return arg(shape, low=-0.9, high=0.9)
    if op_type in COMPLEX:
        return arg(shape, "complex64")
    if op_type in PROBABILITY:
        return arg(shape, low=0.05, high=0.95)
    return arg(shape)


def _raw(op_type, n):
    """Call tf.raw_ops.<op_type> with n positional tensors bound to its input names."""
    if op_type == "Cast":
        return lambda x: tf.cast(x, tf.int32)
    fn = getattr(tf.raw_ops, op_type)
    names = [p for p in inspect.signature(fn).parameters if p != "name"][:n]
    return lambda *xs: fn(**dict(zip(names, xs)))


for t in family.UNARY:
    if t not in SKIP:
        sample(t, "rank 3", _raw(t, 1), _arg(t, (4, 3, 5)))
for t in family.BINARY:
    if t in SKIP:
        continue
    if t.endswith("Grad") or t == "ApproximateEqual":
        sample(t, "same shape", _raw(t, 2), _arg(t, (4, 6)), _arg(t, (4, 6)))
    else:
        sample(t, "broadcast", _raw(t, 2), _arg(t, (4, 1, 6)), _arg(t, (5, 6)))

sample("EnsureShape", "rank 2", lambda x: tf.ensure_shape(x, (4, 6)), arg((4, 6)))
sample("CheckNumerics", "rank 2", lambda x: tf.debugging.check_numerics(x, "m"), arg((4, 6)))
sample("Bitcast", "float to int", lambda x: tf.bitcast(x, tf.int32), arg((4, 6)))
sample("SelectV2", "broadcast", lambda c, a, b: tf.where(c, a, b),
       arg((4, 1), "bool"), arg((4, 6)), arg((6,)))
sample("ClipByValue", "scalar bounds",
       lambda x, lo, hi: tf.raw_ops.ClipByValue(t=x, clip_value_min=lo, clip_value_max=hi),
       arg((4, 6)), const(-0.5, "float32"), const(0.5, "float32"))
sample("Polygamma", "orders 0-3", lambda a, x: tf.math.polygamma(a, x),
       arg((4, 1, 6), value=[[[0, 1, 2, 3, 1, 0]], [[2, 2, 0, 1, 3, 3]], [[1, 0, 0, 2, 1, 3]],
                             [[3, 1, 2, 0, 0, 2]]]), arg((5, 6), low=0.5, high=3.0))
sample("Zeta", "broadcast", lambda x, q: tf.math.zeta(x, q), arg((4, 1, 6), low=1.5, high=4.0),
       arg((5, 6), low=0.5, high=3.0))
sample("Betainc", "same shape", lambda a, b, x: tf.math.betainc(a, b, x),
       arg((4, 6), low=0.5, high=3.0), arg((4, 6), low=0.5, high=3.0),
       arg((4, 6), low=0.05, high=0.95))
sample("AddN", "three", lambda a, b, c: tf.add_n([a, b, c]), arg((4, 6)), arg((4, 6)),
       arg((4, 6)))
sample("BiasAdd", "NHWC", lambda x, b: tf.nn.bias_add(x, b), arg((2, 3, 4, 5)), arg((5,)))
sample("BiasAdd", "NCHW", lambda x, b: tf.raw_ops.BiasAdd(value=x, bias=b, data_format="NCHW"),
       arg((2, 5, 3, 4)), arg((5,)))
sample("BiasAddV1", "rank 2", lambda x, b: tf.raw_ops.BiasAddV1(value=x, bias=b),
       arg((4, 5)), arg((5,)))
sample("Select", "vector condition", lambda c, a, b: tf.raw_ops.Select(condition=c, x=a, y=b),
       arg((4,), "bool"), arg((4, 6)), arg((4, 6)))
sample("Select", "full condition", lambda c, a, b: tf.raw_ops.Select(condition=c, x=a, y=b),
       arg((4, 6), "bool"), arg((4, 6)), arg((4, 6)))
sample("ZerosLike", "rank 2", lambda x: tf.raw_ops.ZerosLike(x=x), arg((4, 6)))
sample("OnesLike", "rank 2", lambda x: tf.raw_ops.OnesLike(x=x), arg((4, 6)))
sample("IdentityN", "two", lambda a, b: tf.raw_ops.IdentityN(input=[a, b]), arg((4, 6)),
       arg((4, 5)))
