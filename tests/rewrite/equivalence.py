"""Partitioned against unpartitioned: the same steps from the same values."""

from __future__ import annotations

import numpy as np

from tofu_tf.api import optimize
from tofu_tf.models import build
from tofu_tf.runtime.session import Runner, SingleDevice

RTOL, ATOL = 1e-5, 1e-6


def reference(step, batches):
    """(initial values, losses, final values) of the unpartitioned graph on one device."""
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        initial = single.values()
        losses = [single.run(dict(zip(step.feeds, batch)))[0] for batch in batches]
        return initial, losses, single.values()


def partitioned(step, batches, initial, session=None, **kwargs):
    """`session`: Runner keywords (a cluster's target and config)."""
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), **kwargs)
    with Runner(optimized, initial, **(session or {})) as runner:
        losses = [runner.run(dict(zip(step.feeds, batch)))[0] for batch in batches]
        final = runner.values()
    return optimized, losses, final


def compare(model: str, optimizer: str, steps: int = 3, batch_size: int = 8,
            dtype: str = "float32", session=None, micro_batches: int = 1, **kwargs):
    """Build, run both, assert equal within (RTOL, ATOL); returns the optimized graph."""
    extra = {} if dtype == "float32" else {"dtype": dtype}
    if micro_batches > 1:
        extra["micro_batches"] = micro_batches
    step = build(model, optimizer=optimizer, graph_only=True, batch_size=batch_size,
                 **extra)
    batches = [step.sample_batch(seed) for seed in range(steps)]
    initial, want_losses, want = reference(step, batches)
    optimized, losses, got = partitioned(step, batches, initial, session, **kwargs)
    np.testing.assert_allclose(losses, want_losses, rtol=RTOL, atol=ATOL)
    bad = {name: float(np.max(np.abs(got[name] - want[name]))) for name in want
           if not np.allclose(got[name], want[name], rtol=RTOL, atol=ATOL)}
    assert not bad, f"variables differ (max abs error): {bad}"
    return optimized
