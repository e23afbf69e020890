"""Multi-layer LSTM language model, unrolled in Python over the time steps (no tf.while).

    e_t = embedding[x[:, t]]                       (tf.gather on the embedding variable)
    per layer l, step t:  [i, f, g, o] = split([in_t, h_{t-1}] @ W_l + b_l, 4)
                          c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
                          h_t = sigmoid(o) * tanh(c_t)
    logits = stack_t(h_t of the top layer) @ W_out + b_out; mean sparse softmax cross-entropy

x: int32 [batch, steps] token ids in [0, vocab); y: int32 [batch, steps] labels in
[0, num_classes); the floats (weights, states) are the step dtype. Paper sizes: steps 20, embedding 512, vocab = num_classes = 512,
hidden 4096-10240, 4-10 layers.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import tensorflow as tf

from tofu_tf.models import layers
from tofu_tf.models.builder import ModelDef, check_positive_int

DEFAULTS = {"layers": 2, "hidden": 32, "steps": 5, "embedding": 16, "vocab": 32,
            "num_classes": 32}


def normalize(sizes: dict) -> dict:
    return {k: check_positive_int(f"lstm {k}", sizes[k]) for k in DEFAULTS}


def lstm_cell(store, name: str, d_in: int, hidden: int):
    """Returns cell(x, (h, c)) -> (h, c) with one fused kernel [d_in + hidden, 4 * hidden]."""
    kernel = store.get(f"{name}/kernel", [d_in + hidden, 4 * hidden],
                       1.0 / math.sqrt(d_in + hidden))
    bias = store.get(f"{name}/bias", [4 * hidden])

    def cell(x, state):
        h, c = state
        gates = tf.matmul(tf.concat([x, h], axis=1), kernel) + bias
        i, f, g, o = tf.split(gates, 4, axis=1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        return tf.sigmoid(o) * tf.tanh(c), c
    return cell


def define(store, sizes: dict, batch_size: int):
    hidden, steps = sizes["hidden"], sizes["steps"]
    embedding = store.get("embedding", [sizes["vocab"], sizes["embedding"]], 1.0)
    def make(name: str, d_in: int):
        """The cell as a block's apply: state as separate inputs."""
        cell = lstm_cell(store, name, d_in, hidden)
        return lambda x, h, c: cell(x, (h, c))

    cells = []
    for l in range(sizes["layers"]):
        d_in = sizes["embedding"] if l == 0 else hidden
        cells.append(store.block(f"layer{l}", ("lstm", d_in, hidden),
                                 functools.partial(make, f"layer{l}", d_in), uses=steps))
    classifier = layers.dense(store, "classifier", hidden, sizes["num_classes"])

    def loss_fn(x, y):
        inputs = tf.unstack(tf.gather(embedding, x), num=steps, axis=1)
        for cell in cells:
            state = (tf.zeros([batch_size, hidden], store.dtype),
                     tf.zeros([batch_size, hidden], store.dtype))
            outputs = []
            for x_t in inputs:
                state = cell(x_t, *state)
                outputs.append(state[0])
            inputs = outputs
        top = tf.reshape(tf.stack(inputs, axis=1), [batch_size * steps, hidden])
        labels = tf.reshape(y, [batch_size * steps])
        return layers.sparse_softmax_cross_entropy(classifier(top), labels)
    return loss_fn


def inputs(sizes: dict, batch_size: int, dtype: str):
    shape = (batch_size, sizes["steps"])
    return (shape, "int32"), (shape, "int32")


def sample(sizes: dict, batch_size: int, dtype: str, rng: np.random.Generator):
    shape = (batch_size, sizes["steps"])
    return (rng.integers(0, sizes["vocab"], shape, dtype=np.int32),
            rng.integers(0, sizes["num_classes"], shape, dtype=np.int32))


MODEL = ModelDef("lstm", DEFAULTS, normalize, define, inputs, sample)
