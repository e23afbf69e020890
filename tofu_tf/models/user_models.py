"""Models as users write them: a subclassed Keras model with a custom layer (einsum
projections, a gathered embedding, a causal mask by `tf.where`, a softmax), and a
functional model with one Dense layer shared by two paths and two outputs. Each builder
returns (model, loss_of(*batch), batch(rng)); `user_train_step` makes the training step a
user writes around them (Adam); `build_user_step` the tf.function step that
`tools/coverage.py` lists (names in USER_MODELS).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tofu_tf.errors import TofuError
from tofu_tf.models.keras_models import KerasStep


def masked_attention_layer():
    import keras

    class MaskedAttention(keras.layers.Layer):
        def __init__(self, dim: int, **kwargs):
            super().__init__(**kwargs)
            self.dim = dim

        def build(self, shape):
            for name in ("wq", "wk", "wv"):
                setattr(self, name, self.add_weight(shape=(shape[-1], self.dim), name=name,
                                                    initializer="glorot_uniform"))
            self.table = self.add_weight(shape=(16, self.dim), name="table",
                                         initializer="random_normal")

        def call(self, x, ids):
            q = tf.einsum("bsd,de->bse", x, self.wq)
            k = tf.einsum("bsd,de->bse", x, self.wk)
            v = tf.einsum("bsd,de->bse", x, self.wv) + tf.gather(self.table, ids)
            scores = tf.einsum("bqe,bke->bqk", q, k) / np.sqrt(self.dim)
            seq = tf.shape(x)[1]
            causal = tf.range(seq)[:, None] >= tf.range(seq)[None, :]
            scores = tf.where(causal[None], scores, tf.cast(-1e9, scores.dtype))
            return tf.einsum("bqk,bke->bqe", tf.nn.softmax(scores, axis=-1), v)

    return MaskedAttention


def subclassed_model():
    import keras
    attention = masked_attention_layer()

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.attention = attention(24)
            self.head = keras.layers.Dense(10)

        def call(self, x, ids):
            return self.head(tf.reduce_mean(tf.nn.relu(self.attention(x, ids)), axis=1))

    model = Net()
    model(np.zeros((8, 12, 16)), np.zeros((8, 12), np.int32))

    def loss_of(x, ids, y):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=model(x, ids)))

    def batch(rng):
        return (rng.normal(size=(8, 12, 16)), rng.integers(0, 16, (8, 12)).astype(np.int32),
                rng.integers(0, 10, 8).astype(np.int32))
    return model, loss_of, batch


def functional_model():
    import keras
    x = keras.Input((20,))
    shared = keras.layers.Dense(32, activation="relu")
    a, b = shared(x), shared(keras.layers.Dense(20)(x))
    first = keras.layers.Dense(10)(a)
    second = keras.layers.Dense(3)(keras.layers.Concatenate()([a, b]))
    model = keras.Model(x, [first, second])

    def loss_of(x, y1, y2):
        o1, o2 = model(x)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y1, logits=o1)) + tf.reduce_mean(tf.square(o2 - y2))

    def batch(rng):
        return (rng.normal(size=(8, 20)), rng.integers(0, 10, 8).astype(np.int32),
                rng.normal(size=(8, 3)))
    return model, loss_of, batch


def user_train_step(build, learning_rate: float = 1e-2):
    """(model, step(*batch) -> loss, batch(rng)) of a builder: Adam, built before tracing,
    the weights' gradients applied as a user's training loop does."""
    import keras
    keras.utils.set_random_seed(0)
    model, loss_of, batch = build()
    optimizer = keras.optimizers.Adam(learning_rate)
    optimizer.build(model.trainable_variables)

    def step(*args):
        with tf.GradientTape() as tape:
            loss = loss_of(*args)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return model, step, batch


USER_MODELS = {"user_subclassed": subclassed_model, "user_functional": functional_model}


def build_user_step(name: str, seed: int = 0) -> KerasStep:
    """The tf.function training step of a model of USER_MODELS (float32), with one batch."""
    if name not in USER_MODELS:
        raise TofuError(f"unknown user model '{name}'; choose one of "
                        f"{', '.join(USER_MODELS)}.")
    model, step, batch = user_train_step(USER_MODELS[name])
    inputs = tuple(a.astype(np.float32) if a.dtype == np.float64 else a
                   for a in batch(np.random.default_rng(seed)))
    return KerasStep(name, tf.function(step), inputs, model, None)
