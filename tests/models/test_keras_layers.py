"""Stock Keras layers with their real strides, paddings and dilations, each in a small
functional model trained 2 Adam steps through `tofu_tf.function` against `tf.function`
from identical weights, in float64 (float32 where TensorFlow has no float64 kernel); every
op of these models is described (a kept-whole op fails the test), and the partitioned step
splits the ops that stand in for them (dilations, resizing, 3-D pooling, cyclic shifts,
pixel shuffles, band masks, grouped convolutions, mirror padding, top-k, augmentation's
projective transforms and colour spaces)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tofu_tf
from tofu_tf.errors import KeptWholeWarning
from tofu_tf.models.keras_models import keras_float
from tofu_tf.models.user_models import user_train_step


def _classifier(shape, layers, integer_inputs: int = 0, training: bool = False):
    """A builder for user_train_step: `layers()` on an input of `shape` (token ids below
    `integer_inputs` when set), flattened into a 5-class Dense head; `training`: the model
    is called in training mode (augmentation layers draw their transforms)."""
    def build():
        import keras
        x = keras.Input(shape, dtype="int32" if integer_inputs else None)
        y = x
        for layer in layers():
            y = layer(y)
        if len(y.shape) > 2:
            y = keras.layers.Flatten()(y)
        model = keras.Model(x, keras.layers.Dense(5)(y))

        def loss_of(inputs, labels):
            return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=model(inputs, training=training)))

        def batch(rng):
            inputs = (rng.integers(0, integer_inputs, (8,) + shape).astype(np.int32)
                      if integer_inputs else rng.normal(size=(8,) + shape))
            return inputs, rng.integers(0, 5, 8).astype(np.int32)
        return model, loss_of, batch
    return build


def _causal_block():
    import keras

    class CausalBlock(keras.layers.Layer):
        """x + causal multi-head self-attention(x), layer-normalised."""

        def __init__(self):
            super().__init__()
            self.attention = keras.layers.MultiHeadAttention(2, 4)
            self.norm = keras.layers.LayerNormalization()

        def call(self, x):
            return self.norm(x + self.attention(x, x, use_causal_mask=True))
    return CausalBlock()


def _self_attention(**kwargs):
    import keras

    class SelfAttention(keras.layers.Layer):
        """Multi-head self-attention (keras.layers.MultiHeadAttention(2, 3, **kwargs))."""

        def __init__(self):
            super().__init__()
            self.attention = keras.layers.MultiHeadAttention(2, 3, **kwargs)

        def call(self, x):
            return self.attention(x, x)
    return SelfAttention()


def _layers():
    import keras
    L = keras.layers
    return {
        # TensorFlow runs a dilated convolution as SpaceToBatchND, Conv, BatchToSpaceND.
        "conv1d-dilated-causal": _classifier((20, 6), lambda: [
            L.Conv1D(8, 3, dilation_rate=2, padding="causal", activation="relu"),
            L.Conv1D(8, 3, strides=2, padding="same"), L.MaxPooling1D(2)]),
        "conv2d-dilated-same": _classifier((12, 12, 3), lambda: [
            L.Conv2D(6, 3, dilation_rate=2, padding="same"), L.Conv2D(6, (1, 5))]),
        "conv2d-transpose-separable": _classifier((6, 6, 4), lambda: [
            L.Conv2DTranspose(4, 3, strides=2, padding="same"),
            L.SeparableConv2D(6, 3, strides=2, padding="same", activation="relu"),
            L.DepthwiseConv2D(3, depth_multiplier=2)]),
        "pools-crops-groupnorm": _classifier((8, 8, 3), lambda: [
            L.UpSampling2D(2), L.Cropping2D(((1, 2), (0, 3))), L.ZeroPadding2D(((2, 0), (1, 1))),
            L.Conv2D(8, 3), L.GroupNormalization(groups=4),
            L.AveragePooling2D(3, strides=2, padding="same")]),
        # Resizing keeps each image's plane whole: batch and channels split.
        "resize-bilinear-nearest": _classifier((6, 6, 3), lambda: [
            L.Conv2D(4, 1), L.UpSampling2D(2, interpolation="bilinear"), L.Conv2D(4, 3),
            L.Resizing(7, 9, interpolation="nearest"), L.Conv2D(4, 3, strides=2)]),
        "embedding-gru-unrolled": _classifier((12,), lambda: [
            L.Embedding(50, 16), L.GRU(12, return_sequences=True, unroll=True),
            L.LSTM(8, unroll=True)], integer_inputs=50),


        # Shifted windows (Swin): a cyclic shift of the feature map both ways.
        "roll-shifted-windows": _classifier((8, 8, 3), lambda: [
            L.Conv2D(6, 3, padding="same"),
            L.Lambda(lambda t: tf.roll(t, shift=(-3, 2), axis=(1, 2))),
            L.Conv2D(4, 2, strides=2)]),
        # Pixel shuffle (DepthToSpace, SpaceToDepth) and a band mask: each image alone.
        "pixel-shuffle-band": _classifier((8, 8, 3), lambda: [
            L.Conv2D(8, 3, padding="same"), L.Lambda(lambda t: tf.nn.depth_to_space(t, 2)),
            L.Conv2D(4, 3, strides=2, padding="same"),
            L.Lambda(lambda t: tf.nn.space_to_depth(t, 2)),
            L.Lambda(lambda t: tf.linalg.band_part(t, 1, 0))]),
        # Grouped convolutions (Keras compiles them with XLA): as depthwise ops where each
        # group is one channel, else one convolution per group.
        "conv-groups": _classifier((10, 10, 4), lambda: [
            L.Conv2D(8, 3, padding="same"), L.Conv2D(8, 3, strides=2, padding="same", groups=8),
            L.Conv2D(6, 3, dilation_rate=2, groups=2), L.Conv2D(4, 1, groups=2)]),
        "conv1d-conv3d-groups": _classifier((5, 6, 6, 4), lambda: [
            L.Conv3D(4, 3, padding="same"), L.Conv3D(8, 3, strides=(1, 2, 2), groups=2),
            L.Reshape((3 * 2, 16)), L.Conv1D(8, 3, groups=4, padding="causal")]),
        # Causal self-attention with a residual and layer norm; a bidirectional unrolled
        # LSTM under a time-distributed head; transposed convolutions with output padding.
        "attention-causal-norm": _classifier((6, 8), lambda: [
            _causal_block(), L.GlobalMaxPooling1D()]),
        "bidirectional-timedistributed": _classifier((6, 4), lambda: [
            L.Bidirectional(L.LSTM(5, return_sequences=True, unroll=True)),
            L.TimeDistributed(L.Dense(3))]),
        "conv-transpose-output-padding": _classifier((5, 5, 3), lambda: [
            L.Conv2DTranspose(4, 3, strides=2, output_padding=1),
            L.Conv2DTranspose(4, (2, 3), strides=(1, 2), padding="same")]),
        # Attention over two axes of an image (EinsumDense over both); an einsum dense
        # layer, layer norm over two axes and parametric activations; a masked sequence
        # (Embedding(mask_zero) into an unrolled LSTM: the mask selects between states);
        # 3-D upsampling and strided convolution, 1-D transposed convolution.
        "attention-2d-axes": _classifier((4, 4, 3), lambda: [
            L.Conv2D(4, 1), _self_attention(attention_axes=(1, 2))]),
        "einsum-dense-norm-axes": _classifier((6, 5), lambda: [
            L.EinsumDense("abc,cd->abd", output_shape=(6, 7), bias_axes="d"),
            L.LayerNormalization(axis=[1, 2]), L.PReLU(), L.ELU(), L.Activation("selu")]),
        "masked-lstm": _classifier((7,), lambda: [
            L.Embedding(30, 6, mask_zero=True), L.LSTM(5, unroll=True)], integer_inputs=30),
        "upsample3d-conv1d-transpose": _classifier((4, 4, 4, 2), lambda: [
            L.UpSampling3D(2), L.Conv3D(2, 3, strides=2), L.GlobalAveragePooling3D(),
            L.Reshape((2, 1)), L.Conv1DTranspose(3, 3, strides=2, padding="same")]),
        # Strides that do not divide odd sizes, on 3 devices (uneven parts everywhere).
        "odd-sizes-strides": _classifier((11, 13, 3), lambda: [
            L.Conv2D(5, 4, strides=3, padding="same"),
            L.Conv2DTranspose(4, 4, strides=3, padding="same"),
            L.DepthwiseConv2D(3, dilation_rate=2, padding="same", depth_multiplier=3),
            L.AveragePooling2D((3, 2), strides=(2, 3), padding="same"),
            L.Reshape((-1, 12)), L.Conv1D(6, 5, strides=3),
            L.Conv1D(4, 2, padding="causal", dilation_rate=3),
            L.MaxPooling1D(2, padding="same")]),
        # Reflected and symmetric padding, a running sum, a reversal and a tiling, then the
        # two largest channels of each pixel (their gradients: MirrorPadGrad, ScatterNd).
        "mirror-pads-top-k": _classifier((6, 8, 3), lambda: [
            L.Conv2D(4, 3, padding="same"),
            L.Lambda(lambda t: tf.pad(t, [[0, 0], [1, 1], [2, 2], [0, 0]], mode="REFLECT")),
            L.Lambda(lambda t: tf.reverse(tf.math.cumsum(t, axis=2), axis=[1])),
            L.Lambda(lambda t: tf.tile(t, [1, 1, 1, 2])),
            L.Lambda(lambda t: tf.pad(t, [[0, 0], [1, 0], [0, 1], [0, 0]], mode="SYMMETRIC")),
            L.Conv2D(3, 2, strides=2), L.Lambda(lambda t: tf.math.top_k(t, 2).values)]),
        # Augmentation in the model: random rotations, zooms and shears (projective
        # transforms), hue and saturation (HSV), after a convolution. Their transforms
        # are float32 whatever the model's dtype: float32 tolerances.
        "augmentation": _classifier((12, 12, 3), lambda: [
            L.Conv2D(3, 1), L.RandomRotation(0.2), L.RandomZoom(0.2), L.RandomShear(0.2),
            L.RandomSaturation(0.3), L.RandomHue(0.2), L.Conv2D(4, 3, strides=2),
            L.GlobalAveragePooling2D()], training=True),
        # TensorFlow's 3-D max pooling has no float64 kernel: this one runs in float32.
        "conv3d-pool3d": _classifier((6, 7, 6, 2), lambda: [
            L.Conv3D(4, 3, strides=(1, 2, 1), padding="same", activation="relu"),
            L.MaxPooling3D((2, 2, 2), padding="same"), L.AveragePooling3D(2, strides=1)]),
    }


LAYERS = ["conv1d-dilated-causal", "conv2d-dilated-same", "conv2d-transpose-separable",
          "pools-crops-groupnorm", "resize-bilinear-nearest", "embedding-gru-unrolled",
          "roll-shifted-windows", "pixel-shuffle-band", "conv3d-pool3d", "conv-groups",
          "conv1d-conv3d-groups", "attention-causal-norm", "bidirectional-timedistributed",
          "conv-transpose-output-padding", "attention-2d-axes", "einsum-dense-norm-axes",
          "masked-lstm", "upsample3d-conv1d-transpose", "odd-sizes-strides",
          "mirror-pads-top-k", "augmentation"]
FLOAT32 = {"conv3d-pool3d", "augmentation"}
DEVICES = {"odd-sizes-strides": 3}
# The op types that stand in for a layer (TensorFlow's lowering), per model.
BLOCKED = {"SpaceToBatchND", "BatchToSpaceND"}
DEPTHWISE = {"DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
             "DepthwiseConv2dNativeBackpropFilter"}
STANDS_IN_FOR = {
    "conv2d-transpose-separable": DEPTHWISE, "conv-groups": DEPTHWISE | BLOCKED,
    "conv1d-dilated-causal": BLOCKED, "conv2d-dilated-same": BLOCKED,
    "odd-sizes-strides": DEPTHWISE | BLOCKED,
    "resize-bilinear-nearest": {"ResizeBilinear", "ResizeBilinearGrad",
                                "ResizeNearestNeighbor", "ResizeNearestNeighborGrad"},
    "roll-shifted-windows": {"Roll"},
    "pixel-shuffle-band": {"DepthToSpace", "SpaceToDepth", "MatrixBandPart"},
    "conv3d-pool3d": {"MaxPool3D", "MaxPool3DGrad", "AvgPool3D", "AvgPool3DGrad"},
    "mirror-pads-top-k": {"MirrorPad", "MirrorPadGrad", "TopKV2", "ScatterNd"},
    "augmentation": {"ImageProjectiveTransformV3", "RGBToHSV", "HSVToRGB"}}
STANDS_IN = set().union(*STANDS_IN_FOR.values())


@pytest.mark.parametrize("name", LAYERS)
def test_stock_keras_layers_train_like_tf_function(name):
    build = _layers()[name]
    dtype, rtol, atol = ("float32", 2e-5, 1e-6) if name in FLOAT32 else ("float64", 1e-9, 1e-12)
    with keras_float(dtype):
        reference, reference_step, batch = user_train_step(build)
        mine, my_step, _ = user_train_step(build)
    partitioned = tofu_tf.function(my_step, num_devices=DEVICES.get(name, 4))
    whole = tf.function(reference_step)
    rng = np.random.default_rng(1)
    for _ in range(2):
        args = batch(rng)
        with warnings.catch_warnings():
            warnings.simplefilter("error", KeptWholeWarning)
            got = partitioned(*args).numpy()
        np.testing.assert_allclose(got, whole(*args).numpy(), rtol=rtol, atol=atol)
    partitioned.write_back()
    for got, want in zip(mine.weights, reference.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=rtol, atol=atol,
                                   err_msg=got.path)
    optimized = partitioned.optimized
    assert optimized.ledger.step_bytes > 0
    special = [op for op in optimized.graph.ops if op.type in STANDS_IN]
    assert {op.type for op in special} == STANDS_IN_FOR.get(name, set())
    for op in special:               # split at some level, not run whole on every device
        assert any(level.choices[op.name] != "replicate" for level in optimized.plan.levels), \
            op.name
