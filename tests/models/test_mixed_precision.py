"""Keras mixed precision through `tofu_tf.function`: float32 variables, bfloat16 or float16
compute. The tolerance comes from the dtype: the same step in float64 from the same
weights is the truth, and the partitioned step may stray from it no more than a few times
as far as the unpartitioned mixed-precision step does (plus the dtype's rounding of the
values compared): a partitioned step sums its partial results in another order, in the
low-precision type."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tofu_tf
from tofu_tf.errors import GraphImportError

EPS = {"mixed_bfloat16": 2.0 ** -8, "mixed_float16": 2.0 ** -11}
LOSS_SCALE = 128.0          # a constant loss scale for float16, by hand


def _model(policy: str):
    import keras
    keras.mixed_precision.set_global_policy(policy)
    try:
        x = keras.Input((20,))
        h = keras.layers.Dense(64, activation="relu")(x)
        h = keras.layers.Dense(64, activation="relu")(h)
        return keras.Model(x, keras.layers.Dense(10, dtype="float32")(h))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _step(model, scale: float = 1.0, lr: float = 0.1):
    import keras
    optimizer = keras.optimizers.SGD(lr)
    optimizer.build(model.trainable_variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            logits = tf.cast(model(tf.cast(x, model.inputs[0].dtype)), tf.float32)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=y, logits=logits))
            scaled = loss * scale
        grads = [g / scale for g in tape.gradient(scaled, model.trainable_variables)]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return step


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_within_the_dtype_tolerance(policy):
    import keras
    keras.utils.set_random_seed(0)
    whole_model = _model(policy)
    mine_model = _model(policy)
    mine_model.set_weights(whole_model.get_weights())
    truth_model = _model("float64")
    truth_model.set_weights([w.astype(np.float64) for w in whole_model.get_weights()])
    assert {v.dtype for v in mine_model.weights} == {"float32"}
    scale = LOSS_SCALE if policy == "mixed_float16" else 1.0
    whole = tf.function(_step(whole_model, scale))
    truth = tf.function(_step(truth_model))
    mine = tofu_tf.function(_step(mine_model, scale), num_devices=4)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.normal(size=(16, 20)).astype(np.float32)
        y = rng.integers(0, 10, 16).astype(np.int32)
        want = float(truth(x.astype(np.float64), y).numpy())
        off = abs(float(whole(x, y).numpy()) - want)
        got = abs(float(mine(x, y).numpy()) - want)
        assert got <= 4 * off + EPS[policy] * abs(want), (got, off)
    mine.write_back()
    for m, w, t in zip(mine_model.weights, whole_model.weights, truth_model.weights):
        truth_value = t.numpy()
        off = np.max(np.abs(w.numpy() - truth_value))
        got = np.max(np.abs(m.numpy() - truth_value))
        assert got <= 4 * off + EPS[policy] * np.max(np.abs(truth_value)), (m.path, got, off)


def test_dynamic_loss_scaling_says_what_to_do():
    """Keras's LossScaleOptimizer skips steps with non-finite gradients through a tf.cond,
    which cannot be partitioned op by op: a typed error says so and names the ways out."""
    import keras
    model = _model("mixed_float16")
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    optimizer.build(model.trainable_variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.cast(model(x), tf.float32) - y))
            scaled = optimizer.scale_loss(loss)
        optimizer.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables),
                                      model.trainable_variables))
        return loss
    partitioned = tofu_tf.function(step, num_devices=2)
    with pytest.raises(GraphImportError, match="LossScaleOptimizer") as caught:
        partitioned(np.zeros((8, 20), np.float32), np.zeros((8, 10), np.float32))
    assert caught.value.op_type in ("If", "StatelessIf") and "mixed_bfloat16" in str(
        caught.value)
