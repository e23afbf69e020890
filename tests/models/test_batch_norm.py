"""The batch norm's written-out gradient against the tape's derivation of its formula."""

import numpy as np
import tensorflow as tf

from tofu_tf.models import layers


def _plain(x, gamma, beta):
    mean, variance = tf.nn.moments(x, axes=[0, 1, 2])
    return (x - mean) * tf.math.rsqrt(variance + layers.NORM_EPSILON) * gamma + beta


def _batch_norm(x, gamma, beta):
    mean = tf.reduce_mean(x, [0, 1, 2])
    variance = tf.reduce_mean(tf.math.squared_difference(x, mean), [0, 1, 2])
    return layers._normalize(x, mean, variance, gamma, beta)


def test_gradient_equals_the_tapes_of_the_plain_formula():
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((3, 4, 5, 6)) * 2.0 + 0.5)
    gamma = tf.constant(rng.standard_normal(6))
    beta = tf.constant(rng.standard_normal(6))
    weights = tf.constant(rng.standard_normal((3, 4, 5, 6)))   # a loss that is not a plain sum
    results = []
    for norm in (_plain, _batch_norm):
        with tf.GradientTape() as tape:
            tape.watch([x, gamma, beta])
            y = norm(x, gamma, beta)
            loss = tf.reduce_sum(tf.square(y * weights))
        results.append((y, *tape.gradient(loss, [x, gamma, beta])))
    for want, got in zip(*results):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)
