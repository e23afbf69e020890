"""Image resizing: ResizeBilinear, ResizeNearestNeighbor and ResizeBicubic, and their
gradients (UpSampling2D and Resizing layers, segmentation heads).

Each output pixel interpolates input pixels at positions the kernel computes in floating
point from the sizes and its `align_corners` / `half_pixel_centers` attrs; a part of the
rows would need a kernel with an offset, which TensorFlow's has not. So the planes stay
whole: an output element reads its image's whole plane in its channel, and the batch and
channel dims split (each part resizes its own images and channels with the op's own
kernel and attrs); the spatial dims are withheld from splitting.
"""

from __future__ import annotations

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
