"""Samples for ops/image.py: up- and downsizing with each interpolation's attrs, and the
gradients, on odd sizes."""

import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, sample

R = tf.raw_ops

sample("ResizeBilinear", "up, half-pixel centers",
       lambda x: R.ResizeBilinear(images=x, size=[9, 10], half_pixel_centers=True),
       arg((3, 5, 4, 2)))
sample("ResizeBilinear", "down, align corners",
       lambda x: R.ResizeBilinear(images=x, size=[3, 4], align_corners=True),
       arg((2, 7, 9, 3)))
sample("ResizeNearestNeighbor", "up, half-pixel centers",
       lambda x: R.ResizeNearestNeighbor(images=x, size=[10, 7], half_pixel_centers=True),
       arg((3, 5, 4, 2)))
sample("ResizeBicubic", "up", lambda x: R.ResizeBicubic(images=x, size=[8, 9],
                                                       half_pixel_centers=True),
       arg((2, 5, 4, 3)))
sample("ResizeBilinearGrad", "half-pixel centers",
       lambda g, x: R.ResizeBilinearGrad(grads=g, original_image=x, half_pixel_centers=True),
       arg((3, 9, 10, 2)), arg((3, 5, 4, 2)))
sample("ResizeBicubicGrad", "half-pixel centers",
       lambda g, x: R.ResizeBicubicGrad(grads=g, original_image=x, half_pixel_centers=True),
       arg((2, 8, 9, 3)), arg((2, 5, 4, 3)))
sample("ResizeNearestNeighborGrad", "half-pixel centers",
       lambda g: R.ResizeNearestNeighborGrad(grads=g, size=[5, 4], half_pixel_centers=True),
       arg((3, 10, 7, 2)))
