"""Samples for ops/conv.py: odd spatial sizes so splits are uneven and windows overhang."""

import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, const, sample

R = tf.raw_ops
EXPLICIT = [0, 0, 1, 2, 2, 0, 0, 0]          # NHWC: top 1, bottom 2, left 2, right 0

# (label, x shape, filter shape, stride, padding, dilation, explicit paddings)
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
)


def _attrs(stride, padding, dilation, explicit, rank=4):
    spatial = [1] + [stride] * (rank - 2) + [1]
    dil = [1] + [dilation] * (rank - 2) + [1]
    out = dict(strides=spatial, padding=padding, dilations=dil)
    if rank == 4:
        out["explicit_paddings"] = list(explicit)
    return out


def _forward_shape(x, w, stride, padding, dilation, explicit, depthwise=False):
    """The forward output shape (run once, eagerly)."""
    op = R.DepthwiseConv2dNative if depthwise else R.Conv2D
    y = op(input=tf.zeros(x), filter=tf.zeros(w), **_attrs(stride, padding, dilation, explicit))
    return tuple(y.shape)


for label, x, w, s, pad, dil, ex in CONV2D:
    attrs = _attrs(s, pad, dil, ex)
    dy = _forward_shape(x, w, s, pad, dil, ex)
    sample("Conv2D", label, lambda a, b, attrs=attrs: R.Conv2D(input=a, filter=b, **attrs),
           arg(x), arg(w))
    sample("Conv2DBackpropInput", label,
           lambda n, b, g, attrs=attrs: R.Conv2DBackpropInput(
               input_sizes=n, filter=b, out_backprop=g, **attrs),
           const(x, "int32"), arg(w), arg(dy))
    sample("Conv2DBackpropFilter", label,
           lambda a, n, g, attrs=attrs: R.Conv2DBackpropFilter(
               input=a, filter_sizes=n, out_backprop=g, **attrs),
           arg(x), const(w, "int32"), arg(dy))

sample("Conv2D", "NCHW 3x3 s2 SAME",
       lambda a, b: R.Conv2D(input=a, filter=b, strides=[1, 1, 2, 2], padding="SAME",
                             data_format="NCHW"),
       arg((2, 3, 11, 9)), arg((3, 3, 3, 4)))

DEPTHWISE = (
    ("M2 3x3 s2 SAME", (2, 11, 9, 3), (3, 3, 3, 2), 2, "SAME", 1, ()),
    ("M1 3x3 s1 VALID", (2, 9, 9, 3), (3, 3, 3, 1), 1, "VALID", 1, ()),
    ("M2 3x3 dilation 2 SAME", (2, 9, 11, 3), (3, 3, 3, 2), 1, "SAME", 2, ()),
    ("M2 2x4 s2 EXPLICIT", (2, 9, 11, 3), (2, 4, 3, 2), 2, "EXPLICIT", 1, EXPLICIT),
)

for label, x, w, s, pad, dil, ex in DEPTHWISE:
    attrs = _attrs(s, pad, dil, ex)
    dy = _forward_shape(x, w, s, pad, dil, ex, depthwise=True)
    sample("DepthwiseConv2dNative", label,
           lambda a, b, attrs=attrs: R.DepthwiseConv2dNative(input=a, filter=b, **attrs),
           arg(x), arg(w))
    sample("DepthwiseConv2dNativeBackpropInput", label,
           lambda n, b, g, attrs=attrs: R.DepthwiseConv2dNativeBackpropInput(
               input_sizes=n, filter=b, out_backprop=g, **attrs),
           const(x, "int32"), arg(w), arg(dy))
    sample("DepthwiseConv2dNativeBackpropFilter", label,
           lambda a, n, g, attrs=attrs: R.DepthwiseConv2dNativeBackpropFilter(
               input=a, filter_sizes=n, out_backprop=g, **attrs),
           arg(x), const(w, "int32"), arg(dy))

# (label, x shape, filter shape, stride, padding)
CONV3D = (
    ("3x3x3 s2 SAME", (1, 7, 5, 9, 2), (3, 3, 3, 2, 3), 2, "SAME"),
    ("2x3x2 s1 VALID", (2, 5, 7, 5, 2), (2, 3, 2, 2, 3), 1, "VALID"),
)

for label, x, w, s, pad in CONV3D:
    attrs = _attrs(s, pad, 1, (), rank=5)
    dy = tuple(R.Conv3D(input=tf.zeros(x), filter=tf.zeros(w), **attrs).shape)
    sample("Conv3D", label, lambda a, b, attrs=attrs: R.Conv3D(input=a, filter=b, **attrs),
           arg(x), arg(w))
    sample("Conv3DBackpropInputV2", label,
           lambda n, b, g, attrs=attrs: R.Conv3DBackpropInputV2(
               input_sizes=n, filter=b, out_backprop=g, **attrs),
           const(x, "int32"), arg(w), arg(dy))
    sample("Conv3DBackpropFilterV2", label,
           lambda a, n, g, attrs=attrs: R.Conv3DBackpropFilterV2(
               input=a, filter_sizes=n, out_backprop=g, **attrs),
           arg(x), const(w, "int32"), arg(dy))
