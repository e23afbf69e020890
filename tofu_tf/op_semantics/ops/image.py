"""Image resizing: ResizeBilinear, ResizeNearestNeighbor and ResizeBicubic, and their
gradients (UpSampling2D and Resizing layers, segmentation heads); projective transforms
(ImageProjectiveTransformV2/V3: Keras's RandomRotation, RandomZoom, RandomTranslation,
RandomShear, RandomPerspective); colour spaces (RGBToHSV, HSVToRGB: RandomSaturation,
RandomHue, RandomColorJitter).

Each output pixel interpolates input pixels at positions the kernel computes in floating
point from the sizes and its `align_corners` / `half_pixel_centers` attrs; a part of the
rows would need a kernel with an offset, which TensorFlow's has not. So the planes stay
whole: an output element reads its image's whole plane in its channel, and the batch and
channel dims split (each part resizes its own images and channels with the op's own
kernel and attrs); the spatial dims are withheld from splitting. A projective transform
samples each output pixel at a position its image's transform computes: likewise, the
transform read at the image's row (or row 0, one transform for all). A colour conversion
maps each pixel's three channels to three: every dim but the channels splits.
"""

from __future__ import annotations

from tofu_tf.op_semantics.helpers import whole_inner
from tofu_tf.op_semantics.registry import semantics
from tofu_tf.op_semantics.tdl import Fn, Opaque, ReduceN

PLANE_REASON = ("{op} maps output rows to input rows in floating point with no offset: a "
                "part of the rows is not a resize of a part")


def _whole_planes(ctx, name: str, source, extra=None) -> None:
    """y[b, i, j, c] = name(source[b, :, :, c]); `extra(b, i, j, c)`: an element the kernel
    reads for its shape only (a gradient's original image)."""
    height, width = source.shape[1], source.shape[2]

    def body(b, i, j, c):
        plane = ReduceN("window", lambda h, w: source[b, h, w, c], [height, width],
                        names=["ph", "pw"])
        args = (plane, Fn("position", i, j)) + ((extra(b, i, j, c),) if extra else ())
        return Opaque(name, *args)
    ctx.compute(body)
    for var in ("i", "j"):
        ctx.unsplittable(var, PLANE_REASON.format(op=ctx.type))


@semantics("ResizeBilinear", "ResizeNearestNeighbor", "ResizeBicubic")
def resize(ctx):
    """y[b, i, j, c] interpolates x[b, :, :, c] at a position of (i, j)."""
    ctx.const(1)                                 # the output size
    _whole_planes(ctx, ctx.type.lower(), ctx.inputs[0])


@semantics("ResizeBilinearGrad", "ResizeBicubicGrad")
def resize_grad(ctx):
    """dx[b, h, w, c] sums the gradient of every output pixel of image b, channel c that
    interpolated (h, w); the kernel reads the original image for its shape only."""
    grads, original = ctx.inputs
    _whole_planes(ctx, ctx.type.lower(), grads, lambda b, i, j, c: original[b, i, j, c])


@semantics("ResizeNearestNeighborGrad")
def resize_nearest_grad(ctx):
    """dx[b, h, w, c] sums the gradient of the output pixels of image b, channel c nearest
    to (h, w); the size input gives dx's spatial shape."""
    ctx.const(1)
    _whole_planes(ctx, ctx.type.lower(), ctx.inputs[0])


TRANSFORM_REASON = ("{op} samples each output pixel at a position computed in floating point "
                    "from the whole image's transform: a part of the rows is not a transform "
                    "of a part")
PIXEL_REASON = "{op} maps a pixel's three channels together: a part of them is no pixel"


@semantics("ImageProjectiveTransformV2", "ImageProjectiveTransformV3")
def projective_transform(ctx):
    """y[b, i, j, c] = the image b's channel c sampled where transform b (or the one
    transform) maps output pixel (i, j); output_shape and fill_value are read whole."""
    images, transforms = ctx.inputs[:2]
    ctx.const(2)                                 # output_shape
    fill = ctx.inputs[3] if len(ctx.inputs) > 3 else None
    height, width = images.shape[1], images.shape[2]
    shared = transforms.shape[0] == 1

    def body(b, i, j, c):
        plane = ReduceN("window", lambda h, w: images[b, h, w, c], [height, width],
                        names=["ph", "pw"])
        row = 0 if shared else b
        transform = ReduceN("window", lambda t: transforms[row, t], [transforms.shape[1]],
                            names=["t"])
        args = (plane, transform, Fn("position", i, j)) + (() if fill is None else (fill[()],))
        return Opaque(ctx.type.lower(), *args)
    ctx.compute(body)
    for var in ("i", "j"):
        ctx.unsplittable(var, TRANSFORM_REASON.format(op=ctx.type))


@semantics("RGBToHSV", "HSVToRGB")
def colour_space(ctx):
    """y[.., k] = the conversion of pixel x[.., :] (3 channels), channel k."""
    whole_inner(ctx, ctx.inputs[:1], 1, PIXEL_REASON.format(op=ctx.type))
