"""Multi-layer perceptron classifier.

x: float [batch, input_dim]; y: float one-hot [batch, num_classes] (float = the step dtype).
Hidden layers are dense + bias + ReLU; the last dense layer gives the logits; the loss is the
mean `tf.nn.softmax_cross_entropy_with_logits`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tofu_tf.errors import TofuError
from tofu_tf.models import layers
from tofu_tf.models.builder import ModelDef, check_positive_int

DEFAULTS = {"hidden": (32, 32), "input_dim": 16, "num_classes": 10}


def normalize(sizes: dict) -> dict:
    hidden = sizes["hidden"]
    if isinstance(hidden, (int, np.integer)):
        hidden = (hidden,)
    if not isinstance(hidden, (tuple, list)):
        raise TofuError(f"mlp hidden must be a tuple of positive integers, got {hidden!r}.")
    return {"hidden": tuple(check_positive_int("mlp hidden width", h) for h in hidden),
            "input_dim": check_positive_int("mlp input_dim", sizes["input_dim"]),
            "num_classes": check_positive_int("mlp num_classes", sizes["num_classes"])}


def define(store, sizes: dict, batch_size: int):
    widths = (sizes["input_dim"], *sizes["hidden"], sizes["num_classes"])
    denses = [layers.dense(store, f"dense{i}", d_in, d_out)
              for i, (d_in, d_out) in enumerate(zip(widths[:-1], widths[1:]))]

    def loss_fn(x, y):
        for hidden_layer in denses[:-1]:
            x = tf.nn.relu(hidden_layer(x))
        return layers.softmax_cross_entropy(denses[-1](x), y)
    return loss_fn


def inputs(sizes: dict, batch_size: int, dtype: str):
    return ((batch_size, sizes["input_dim"]), dtype), \
        ((batch_size, sizes["num_classes"]), dtype)


def sample(sizes: dict, batch_size: int, dtype: str, rng: np.random.Generator):
    x = rng.standard_normal((batch_size, sizes["input_dim"]), dtype=dtype)
    labels = rng.integers(0, sizes["num_classes"], batch_size)
    return x, np.eye(sizes["num_classes"], dtype=dtype)[labels]


MODEL = ModelDef("mlp", DEFAULTS, normalize, define, inputs, sample)
