"""Checkpoints of a partitioned Keras step: written back and saved with TensorFlow's own
tf.train.Checkpoint, restored into an unpartitioned model and into a partitioned one."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tofu_tf
from tofu_tf.models.keras_models import keras_float, training_step

RTOL, ATOL = 1e-9, 1e-12                 # float64: only summation order differs


def _keras_step(seed: int):
    import keras
    keras.utils.set_random_seed(seed)
    with keras_float("float64"):
        model = keras.Sequential([
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(8, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Flatten(),
            keras.layers.Dense(5),
        ])
        optimizer = keras.optimizers.Adam(1e-2)
        step = training_step(model, optimizer, keras.losses.MeanSquaredError())
    assert {w.dtype for w in model.weights} == {"float64"}
    return model, optimizer, step


def _state(model, optimizer) -> list[np.ndarray]:
    return [v.numpy() for v in model.weights + optimizer.variables]


def test_save_partitioned_restore_anywhere(tmp_path):
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((8, 8, 8, 3)), rng.standard_normal((8, 5)))
               for _ in range(5)]
    reference = _keras_step(seed=0)
    mine = _keras_step(seed=0)
    partitioned = tofu_tf.function(mine[2], num_devices=4)
    for x, y in batches[:3]:
        np.testing.assert_allclose(partitioned(x, y).numpy(), reference[2](x, y).numpy(),
                                   rtol=RTOL, atol=ATOL)
    partitioned.write_back()
    path = tf.train.Checkpoint(model=mine[0], optimizer=mine[1]).save(str(tmp_path / "ck"))

    # a fresh unpartitioned model (other initial values) restores exactly what was saved
    fresh = _keras_step(seed=1)
    assert not all(np.array_equal(a, b) for a, b in zip(_state(*fresh[:2]),
                                                         _state(*mine[:2])))
    tf.train.Checkpoint(model=fresh[0], optimizer=fresh[1]).restore(path).assert_consumed()
    for got, want in zip(_state(*fresh[:2]), _state(*mine[:2])):
        np.testing.assert_array_equal(got, want)
    # ... and continues like the reference
    continuation = [reference[2](x, y).numpy() for x, y in batches[3:]]
    np.testing.assert_allclose([fresh[2](x, y).numpy() for x, y in batches[3:]],
                               continuation, rtol=RTOL, atol=ATOL)

    # a partitioned step on another device count, restored and reloaded, continues too
    other = _keras_step(seed=2)
    continued = tofu_tf.function(other[2], num_devices=2)
    continued(*batches[0])                                  # partitions it (and trains once)
    tf.train.Checkpoint(model=other[0], optimizer=other[1]).restore(path).assert_consumed()
    continued.reload()
    np.testing.assert_allclose([continued(x, y).numpy() for x, y in batches[3:]],
                               continuation, rtol=RTOL, atol=ATOL)
    continued.write_back()
    # atol: the conv bias before batch norm has a zero gradient up to rounding (~1e-12),
    # which Adam turns into updates of that size in any two differently ordered runs
    for got, want in zip(_state(*other[:2]), _state(*reference[:2])):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-9)
