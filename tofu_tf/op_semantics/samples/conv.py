"""Samples for ops/conv.py: odd spatial sizes so splits are uneven and windows overhang.

NCHW and dilated gradients run on CPU only through oneDNN; those samples are added where
this TensorFlow's CPU kernels run them.
"""

import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, const, sample

R = tf.raw_ops
EXPLICIT = (0, 0, 1, 2, 2, 0, 0, 0)          # NHWC: top 1, bottom 2, left 2, right 0

# (label, x shape NHWC, filter shape, stride, padding, dilation, explicit paddings)
CONV2D = (
    ("3x3 s1 SAME", (2, 9, 9, 3), (3, 3, 3, 4), 1, "SAME", 1, ()),
    ("3x3 s2 SAME", (2, 11, 11, 3), (3, 3, 3, 4), 2, "SAME", 1, ()),
    ("3x3 s1 VALID", (2, 9, 9, 3), (3, 3, 3, 4), 1, "VALID", 1, ()),
    ("3x3 s2 VALID", (2, 11, 11, 3), (3, 3, 3, 4), 2, "VALID", 1, ()),
    ("3x3 dilation 2 SAME", (2, 11, 11, 3), (3, 3, 3, 4), 1, "SAME", 2, ()),
    ("3x3 dilation 2 VALID", (2, 11, 9, 3), (3, 3, 3, 4), 1, "VALID", 2, ()),
    ("2x4 s2 EXPLICIT", (2, 9, 11, 3), (2, 4, 3, 4), 2, "EXPLICIT", 1, EXPLICIT),
    ("1x1 s2", (2, 9, 9, 3), (1, 1, 3, 4), 2, "SAME", 1, ()),
    ("4x4 s2 SAME", (2, 11, 9, 3), (4, 4, 3, 4), 2, "SAME", 1, ()),
    # a filter wider than the input (the last blocks of a small-input MobileNetV3): taps
    # past the edge read padding only
    ("5x5 SAME on 2x1", (2, 2, 1, 3), (5, 5, 3, 4), 1, "SAME", 1, ()),
)
DEPTHWISE = (
    ("M2 3x3 s2 SAME", (2, 11, 9, 3), (3, 3, 3, 2), 2, "SAME", 1, ()),
    ("M1 3x3 s1 VALID", (2, 9, 9, 3), (3, 3, 3, 1), 1, "VALID", 1, ()),
    ("M2 3x3 dilation 2 SAME", (2, 9, 11, 3), (3, 3, 3, 2), 1, "SAME", 2, ()),
    ("M2 2x4 s2 EXPLICIT", (2, 9, 11, 3), (2, 4, 3, 2), 2, "EXPLICIT", 1, EXPLICIT),
    ("M1 5x5 SAME on 1x1", (2, 1, 1, 3), (5, 5, 3, 1), 1, "SAME", 1, ()),
)
NCHW = ("NCHW 3x3 s2 SAME", (2, 3, 11, 9), (3, 3, 3, 2), 2, "SAME", 1, ())
# (label, x shape NDHWC, filter shape, stride, padding)
CONV3D = (
    ("3x3x3 s2 SAME", (1, 7, 5, 9, 2), (3, 3, 3, 2, 3), 2, "SAME"),
    ("2x3x2 s1 VALID", (2, 5, 7, 5, 2), (2, 3, 2, 2, 3), 1, "VALID"),
)


def _attrs(stride, padding, dilation, explicit=(), channels_first=False, rank=4):
    def per_dim(v):
        spatial = [v] * (rank - 2)
        return [1, 1, *spatial] if channels_first else [1, *spatial, 1]
    out = dict(strides=per_dim(stride), padding=padding, dilations=per_dim(dilation),
               data_format=("NC" if channels_first else "N")
               + ("DHW" if rank == 5 else "HW") + ("" if channels_first else "C"))
    if rank == 4:
        out["explicit_paddings"] = list(explicit)
    return out


def _out_size(size, k, s, padding, d=1, before_after=(0, 0)):
    if padding == "SAME":
        return -(-size // s)
    return (size + sum(before_after) - (k - 1) * d - 1) // s + 1


def _out_shape(x, w, s, padding, d=1, explicit=(), out_channels=None, channels_first=False):
    """The forward output shape of a conv of x with filter w (spatial dims first in w)."""
    spatial = range(2, len(x)) if channels_first else range(1, len(x) - 1)
    out = list(x)
    for i, dim in enumerate(spatial):
        pads = tuple(explicit[2 * dim:2 * dim + 2]) if explicit else (0, 0)
        out[dim] = _out_size(x[dim], w[i], s, padding, d, pads)
    out[1 if channels_first else -1] = w[-1] if out_channels is None else out_channels
    return tuple(out)


def _kernel_runs(build, *shapes) -> bool:
    """Whether this TensorFlow's CPU kernels run `build` on zeros of these shapes."""
    try:
        build(*(tf.zeros(s) for s in shapes))
        return True
    except (tf.errors.OpError, ValueError):
        return False


def _conv_family(forward, backprop_input, backprop_filter, label, x, w, dy, attrs,
                 gradients=True):
    sample(forward, label, lambda a, b: getattr(R, forward)(input=a, filter=b, **attrs),
           arg(x), arg(w))
    if not gradients:
        return
    sample(backprop_input, label,
           lambda n, b, g: getattr(R, backprop_input)(
               input_sizes=n, filter=b, out_backprop=g, **attrs),
           const(x, "int32"), arg(w), arg(dy))
    sample(backprop_filter, label,
           lambda a, n, g: getattr(R, backprop_filter)(
               input=a, filter_sizes=n, out_backprop=g, **attrs),
           arg(x), const(w, "int32"), arg(dy))


CONV_OPS = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")
DEPTHWISE_OPS = ("DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                 "DepthwiseConv2dNativeBackpropFilter")
DILATED_GRADIENTS = _kernel_runs(
    lambda x, w, g: R.Conv2DBackpropFilter(input=x, filter_sizes=[3, 3, 1, 1], out_backprop=g,
                                           **_attrs(1, "SAME", 2)),
    (1, 5, 5, 1), (3, 3, 1, 1), (1, 5, 5, 1))
DILATED_DEPTHWISE = _kernel_runs(
    lambda x, w: R.DepthwiseConv2dNative(input=x, filter=w, **_attrs(1, "SAME", 2)),
    (1, 5, 5, 1), (3, 3, 1, 1))
CHANNELS_FIRST = _kernel_runs(
    lambda x, w: R.Conv2D(input=x, filter=w, **_attrs(1, "SAME", 1, channels_first=True)),
    (1, 1, 5, 5), (3, 3, 1, 1))

for label, x, w, s, pad, dil, ex in CONV2D:
    _conv_family(*CONV_OPS, label, x, w, _out_shape(x, w, s, pad, dil, ex),
                 _attrs(s, pad, dil, ex), gradients=dil == 1 or DILATED_GRADIENTS)

for label, x, w, s, pad, dil, ex in DEPTHWISE:
    if dil == 1 or DILATED_DEPTHWISE:
        _conv_family(*DEPTHWISE_OPS, label, x, w,
                     _out_shape(x, w, s, pad, dil, ex, out_channels=w[2] * w[3]),
                     _attrs(s, pad, dil, ex))

if CHANNELS_FIRST:
    label, x, w, s, pad, dil, _ = NCHW
    _conv_family(*CONV_OPS, label, x, w, _out_shape(x, w, s, pad, channels_first=True),
                 _attrs(s, pad, dil, channels_first=True))
    _conv_family(*DEPTHWISE_OPS, label, x, w,
                 _out_shape(x, w, s, pad, out_channels=w[2] * w[3], channels_first=True),
                 _attrs(s, pad, dil, channels_first=True))

for label, x, w, s, pad in CONV3D:
    _conv_family("Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2", label, x, w,
                 _out_shape(x, w, s, pad), _attrs(s, pad, 1, rank=5))

PATCHES = (("3x3 s2 SAME", (2, 9, 11, 3), (3, 3), (2, 2), (1, 1), "SAME"),
           ("2x3 s(1,2) rate 2 VALID", (2, 8, 9, 2), (2, 3), (1, 2), (2, 2), "VALID"),
           ("4x4 s4 VALID (ViT patches)", (2, 8, 12, 3), (4, 4), (4, 4), (1, 1), "VALID"))
for label, x, k, s, r, pad in PATCHES:
    sample("ExtractImagePatches", label,
           lambda a, k=k, s=s, r=r, pad=pad: tf.image.extract_patches(
               a, [1, *k, 1], [1, *s, 1], [1, *r, 1], pad), arg(x))
