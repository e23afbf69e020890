"""The written-out gradients of the batch and layer norms against the tape's derivation of
their formulas, both ways they are attached: recorded on the tape (`with_gradient`) and
as a `tf.custom_gradient` (what a block's symbolic gradient uses)."""

import numpy as np
import pytest
import tensorflow as tf

from tofu_tf.models import layers


def _plain(x, gamma, beta):
    mean, variance = tf.nn.moments(x, axes=[0, 1, 2])
    return (x - mean) * tf.math.rsqrt(variance + layers.NORM_EPSILON) * gamma + beta


ATTACH = {"recorded": lambda forward: lambda *args: layers.with_gradient(forward, *args),
          "custom_gradient": tf.custom_gradient}


def _batch_norm(attach):
    def norm(x, gamma, beta):
        mean = tf.reduce_mean(x, [0, 1, 2])
        variance = tf.reduce_mean(tf.math.squared_difference(x, mean), [0, 1, 2])
        return attach(layers._normalize)(x, mean, variance, gamma, beta)
    return norm


def _assert_same_values_and_gradients(plain, written, x, scale, shift, weights):
    """y and the gradients of sum((y * weights)^2) (a loss that is not a plain sum) with
    respect to x, scale and shift agree between the two norms."""
    results = []
    for norm in (plain, written):
        with tf.GradientTape() as tape:
            tape.watch([x, scale, shift])
            y = norm(x, scale, shift)
            loss = tf.reduce_sum(tf.square(y * weights))
        results.append((y, *tape.gradient(loss, [x, scale, shift])))
    for want, got in zip(*results):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("attach", ATTACH)
def test_gradient_equals_the_tapes_of_the_plain_formula(attach):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((3, 4, 5, 6)) * 2.0 + 0.5)
    gamma = tf.constant(rng.standard_normal(6))
    beta = tf.constant(rng.standard_normal(6))
    weights = tf.constant(rng.standard_normal((3, 4, 5, 6)))
    _assert_same_values_and_gradients(_plain, _batch_norm(ATTACH[attach]), x, gamma, beta, weights)


def _plain_layer_norm(x, gain, bias):
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + layers.NORM_EPSILON) * gain + bias


@pytest.mark.parametrize("attach", ATTACH)
def test_layer_norm_gradient_equals_the_tapes_of_the_plain_formula(attach):
    rng = np.random.default_rng(1)
    for shape in ((7, 6), (2, 3, 5)):
        x = tf.constant(rng.standard_normal(shape) * 2.0 + 0.5)
        gain = tf.constant(rng.standard_normal(shape[-1:]))
        bias = tf.constant(rng.standard_normal(shape[-1:]))
        weights = tf.constant(rng.standard_normal(shape))
        _assert_same_values_and_gradients(
            _plain_layer_norm, ATTACH[attach](layers._layer_normalize), x, gain, bias, weights)
