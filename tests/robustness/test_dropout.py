"""Random ops give the same numbers partitioned: the Transformer with dropout."""

from __future__ import annotations

import numpy as np

from tofu_tf.api import optimize
from tofu_tf.models import build
from tofu_tf.runtime.session import Runner, SingleDevice

RTOL, ATOL = 1e-9, 1e-12            # float64


def _losses(step, batches, num_devices=None):
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        if num_devices is None:
            return [single.run(b)[0] for b in batches], single.values()
        initial = single.values()
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                         num_devices=num_devices)
    with Runner(optimized, initial) as runner:
        return [runner.run(b)[0] for b in batches], runner.values()


def test_transformer_dropout_draws_the_same_masks_partitioned():
    step = build("transformer", optimizer="adam", graph_only=True, batch_size=8,
                 dtype="float64", dropout=0.2)
    plain = build("transformer", optimizer="adam", graph_only=True, batch_size=8,
                  dtype="float64")
    batches = [dict(zip(step.feeds, step.sample_batch(seed))) for seed in range(3)]
    want, want_values = _losses(step, batches)
    got, got_values = _losses(step, batches, num_devices=8)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    for name, value in want_values.items():
        np.testing.assert_allclose(got_values[name], value, rtol=RTOL, atol=ATOL,
                                   err_msg=name)
    # the masks are really random: dropout changes every loss
    without, _ = _losses(plain, batches)
    assert all(abs(a - b) > 1e-6 for a, b in zip(want, without))
