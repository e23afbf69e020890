"""Wide ResNet with bottleneck units (ResNet v1, NHWC), as evaluated in the Tofu paper.

    stem:   conv 7x7/2 (base*widen) -> BN -> ReLU -> max-pool 3x3/2
    stage s (s = 0..3, inner width w = base * 2^s * widen, outer 4w), `units[s]` units:
            conv 1x1 w -> BN -> ReLU -> conv 3x3 w (stride 2 in the first unit of stages
            1..3) -> BN -> ReLU -> conv 1x1 4w -> BN, plus the shortcut (identity, or conv
            1x1 + BN where the shape changes), then ReLU
    head:   global average pool (reduce_mean) -> dense -> mean softmax cross-entropy

`widen` multiplies every filter count. `base_width` is 64 for the real network (the paper's
sizes); the tiny test default is 8. `depth` 50/101/152 selects units [3,4,6,3], [3,4,23,3],
[3,8,36,3]; any other depth with (depth - 2) divisible by 12 gives four equal stages (14 ->
[1,1,1,1]); `units=(a, b, c, d)` sets them directly. Batch norm runs in training mode with
plain ops and updates its moving statistics. x: float [batch, size, size, 3];
y: float one-hot [batch, num_classes] (float = the step dtype).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tofu_tf.errors import TofuError
from tofu_tf.models import layers
from tofu_tf.models.builder import ModelDef, check_positive_int

DEFAULTS = {"depth": 14, "units": None, "widen": 1, "base_width": 8, "image_size": 32,
            "num_classes": 10}
STANDARD_UNITS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def normalize(sizes: dict) -> dict:
    units = sizes["units"]
    if units is None:
        units = _units_of_depth(sizes["depth"])
    elif not isinstance(units, (tuple, list)) or len(units) != 4:
        raise TofuError(f"wresnet units must be 4 positive integers, got {units!r}.")
    units = tuple(check_positive_int("wresnet units entry", u) for u in units)
    return {"depth": 3 * sum(units) + 2, "units": units,
            **{k: check_positive_int(f"wresnet {k}", sizes[k])
               for k in ("widen", "base_width", "image_size", "num_classes")}}


def _units_of_depth(depth) -> tuple[int, ...]:
    if depth in STANDARD_UNITS:
        return STANDARD_UNITS[depth]
    if isinstance(depth, int) and depth > 2 and (depth - 2) % 12 == 0:
        return ((depth - 2) // 12,) * 4
    raise TofuError(f"wresnet depth {depth!r} is not supported; valid: 50, 101, 152, or "
                    f"12*n + 2 (14, 26, 38, ...), or pass units=(a, b, c, d).")


def bottleneck(store, name: str, c_in: int, width: int, stride: int):
    """One bottleneck unit; returns apply(x)."""
    c_out = 4 * width
    convs = [layers.conv2d(store, f"{name}/conv1", 1, c_in, width),
             layers.conv2d(store, f"{name}/conv2", 3, width, width, stride),
             layers.conv2d(store, f"{name}/conv3", 1, width, c_out)]
    norms = [layers.batch_norm(store, f"{name}/bn{i}", c)
             for i, c in enumerate((width, width, c_out), start=1)]
    shortcut = None
    if stride != 1 or c_in != c_out:
        project = layers.conv2d(store, f"{name}/shortcut", 1, c_in, c_out, stride)
        project_norm = layers.batch_norm(store, f"{name}/shortcut_bn", c_out)
        shortcut = lambda x: project_norm(project(x))  # noqa: E731

    def apply(x):
        out = x
        for i, (conv, norm) in enumerate(zip(convs, norms)):
            out = norm(conv(out))
            out = tf.nn.relu(out) if i < 2 else out
        return tf.nn.relu(out + (x if shortcut is None else shortcut(x)))
    return apply


def define(store, sizes: dict, batch_size: int):
    base = sizes["base_width"] * sizes["widen"]
    stem_conv = layers.conv2d(store, "stem/conv", 7, 3, base, stride=2)
    stem_norm = layers.batch_norm(store, "stem/bn", base)
    units, c_in = [], base
    for stage, count in enumerate(sizes["units"]):
        width = base * 2 ** stage
        for unit in range(count):
            stride = 2 if stage > 0 and unit == 0 else 1
            name = f"stage{stage + 1}/unit{unit + 1}"
            units.append(store.block(name, ("bottleneck", c_in, width, stride),
                                     lambda name=name, c_in=c_in, width=width, stride=stride:
                                     bottleneck(store, name, c_in, width, stride)))
            c_in = 4 * width
    classifier = layers.dense(store, "classifier", c_in, sizes["num_classes"])

    def loss_fn(x, y):
        out = tf.nn.relu(stem_norm(stem_conv(x)))
        out = tf.nn.max_pool2d(out, ksize=3, strides=2, padding="SAME")
        for unit in units:
            out = unit(out)
        pooled = tf.reduce_mean(out, axis=[1, 2])
        return layers.softmax_cross_entropy(classifier(pooled), y)
    return loss_fn


def inputs(sizes: dict, batch_size: int, dtype: str):
    size = sizes["image_size"]
    return ((batch_size, size, size, 3), dtype), \
        ((batch_size, sizes["num_classes"]), dtype)


def sample(sizes: dict, batch_size: int, dtype: str, rng: np.random.Generator):
    size = sizes["image_size"]
    x = rng.standard_normal((batch_size, size, size, 3), dtype=dtype)
    labels = rng.integers(0, sizes["num_classes"], batch_size)
    return x, np.eye(sizes["num_classes"], dtype=dtype)[labels]


MODEL = ModelDef("wresnet", DEFAULTS, normalize, define, inputs, sample)
