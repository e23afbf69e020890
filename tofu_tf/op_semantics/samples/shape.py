"""Samples for ops/shape.py: merges and splits of reshaped dims (aligned and not), every
strided-slice mask, pads at both edges, tiles across tile boundaries."""

import numpy as np
import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, const, sample

RESHAPES = {"[6,4]->[4,6]": ((6, 4), (4, 6)), "[2,3,4]->[6,4]": ((2, 3, 4), (6, 4)),
            "[6,4]->[2,3,4]": ((6, 4), (2, 3, 4)), "[4,6]->[24]": ((4, 6), (24,)),
            "[24]->[4,6]": ((24,), (4, 6)), "[5,1,6]->[3,10]": ((5, 1, 6), (3, 10)),
            "[4,6,5]->[8,15]": ((4, 6, 5), (8, 15)), "[3,4,5]->[3,-1]": ((3, 4, 5), (3, -1))}
for label, (x_shape, y_shape) in RESHAPES.items():
    sample("Reshape", label, lambda x, y_shape=y_shape: tf.reshape(x, y_shape), arg(x_shape))

sample("Transpose", "perm 2,0,1", lambda x: tf.transpose(x, (2, 0, 1)), arg((4, 5, 6)))
sample("ConjugateTranspose", "complex",
       lambda x: tf.raw_ops.ConjugateTranspose(x=x, perm=[1, 0]), arg((4, 5), "complex64"))
sample("ReverseV2", "axes 0,2", lambda x: tf.reverse(x, [0, -1]), arg((5, 3, 4)))
sample("Roll", "one axis", lambda x: tf.roll(x, 3, 1), arg((4, 7, 3)))
sample("Roll", "two axes, negative", lambda x: tf.roll(x, [-2, 5], [1, 2]), arg((2, 6, 7, 3)))
sample("Roll", "repeated axis, past the size", lambda x: tf.roll(x, [4, 9], [0, 0]),
       arg((5, 4)))
sample("Roll", "zero shift", lambda x: tf.roll(x, 0, 1), arg((3, 5)))
sample("Roll", "a shift of the whole axis", lambda x: tf.roll(x, [7, 4, -3], [1, 2, 3]),
       arg((2, 7, 5, 4)))
sample("ExpandDims", "axis 1", lambda x: tf.expand_dims(x, 1), arg((4, 5)))
sample("ExpandDims", "axis -1", lambda x: tf.expand_dims(x, -1), arg((4, 5)))
sample("Squeeze", "dim 1", lambda x: tf.squeeze(x, [1]), arg((4, 1, 5, 1)))
sample("Squeeze", "all", lambda x: tf.squeeze(x), arg((4, 1, 5, 1)))
sample("BroadcastTo", "rank up", lambda x: tf.broadcast_to(x, (3, 4, 5)), arg((4, 1)))
sample("Tile", "one dim", lambda x: tf.tile(x, (3, 1)), arg((3, 4)))
sample("Tile", "both dims", lambda x: tf.tile(x, (2, 3)), arg((5, 3)))
sample("Tile", "size-1 dim", lambda x: tf.tile(x, (4, 2)), arg((1, 4)))

# (label, block, paddings or crops, input shape)
SPACE_TO_BATCH = (("2-D block, padded", [2, 3], [[1, 1], [2, 1]], (2, 6, 6, 3)),
                  ("1-D block", [2], [[0, 2]], (3, 8, 4)),
                  ("one batch, block 1 on a dim", [1, 2], [[0, 0], [1, 1]], (1, 5, 6, 2)))
BATCH_TO_SPACE = (("2-D block, cropped", [2, 3], [[1, 1], [2, 1]], (12, 4, 3, 3)),
                  ("1-D block", [2], [[0, 2]], (6, 5, 4)),
                  ("a row a part: one block offset's batch", [2, 2], [[0, 1], [1, 0]],
                   (8, 2, 2, 3)))
for label, block, pads, shape in SPACE_TO_BATCH:
    sample("SpaceToBatchND", label,
           lambda x, block=block, pads=pads: tf.space_to_batch_nd(x, block, pads), arg(shape))
for label, block, crops, shape in BATCH_TO_SPACE:
    sample("BatchToSpaceND", label,
           lambda x, block=block, crops=crops: tf.batch_to_space(x, block, crops), arg(shape))

sample("DepthToSpace", "block 2", lambda x: tf.nn.depth_to_space(x, 2), arg((3, 3, 4, 8)))
sample("SpaceToDepth", "block 2", lambda x: tf.nn.space_to_depth(x, 2), arg((3, 4, 6, 3)))
sample("MatrixBandPart", "lower 1, upper 2",
       lambda x: tf.linalg.band_part(x, 1, 2), arg((3, 2, 5, 6)))
sample("MatrixBandPart", "causal (lower whole)",
       lambda x: tf.linalg.band_part(x, -1, 0), arg((4, 5, 5)))

sample("ConcatV2", "axis 1 uneven", lambda a, b, c: tf.concat([a, b, c], 1),
       arg((4, 2)), arg((4, 1)), arg((4, 3)))
sample("ConcatV2", "axis -3", lambda a, b: tf.concat([a, b], -3), arg((3, 2, 4)), arg((2, 2, 4)))
sample("ConcatV2", "empty piece", lambda a, b, c: tf.concat([a, b, c], 0),
       arg((3, 4)), arg((0, 4)), arg((4, 4)))
sample("Concat", "axis first", lambda a, b: tf.raw_ops.Concat(concat_dim=1, values=[a, b]),
       arg((4, 3)), arg((4, 5)))
sample("Split", "3 pieces", lambda x: tf.split(x, 3, axis=1)[0], arg((4, 9)))
sample("Split", "2 pieces axis 0", lambda x: tf.split(x, 2, axis=0)[0], arg((6, 5)))
sample("SplitV", "unequal", lambda x: tf.split(x, [1, 2, 3], axis=1)[0], arg((4, 6)))
sample("SplitV", "equal with -1", lambda x: tf.split(x, [3, -1], axis=0)[0], arg((6, 5)))
sample("Pack", "axis 0", lambda a, b, c: tf.stack([a, b, c], 0), arg((4, 5)), arg((4, 5)),
       arg((4, 5)))
sample("Pack", "axis -1", lambda a, b: tf.stack([a, b], -1), arg((4, 5)), arg((4, 5)))
sample("Unpack", "axis 1", lambda x: tf.unstack(x, axis=1)[0], arg((4, 3, 5)))

sample("Slice", "begin and -1 size", lambda x: tf.slice(x, [1, 2], [4, -1]), arg((6, 7)))
STRIDED = {
    "steps": lambda x: x[1:6:2, ::-1],
    "masks": lambda x: x[:4, 2:],
    "shrink": lambda x: x[2, 1:],
    "negative shrink": lambda x: x[:, -2],
    "new axis": lambda x: x[:, tf.newaxis, 1:],
    "negative stride": lambda x: x[-2::-3, 5:1:-1],
    "clamped": lambda x: x[-100:100, 1:-1],
}
for label, fn in STRIDED.items():
    sample("StridedSlice", label, fn, arg((7, 6)))
sample("StridedSlice", "ellipsis", lambda x: x[..., 1], arg((4, 5, 3)))
sample("StridedSlice", "ellipsis and new axes",
       lambda x: x[tf.newaxis, 1:, ..., tf.newaxis, ::2], arg((4, 3, 5)))
sample("StridedSlice", "empty", lambda x: x[3:1, :], arg((5, 4)))


def _slice_grad(shape, begin, end, strides, **masks):
    def build(dy):
        return tf.raw_ops.StridedSliceGrad(shape=shape, begin=begin, end=end, strides=strides,
                                           dy=dy, **masks)
    return build


def _strided_grad_sample(label, shape, begin, end, strides, **masks):
    x = np.zeros(shape, np.float32)
    dy_shape = tf.raw_ops.StridedSlice(input=x, begin=begin, end=end, strides=strides,
                                       **masks).shape
    sample("StridedSliceGrad", label, _slice_grad(shape, begin, end, strides, **masks),
           arg(tuple(dy_shape)))


_strided_grad_sample("steps", (9, 6), [1, 0], [8, 6], [3, 1])
_strided_grad_sample("negative stride", (9, 6), [7, 5], [0, 0], [-2, -1], end_mask=2)
_strided_grad_sample("shrink and new axis", (6, 7), [2, 0, 1], [3, 0, 7], [1, 1, 2],
                     shrink_axis_mask=1, new_axis_mask=2)
_strided_grad_sample("ellipsis", (4, 5, 6), [0, 1], [0, 5], [1, 2], ellipsis_mask=1)

sample("Pad", "both edges", lambda x: tf.pad(x, [[2, 3], [0, 1]]), arg((5, 4)))
sample("PadV2", "fed value",
       lambda x, v: tf.raw_ops.PadV2(input=x, paddings=[[1, 2], [3, 0]], constant_values=v),
       arg((5, 4)), arg(()))
sample("PadV2", "constant value", lambda x: tf.pad(x, [[0, 0], [2, 2]], constant_values=1.5),
       arg((3, 5)))
sample("MirrorPad", "reflect",
       lambda x: tf.raw_ops.MirrorPad(input=x, paddings=[[3, 2], [1, 0]], mode="REFLECT"),
       arg((5, 4)))
sample("MirrorPad", "symmetric",
       lambda x: tf.raw_ops.MirrorPad(input=x, paddings=[[4, 3], [0, 2]], mode="SYMMETRIC"),
       arg((4, 5)))
sample("MirrorPad", "wide reflect",
       lambda x: tf.raw_ops.MirrorPad(input=x, paddings=[[5, 5]], mode="REFLECT"), arg((6,)))
sample("MirrorPadGrad", "reflect",
       lambda g: tf.raw_ops.MirrorPadGrad(input=g, paddings=[[3, 2], [0, 0], [1, 0]],
                                          mode="REFLECT"), arg((10, 3, 5)))
sample("MirrorPadGrad", "symmetric",
       lambda g: tf.raw_ops.MirrorPadGrad(input=g, paddings=[[0, 0], [4, 3], [0, 2]],
                                          mode="SYMMETRIC"), arg((3, 11, 7)))

sample("Fill", "fed value", lambda v: tf.fill([4, 6], v), arg(()))
sample("Range", "int", lambda: tf.range(2, 30, 3))
sample("Range", "float descending", lambda: tf.range(7.5, 0.5, -0.25))
sample("OneHot", "last axis", lambda i: tf.one_hot(i, 7, 2.0, -1.0),
       arg((4, 3), "int32", low=-1, high=9))
sample("OneHot", "axis 0", lambda i: tf.one_hot(i, 6, axis=0), arg((5,), "int32", high=7))
for exclusive in (False, True):
    for reverse in (False, True):
        sample("Cumsum", f"exclusive={exclusive} reverse={reverse}",
               lambda x, e=exclusive, r=reverse: tf.cumsum(x, 1, exclusive=e, reverse=r),
               arg((3, 7)))
        sample("Cumprod", f"exclusive={exclusive} reverse={reverse}",
               lambda x, e=exclusive, r=reverse: tf.math.cumprod(x, 1, exclusive=e,
                                                                 reverse=r),
               arg((4, 6, 3), low=0.5, high=1.5))

sample("Shape", "rank 3", lambda x: tf.raw_ops.Shape(input=x), arg((4, 5, 6)))
sample("ShapeN", "two", lambda a, b: tf.raw_ops.ShapeN(input=[a, b])[0], arg((4, 5, 6)),
       arg((2, 3)))
sample("Size", "rank 2", lambda x: tf.raw_ops.Size(input=x), arg((4, 5)))
sample("Rank", "rank 2", lambda x: tf.raw_ops.Rank(input=x), arg((4, 5)))
sample("InvertPermutation", "opaque", lambda p: tf.math.invert_permutation(p),
       const([2, 0, 1], "int32"))
