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
# A rotation with a shear, one transform per image or one for all; nearest and bilinear.
TRANSFORMS = [[0.9, -0.3, 1.2, 0.25, 1.1, -0.7, 0.01, -0.02],
              [1.1, 0.2, -0.5, -0.1, 0.8, 0.9, 0.0, 0.015], [1.0, 0.0, 0.5, 0.0, 1.0, -1.5, 0, 0]]
sample("ImageProjectiveTransformV3", "per image, bilinear, reflect",
       lambda x, t: R.ImageProjectiveTransformV3(
           images=x, transforms=t, output_shape=[9, 7], fill_value=0.5,
           interpolation="BILINEAR", fill_mode="REFLECT"),
       arg((3, 8, 6, 2)), arg((3, 8), value=TRANSFORMS))
sample("ImageProjectiveTransformV3", "one transform, nearest, constant",
       lambda x, t: R.ImageProjectiveTransformV3(
           images=x, transforms=t, output_shape=[8, 6], fill_value=0.0,
           interpolation="NEAREST", fill_mode="CONSTANT"),
       arg((2, 8, 6, 3)), arg((1, 8), value=TRANSFORMS[:1]))
sample("ImageProjectiveTransformV2", "per image, bilinear, wrap",
       lambda x, t: R.ImageProjectiveTransformV2(
           images=x, transforms=t, output_shape=[8, 6], interpolation="BILINEAR",
           fill_mode="WRAP"),
       arg((3, 8, 6, 2)), arg((3, 8), value=TRANSFORMS))
sample("RGBToHSV", "pixels", lambda x: R.RGBToHSV(images=x), arg((3, 4, 5, 3), low=0.0, high=1.0))
sample("HSVToRGB", "pixels", lambda x: R.HSVToRGB(images=x), arg((3, 4, 5, 3), low=0.0, high=1.0))
