"""The liveness estimate against TensorFlow's allocation records, per device."""

from __future__ import annotations

import pytest
import tensorflow as tf

from tofu_tf.api import optimize
from tofu_tf.models import build
from tofu_tf.rewrite.memory import estimate, measure, persistent_bytes
from tofu_tf.runtime import Runner, SingleDevice


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_estimate_within_15_percent_of_measured(model):
    """Models whose kernels allocate no scratch beyond their outputs (TensorFlow's own
    convolution gradients take up to 32 MB of workspace, not modelled yet)."""
    step = build(model, optimizer="adam", graph_only=True, batch_size=8)
    feeds = dict(zip(step.feeds, step.sample_batch(0)))
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        values = single.values()
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=8)
    estimated = estimate(optimized.graph_def, optimized.fetches)
    with Runner(optimized, values) as runner:
        runner.run(feeds)
        measured = measure(runner.session, list(optimized.fetches), feeds,
                           persistent_bytes(optimized.graph_def))
    assert len(estimated) == 8
    for device, memory in estimated.items():
        got = measured[tf.DeviceSpec.from_string(device).to_string()]
        assert abs(memory.peak_bytes - got) <= 0.15 * got, (device, memory, got)
        assert memory.persistent_bytes > 0 and memory.peak_op


def test_partitioned_peak_is_below_single_device():
    step = build("transformer", optimizer="adam", graph_only=True, batch_size=8)
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=8)
    single = estimate(step.graph_def, step.fetches, default_device="single")
    parts = estimate(optimized.graph_def, optimized.fetches)
    assert max(m.peak_bytes for m in parts.values()) < single["single"].peak_bytes
