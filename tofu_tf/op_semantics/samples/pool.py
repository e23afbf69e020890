"""Samples for ops/pool.py: odd spatial sizes so splits are uneven and windows overhang.

NCHW pooling runs on CPU only through oneDNN; those samples are added where this
TensorFlow's CPU kernels run them.
"""

import numpy as np
import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, const, sample

R = tf.raw_ops

# (label, x shape, window, stride, padding, explicit paddings or None)
MAX = (
    ("3x3 s2 SAME", (2, 11, 9, 3), 3, 2, "SAME", None),
    ("2x2 s2 VALID", (2, 9, 11, 3), 2, 2, "VALID", None),
    ("3x3 s1 SAME", (2, 9, 9, 2), 3, 1, "SAME", None),
    ("3x3 s2 EXPLICIT", (2, 9, 11, 2), 3, 2, "EXPLICIT", [0, 0, 1, 2, 2, 0, 0, 0]),
)
AVG = (
    ("3x3 s2 VALID", (2, 11, 9, 3), 3, 2, "VALID"),
    ("3x3 s2 SAME", (2, 11, 9, 3), 3, 2, "SAME"),
    ("3x3 s1 SAME", (2, 9, 11, 2), 3, 1, "SAME"),
    ("2x2 s2 SAME", (2, 9, 11, 2), 2, 2, "SAME"),
    ("4x4 s2 SAME", (2, 11, 9, 2), 4, 2, "SAME"),
    ("5x5 s3 SAME", (1, 11, 13, 2), 5, 3, "SAME"),
    ("1x1 s2 SAME", (2, 9, 11, 2), 1, 2, "SAME"),
    ("2x2 s3 VALID", (2, 11, 9, 2), 2, 3, "VALID"),
    ("2x2 s3 SAME", (2, 10, 13, 2), 2, 3, "SAME"),
)


def _window(size, channels_first=False):
    return [1, 1, size, size] if channels_first else [1, size, size, 1]


def _out_shape(x, k, s, padding, explicit=None):
    """The pooled shape of NHWC x."""
    out = list(x)
    for dim in (1, 2):
        before_after = sum(explicit[2 * dim:2 * dim + 2]) if explicit else 0
        out[dim] = (-(-x[dim] // s) if padding == "SAME"
                    else (x[dim] + before_after - k) // s + 1)
    return tuple(out)


def _pool_attrs(k, s, padding, explicit=None, channels_first=False):
    out = dict(ksize=_window(k, channels_first), strides=_window(s, channels_first),
               padding=padding,
               data_format="NCHW" if channels_first else "NHWC")
    if explicit is not None:
        out["explicit_paddings"] = explicit
    return out


def _kernel_runs(build, *shapes) -> bool:
    """Whether this TensorFlow's CPU kernels run `build` on zeros of these shapes."""
    try:
        build(*(tf.zeros(s) for s in shapes))
        return True
    except (tf.errors.OpError, ValueError):
        return False


def _tied(shape, seed=7):
    """Values from {0, 1, 2}: windows hold several maxima."""
    return np.random.default_rng(seed).integers(0, 3, shape).astype(np.float32)


def _max_grad(attrs):
    def build(x, g):
        y = R.MaxPool(input=x, **attrs)
        return R.MaxPoolGrad(orig_input=x, orig_output=y, grad=g, **attrs)
    return build


def _max_grad_grad(attrs):
    def build(x, g):
        y = R.MaxPool(input=x, **attrs)
        return R.MaxPoolGradGrad(orig_input=x, orig_output=y, grad=g, **attrs)
    return build


for label, x, k, s, pad, ex in MAX:
    attrs = _pool_attrs(k, s, pad, ex)
    y = _out_shape(x, k, s, pad, ex)
    sample("MaxPool", label, lambda a, attrs=attrs: R.MaxPool(input=a, **attrs), arg(x))
    sample("MaxPoolGrad", label, _max_grad(attrs), arg(x), arg(y))
    sample("MaxPoolGrad", label + " ties", _max_grad(attrs), arg(x, value=_tied(x)), arg(y))
    if pad != "EXPLICIT":                     # MaxPoolGradGrad takes SAME or VALID
        sample("MaxPoolGradGrad", label, _max_grad_grad(attrs), arg(x), arg(x))
        sample("MaxPoolGradGrad", label + " ties", _max_grad_grad(attrs),
               arg(x, value=_tied(x)), arg(x))

sample("MaxPoolV2", "3x3 s2 SAME",
       lambda a, k, s: R.MaxPoolV2(input=a, ksize=k, strides=s, padding="SAME"),
       arg((2, 11, 9, 3)), const([1, 3, 3, 1], "int32"), const([1, 2, 2, 1], "int32"))
for label, k, s, pad in (("3x3 s2 SAME", 3, 2, "SAME"), ("2x2 s2 VALID", 2, 2, "VALID")):
    x = (2, 11, 9, 3)
    sample("MaxPoolGradV2", label,
           lambda a, g, k_, s_, pad=pad: R.MaxPoolGradV2(
               orig_input=a, orig_output=R.MaxPoolV2(input=a, ksize=k_, strides=s_, padding=pad),
               grad=g, ksize=k_, strides=s_, padding=pad),
           arg(x), arg(_out_shape(x, k, s, pad)), const(_window(k), "int32"),
           const(_window(s), "int32"))
    sample("MaxPoolGradGradV2", label,
           lambda a, g, k_, s_, pad=pad: R.MaxPoolGradGradV2(
               orig_input=a, orig_output=R.MaxPoolV2(input=a, ksize=k_, strides=s_, padding=pad),
               grad=g, ksize=k_, strides=s_, padding=pad),
           arg(x), arg(x), const(_window(k), "int32"), const(_window(s), "int32"))
sample("MaxPoolV2", "2x2 s2 VALID",
       lambda a, k, s: R.MaxPoolV2(input=a, ksize=k, strides=s, padding="VALID"),
       arg((2, 9, 11, 3)), const([1, 2, 2, 1], "int32"), const([1, 2, 2, 1], "int32"))

for label, x, k, s, pad in AVG:
    attrs = _pool_attrs(k, s, pad)
    y = _out_shape(x, k, s, pad)
    sample("AvgPool", label, lambda a, attrs=attrs: R.AvgPool(value=a, **attrs), arg(x))
    sample("AvgPoolGrad", label,
           lambda n, g, attrs=attrs: R.AvgPoolGrad(orig_input_shape=n, grad=g, **attrs),
           const(x, "int32"), arg(y))

NCHW = _pool_attrs(3, 2, "SAME", channels_first=True)
if _kernel_runs(lambda x: R.AvgPool(value=x, **NCHW), (1, 1, 5, 5)):
    sample("MaxPool", "NCHW 3x3 s2 SAME", lambda a: R.MaxPool(input=a, **NCHW),
           arg((2, 3, 11, 9)))
    sample("AvgPool", "NCHW 3x3 s2 SAME", lambda a: R.AvgPool(value=a, **NCHW),
           arg((2, 3, 11, 9)))
    sample("AvgPoolGrad", "NCHW 3x3 s2 SAME",
           lambda n, g: R.AvgPoolGrad(orig_input_shape=n, grad=g, **NCHW),
           const((2, 3, 11, 9), "int32"), arg((2, 3, 6, 5)))

# 3-D pooling (NDHWC): odd sizes, SAME and VALID, windows of different depth.
POOL3D = (("2x3x3 s(1,2,2) SAME", (2, 5, 7, 6, 2), (2, 3, 3), (1, 2, 2), "SAME"),
          ("2x2x2 s2 VALID", (2, 6, 5, 7, 2), (2, 2, 2), (2, 2, 2), "VALID"))
for label, x, k, s, pad in POOL3D:
    attrs = dict(ksize=[1, *k, 1], strides=[1, *s, 1], padding=pad, data_format="NDHWC")
    y = R.MaxPool3D(input=tf.zeros(x), **attrs).shape
    sample("MaxPool3D", label, lambda a, attrs=attrs: R.MaxPool3D(input=a, **attrs), arg(x))
    sample("MaxPool3DGrad", label,
           lambda a, g, attrs=attrs: R.MaxPool3DGrad(
               orig_input=a, orig_output=R.MaxPool3D(input=a, **attrs), grad=g, **attrs),
           arg(x), arg(tuple(y)))
    sample("MaxPool3DGradGrad", label,
           lambda a, g, attrs=attrs: R.MaxPool3DGradGrad(
               orig_input=a, orig_output=R.MaxPool3D(input=a, **attrs), grad=g, **attrs),
           arg(x), arg(x))
    sample("MaxPool3DGrad", label + " ties",
           lambda a, g, attrs=attrs: R.MaxPool3DGrad(
               orig_input=a, orig_output=R.MaxPool3D(input=a, **attrs), grad=g, **attrs),
           arg(x, value=_tied(x)), arg(tuple(y)))
    sample("AvgPool3D", label, lambda a, attrs=attrs: R.AvgPool3D(input=a, **attrs), arg(x))
    sample("AvgPool3DGrad", label,
           lambda n, g, attrs=attrs: R.AvgPool3DGrad(orig_input_shape=n, grad=g, **attrs),
           const(x, "int32"), arg(tuple(y)))
