"""`@tofu_tf.function` on Python training steps: raw tf.Variables and Keras models (one
with a gradient penalty: gradients of gradients)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tofu_tf
from tofu_tf.errors import TofuError


def _momentum_step(weights, slots, lr=0.1, mu=0.9):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, weights[0]))
            loss = tf.reduce_mean(tf.square(tf.matmul(h, weights[1]) - y))
        grads = tape.gradient(loss, weights)
        for w, s, g in zip(weights, slots, grads):
            s.assign(mu * s + g)
            w.assign_sub(lr * s)
        return loss
    return step


def _variables(seed=0):
    rng = np.random.default_rng(seed)
    weights = [tf.Variable(rng.standard_normal((16, 32)) * 0.3),
               tf.Variable(rng.standard_normal((32, 8)) * 0.3)]
    slots = [tf.Variable(tf.zeros_like(w)) for w in weights]
    return weights, slots


def test_raw_variables_train_write_back_and_reload():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 16)), rng.standard_normal((8, 8))
    ref_w, ref_s = _variables()
    par_w, par_s = _variables()
    reference = _momentum_step(ref_w, ref_s)
    partitioned = tofu_tf.function(_momentum_step(par_w, par_s), num_devices=4)
    with pytest.raises(TofuError, match="not been called"):
        partitioned.write_back()
    for _ in range(3):
        np.testing.assert_allclose(partitioned(x, y).numpy(), reference(x, y).numpy(),
                                   rtol=1e-12)
    before = [w.numpy().copy() for w in par_w]
    partitioned.write_back()
    assert any(not np.array_equal(b, w.numpy()) for b, w in zip(before, par_w))
    for got, want in zip(par_w + par_s, ref_w + ref_s):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-14)
    # reload: change the originals, the next partitioned step starts from them
    for w, r in zip(par_w + par_s, ref_w + ref_s):
        w.assign(r.numpy() * 0.5)
        r.assign(r.numpy() * 0.5)
    partitioned.reload()
    np.testing.assert_allclose(partitioned(x, y).numpy(), reference(x, y).numpy(), rtol=1e-12)
    assert partitioned.plan.num_devices == 4


def test_arguments_must_keep_their_shapes():
    weights, slots = _variables()
    partitioned = tofu_tf.function(_momentum_step(weights, slots), num_devices=2)
    partitioned(np.zeros((8, 16)), np.zeros((8, 8)))
    with pytest.raises(TofuError, match="partitioned for arguments"):
        partitioned(np.zeros((4, 16)), np.zeros((4, 8)))


def test_keras_resnet50_matches():
    """Keras applications ResNet50 (weights=None, 64x64, batch 8), Adam, 3 steps on 2x2
    devices (the emitted step's size, and TensorFlow's time to set it up, grow with the
    device count), float64
    (in float32, Adam turns the rounding noise of the conv biases' zero gradients before
    batch norm into +-lr updates in any two differently ordered runs)."""
    from tofu_tf.models.keras_models import build_keras_step
    reference = build_keras_step("resnet50", batch_size=8, image_size=64, dtype="float64")
    mine = build_keras_step("resnet50", batch_size=8, image_size=64, dtype="float64")
    x, y = reference.inputs
    assert {w.dtype for w in mine.model.weights} == {"float64"}
    partitioned = tofu_tf.function(mine.step, num_devices=4)
    for _ in range(3):
        np.testing.assert_allclose(partitioned(x, y).numpy(), reference.step(x, y).numpy(),
                                   rtol=1e-5, atol=1e-6)
    partitioned.write_back()
    for got, want in zip(mine.model.weights + mine.optimizer.variables,
                         reference.model.weights + reference.optimizer.variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=got.path)


def _critic_step():
    """A WGAN-GP critic step: a stock Keras critic (strided convolution, max pooling, layer
    norm) whose loss holds the gradient norm of its score at interpolated inputs, so the
    step differentiates gradients (MaxPoolGrad into MaxPoolGradGrad, the convolutions'
    gradients into convolutions); Adam."""
    import keras
    keras.utils.set_random_seed(0)
    layers = keras.layers
    critic = keras.Sequential([
        keras.Input((16, 16, 3)), layers.Conv2D(8, 3, strides=2, padding="same"),
        layers.LeakyReLU(0.2), layers.MaxPooling2D(2), layers.Conv2D(8, 3, padding="same"),
        layers.LayerNormalization(), layers.LeakyReLU(0.2), layers.Flatten(), layers.Dense(1)])
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(critic.trainable_variables)

    def step(real, fake, mix):
        with tf.GradientTape() as tape:
            mixed = mix * real + (1.0 - mix) * fake
            with tf.GradientTape() as inner:
                inner.watch(mixed)
                score = critic(mixed)
            slope = tf.sqrt(tf.reduce_sum(tf.square(inner.gradient(score, mixed)), [1, 2, 3]))
            loss = (tf.reduce_mean(critic(fake)) - tf.reduce_mean(critic(real))
                    + 10.0 * tf.reduce_mean(tf.square(slope - 1.0)))
        grads = tape.gradient(loss, critic.trainable_variables)
        optimizer.apply_gradients(zip(grads, critic.trainable_variables))
        return loss
    return critic, step


def test_a_gradient_penalty_trains_like_tf_function():
    from tofu_tf.errors import KeptWholeWarning
    from tofu_tf.models.keras_models import keras_float
    with keras_float("float64"):
        reference, reference_step = _critic_step()
        mine, my_step = _critic_step()
    partitioned = tofu_tf.function(my_step, num_devices=3)
    whole = tf.function(reference_step)
    rng = np.random.default_rng(0)
    for _ in range(2):
        batch = (rng.standard_normal((6, 16, 16, 3)), rng.standard_normal((6, 16, 16, 3)),
                 rng.uniform(size=(6, 1, 1, 1)))
        with warnings.catch_warnings():
            warnings.simplefilter("error", KeptWholeWarning)
            got = partitioned(*batch).numpy()
        np.testing.assert_allclose(got, whole(*batch).numpy(), rtol=1e-9, atol=1e-12)
    partitioned.write_back()
    for got, want in zip(mine.weights, reference.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=got.path)
    kinds = {op.type for op in partitioned.optimized.graph.ops}
    assert {"MaxPoolGradGrad", "Conv2DBackpropInput"} <= kinds


def test_a_graph_convolution_over_a_sparse_adjacency_trains_like_tf_function():
    """A two-layer GCN: tf.sparse.sparse_dense_matmul with a constant adjacency
    (SparseTensorDenseMatMul, its gradient the same op with adjoint_a), raw variables,
    SGD; nothing kept whole, the sparse products split."""
    from tofu_tf.errors import KeptWholeWarning
    rng = np.random.default_rng(0)
    nodes, features = 64, 8
    edges = rng.integers(0, nodes, (300, 2)).astype(np.int64)
    adjacency = tf.sparse.reorder(tf.sparse.SparseTensor(
        edges, np.full(300, 0.25), [nodes, nodes]))
    start = [rng.normal(size=(features, 16)) * 0.3, rng.normal(size=(16, 3)) * 0.3]

    def gcn():
        weights = [tf.Variable(w) for w in start]

        def step(x, y):
            with tf.GradientTape() as tape:
                h = tf.nn.relu(tf.sparse.sparse_dense_matmul(adjacency, x @ weights[0]))
                logits = tf.sparse.sparse_dense_matmul(adjacency, h @ weights[1])
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=y, logits=logits))
            for w, g in zip(weights, tape.gradient(loss, weights)):
                w.assign_sub(0.1 * g)
            return loss
        return weights, step
    reference, reference_step = gcn()
    mine, my_step = gcn()
    partitioned = tofu_tf.function(my_step, num_devices=4)
    whole = tf.function(reference_step)
    x, y = rng.normal(size=(nodes, features)), rng.integers(0, 3, nodes).astype(np.int32)
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("error", KeptWholeWarning)
            got = partitioned(x, y).numpy()
        np.testing.assert_allclose(got, whole(x, y).numpy(), rtol=1e-12)
    partitioned.write_back()
    for got, want in zip(mine, reference):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-14)
    optimized = partitioned.optimized
    products = [op.name for op in optimized.graph.ops if op.type == "SparseTensorDenseMatMul"]
    assert len(products) >= 3                   # the two layers and a gradient
    assert all(any(level.choices[name] != "replicate" for level in optimized.plan.levels)
               for name in products)


def test_tf_print_in_the_step_prints_once_per_step(tmp_path):
    """tf.print (PrintV2, kept whole: no description) has no result: one device runs it,
    with the whole loss, not every device."""
    printed = tmp_path / "printed.txt"
    weights, slots = _variables()
    plain = _momentum_step(weights, slots).python_function

    def step(x, y):
        loss = plain(x, y)
        tf.print("loss", loss, output_stream=f"file://{printed}")
        return loss
    partitioned = tofu_tf.function(step, num_devices=4)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 16)), rng.standard_normal((8, 8))
    losses = [float(partitioned(x, y)) for _ in range(2)]
    lines = printed.read_text().splitlines()
    assert len(lines) == 2, lines
    for line, loss in zip(lines, losses):
        assert line.startswith("loss ") and abs(float(line.split()[1]) - loss) <= 1e-5 * loss


def test_assertions_in_the_step_hold_and_fail_as_in_tf_function():
    """tf.debugging.assert_* in a step: each guard (an If) becomes its Assert, run once
    (on device 0); its condition, a reduce_all (reduce_any) over a split tensor, is
    combined across devices with LogicalAnd (LogicalOr). A holding assertion trains as
    before; a failing one fails the step with its message."""
    weights, slots = _variables()
    plain = _momentum_step(weights, slots).python_function

    def checked(bound):
        def step(x, y):
            tf.debugging.assert_non_negative(tf.abs(x), message="x is never negative")
            tf.debugging.Assert(tf.logical_not(tf.reduce_any(tf.math.is_nan(y))),
                                ["y has a NaN"])
            loss = plain(x, y)
            tf.debugging.assert_less(loss, tf.constant(bound, tf.float64),
                                     message="the loss is past its bound")
            return loss
        return step
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 16)), rng.standard_normal((8, 8))
    start = [w.numpy() for w in weights + slots]
    partitioned = tofu_tf.function(checked(1e6), num_devices=4)
    got = [float(partitioned(x, y)) for _ in range(2)]
    for variable, value in zip(weights + slots, start):
        variable.assign(value)
    whole = tf.function(checked(1e6))
    np.testing.assert_allclose(got, [float(whole(x, y)) for _ in range(2)], rtol=1e-12)
    failing = tofu_tf.function(checked(1e-3), num_devices=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the loss is past its bound"):
        failing(x, y)
