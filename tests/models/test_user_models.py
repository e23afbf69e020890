"""Models as users write them, through `tofu_tf.function`: a subclassed Keras model with a
custom layer (einsum projections, a gathered embedding, a causal mask by `tf.where`, a
softmax), and a functional model with a shared layer and two outputs, each trained 3 Adam
steps against `tf.function` from identical weights, in float64."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tofu_tf
from tofu_tf.errors import KeptWholeWarning
from tofu_tf.models.keras_models import keras_float
from tofu_tf.models.user_models import functional_model as _functional
from tofu_tf.models.user_models import subclassed_model as _subclassed
from tofu_tf.models.user_models import user_train_step as _train_step


def _twins(build):
    """Two copies of a model from the same seed, in float64 (the reference and the one
    partitioned): (reference, its step, mine, my step, batch)."""
    with keras_float("float64"):
        reference, reference_step, batch = _train_step(build)
        mine, my_step, _ = _train_step(build)
    return reference, reference_step, mine, my_step, batch


def _functional_rows(rng, rows: int):
    """A tf.data Dataset of `rows` (x, y1, y2) examples for the functional model."""
    return tf.data.Dataset.from_tensor_slices((
        rng.normal(size=(rows, 20)), rng.integers(0, 10, rows).astype(np.int32),
        rng.normal(size=(rows, 3))))


def _assert_same_weights(mine, reference):
    """Every weight of `mine` equals `reference`'s (float64 tolerance), named if not."""
    for got, want in zip(mine.weights, reference.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=got.path)


REWRITTEN = tofu_tf.Options(early_updates=True, recompute=tofu_tf.Recompute.CHEAP)


@pytest.mark.parametrize("build,devices,options", [
    (_subclassed, 4, tofu_tf.Options()), (_functional, 6, tofu_tf.Options()),
    (_subclassed, 8, REWRITTEN), (_functional, 8, tofu_tf.Options(pipeline_stages=2))],
    ids=["subclassed-custom-layer", "functional-shared-two-outputs",
         "subclassed-rewritten-keras-adam", "functional-two-pipeline-stages"])
def test_user_model_trains_like_tf_function(build, devices, options):
    reference, reference_step, mine, my_step, batch = _twins(build)
    assert all(w.dtype == "float64" for w in mine.weights)
    partitioned = tofu_tf.function(my_step, num_devices=devices, options=options)
    whole = tf.function(reference_step)
    rng = np.random.default_rng(1)
    for _ in range(3):
        args = batch(rng)
        with warnings.catch_warnings():
            warnings.simplefilter("error", KeptWholeWarning)   # every op is described
            got = partitioned(*args).numpy()
        np.testing.assert_allclose(got, whole(*args).numpy(), rtol=1e-9, atol=1e-12)
    optimized = partitioned.optimized
    assert optimized.num_devices == devices and optimized.ledger.step_bytes > 0
    assert optimized.plan.early_updates == options.early_updates
    assert bool(optimized.plan.recompute) == (options.recompute is tofu_tf.Recompute.CHEAP)
    stages = options.pipeline_stages if options.pipeline_stages > 1 else 0
    assert len(set(optimized.plan.stages.values())) == stages
    partitioned.write_back()
    _assert_same_weights(mine, reference)


def test_fed_from_a_dataset():
    """The decorated step called in a loop over a tf.data pipeline (shuffled, batched,
    prefetched), as users feed it: the same losses and weights as tf.function's."""
    reference, reference_step, mine, my_step, _ = _twins(_functional)
    data = _functional_rows(np.random.default_rng(2), 32).shuffle(32, seed=0).batch(
        8, drop_remainder=True)
    partitioned = tofu_tf.function(my_step, num_devices=4)
    whole = tf.function(reference_step)
    losses = [(partitioned(*batch).numpy(), whole(*batch).numpy())
              for batch in data.prefetch(2)]
    assert len(losses) == 4
    np.testing.assert_allclose(*zip(*losses), rtol=1e-9, atol=1e-12)
    partitioned.write_back()
    _assert_same_weights(mine, reference)


def test_train_takes_a_dataset_iterator():
    """`partitioned.train(iterator)`: a step per batch until the iterator ends (or `steps`),
    with each device fed its own share of the batch (Options.shard_feeds)."""
    reference, reference_step, mine, my_step, _ = _twins(_functional)
    data = _functional_rows(np.random.default_rng(4), 40).batch(8, drop_remainder=True)
    partitioned = tofu_tf.function(my_step, num_devices=4,
                                   options=tofu_tf.Options(shard_feeds=True))
    got = partitioned.train(iter(data), steps=4)
    whole = tf.function(reference_step)
    want = [whole(*batch) for batch in data.take(4)]
    assert len(got) == 4
    np.testing.assert_allclose([g.numpy() for g in got], [w.numpy() for w in want],
                               rtol=1e-9, atol=1e-12)
    partitioned.write_back()
    _assert_same_weights(mine, reference)


def test_keras_fit_through_a_train_step_override():
    """`model.fit` with `tofu_tf.KerasTrainStep` mixed in: 2 epochs of 4 batches on 4
    devices end with the weights Keras's own train_step reaches."""
    import keras

    def build(*bases):
        keras.utils.set_random_seed(0)

        class Net(*bases):
            tofu_num_devices = 4

            def __init__(self):
                super().__init__()
                self.hidden = keras.layers.Dense(32, activation="relu")
                self.logits = keras.layers.Dense(10)

            def call(self, x):
                return self.logits(self.hidden(x))

        net = Net()
        net(np.zeros((8, 20)))
        net.compile(optimizer=keras.optimizers.Adam(1e-2), run_eagerly=True,
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return net

    with keras_float("float64"):
        mine, reference = build(tofu_tf.KerasTrainStep, keras.Model), build(keras.Model)
    rng = np.random.default_rng(3)
    data = tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(32, 20)), rng.integers(0, 10, 32).astype(np.int32))).batch(8)
    history = mine.fit(data, epochs=2, verbose=0).history["loss"]
    reference.fit(data, epochs=2, verbose=0)
    assert len(history) == 2 and all(np.isfinite(history))
    assert mine.__dict__["_tofu_step"].optimized.num_devices == 4
    before = [w.numpy().copy() for w in mine.weights]
    mine.write_back()
    assert any(not np.array_equal(b, w.numpy()) for b, w in zip(before, mine.weights))
    _assert_same_weights(mine, reference)


def test_keras_fit_without_run_eagerly_names_the_fix():
    import keras

    class Net(tofu_tf.KerasTrainStep, keras.Model):
        def __init__(self):
            super().__init__()
            self.logits = keras.layers.Dense(3)

        def call(self, x):
            return self.logits(x)

    net = Net()
    net.compile(optimizer="sgd", loss="mse")
    with pytest.raises(tofu_tf.TofuError, match="run_eagerly=True"):
        net.fit(np.zeros((8, 4)), np.zeros((8, 3)), batch_size=8, verbose=0)
