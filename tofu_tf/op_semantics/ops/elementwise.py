"""Element-wise ops: unary, broadcasting binary and ternary, n-ary sums, their gradients.

Every output element reads the same coordinates of each input (size-1 dims broadcast), so
every output dim splits and each input is split along with it (or replicated where it
broadcasts). Which function is applied does not matter to the regions.
"""

from __future__ import annotations

from tofu_tf.op_semantics.helpers import broadcast
from tofu_tf.op_semantics.localize import replace
from tofu_tf.op_semantics.registry import semantics
from tofu_tf.op_semantics.tdl import Fn

UNARY = (
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Cos", "Cosh", "Digamma",
    "Elu", "Erf", "Erfc", "Erfinv", "Exp", "Expm1", "Floor", "Inv", "Invert", "IsFinite",
    "IsInf", "IsNan", "LeakyRelu", "Lgamma", "Log", "Log1p", "LogicalNot", "Neg", "Reciprocal",
    "Relu", "Relu6", "Rint", "Round", "Rsqrt", "Selu", "Sigmoid", "Sign", "Sin", "Sinh",
    "Softplus", "Softsign", "Sqrt", "Square", "Tan", "Tanh", "Cast", "Identity", "Snapshot",
    "StopGradient", "PreventGradient", "CheckNumerics", "Bitcast",
    # special functions (tf.math.special; gradients of Lgamma, Digamma and the Bessels)
    "BesselI0", "BesselI1", "BesselI0e", "BesselI1e", "BesselJ0", "BesselJ1", "BesselY0",
    "BesselY1", "BesselK0", "BesselK1", "BesselK0e", "BesselK1e", "Dawsn", "Expint",
    "FresnelCos", "FresnelSin", "Spence", "Ndtri",
    # parts of complex numbers
    "Real", "Imag", "ComplexAbs", "Conj", "Angle",
)

BINARY = (
    "Add", "AddV2", "Sub", "Mul", "MulNoNan", "Div", "RealDiv", "DivNoNan", "FloorDiv",
    "FloorMod", "TruncateDiv", "TruncateMod", "Mod", "Maximum", "Minimum", "Pow",
    "SquaredDifference", "Atan2", "Xdivy", "Xlogy", "Xlog1py", "Less", "LessEqual", "Greater",
    "GreaterEqual", "Equal", "NotEqual", "LogicalAnd", "LogicalOr", "ApproximateEqual",
    "BitwiseAnd", "BitwiseOr", "BitwiseXor", "LeftShift", "RightShift",
    # gradients of element-wise activations: grad(dy, y or x)
    "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad", "SoftplusGrad",
    "SoftsignGrad", "SigmoidGrad", "TanhGrad", "RsqrtGrad", "SqrtGrad", "ReciprocalGrad",
    "InvGrad",
    # incomplete gamma and zeta functions and the gradients that use them
    "Igamma", "Igammac", "IgammaGradA", "Polygamma", "Zeta", "RandomGammaGrad",
    "Complex",
)

TERNARY = ("SelectV2", "ClipByValue", "Betainc")


def _elementwise(ctx):
    out = ctx.output_shapes[0]
    ctx.compute_nd(lambda idx: Fn(ctx.type, *[broadcast(r, idx, out) for r in ctx.inputs]))


semantics(*UNARY, *BINARY, *TERNARY, "AddN")(_elementwise)


@semantics("BiasAdd", "BiasAddV1")
def bias_add(ctx):
    """out = x + b along the channel dim (last for NHWC, 1 for NCHW)."""
    x, b = ctx.inputs
    channel = 1 if ctx.attr("data_format", "NHWC") == "NCHW" else x.rank - 1
    ctx.compute_nd(lambda idx: Fn("add", x[idx], b[idx[channel]]))


@semantics("Select")
def select(ctx):
    """Select(cond, t, e): cond is t's shape, or a vector picking rows of t."""
    cond, t, e = ctx.inputs
    if cond.rank == 1 and t.rank > 1:
        ctx.compute_nd(lambda idx: Fn("where", cond[idx[0]], t[idx], e[idx]))
    else:
        ctx.compute_nd(lambda idx: Fn("where", cond[idx], t[idx], e[idx]))


@semantics("ZerosLike", "OnesLike")
def like(ctx):
    """A constant of the input's shape. The kernel takes its shape from the input, so the
    part reads its share of the input (the values are ignored)."""
    x = ctx.inputs[0]
    ctx.compute_nd(lambda idx: Fn(ctx.type, x[idx]))


@semantics("IdentityN")
def identity_n(ctx):
    """Independent identities: each output splits on its own variables."""
    for i in range(len(ctx.output_shapes)):
        ctx.compute_nd(lambda idx, i=i: ctx.inputs[i][idx], output=i, prefix=f"o{i}_d")


def _local_shape_attr(ctx, local):
    """EnsureShape checks its input against attr `shape`: give it the part's shape."""
    return replace(local, attrs={**local.attrs, "shape": ctx.output_shape(0)})


@semantics("EnsureShape", localize=_local_shape_attr)
def ensure_shape(ctx):
    x = ctx.inputs[0]
    ctx.compute_nd(lambda idx: x[idx])
