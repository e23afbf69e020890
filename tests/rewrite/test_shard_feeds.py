"""Sharded feeds (Options.shard_feeds): each device is fed its own share of every fed
tensor through a placeholder of its own; nothing is fed whole to device 0 and sent on."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tofu_tf.options import Options
from tofu_tf.runtime.session import SingleDevice, WrappedRunner

from tests.rewrite.equivalence import compare


@pytest.mark.parametrize("model,devices", [("mlp", {"num_devices": 8}),
                                           ("wresnet", {"topology": "2x2"}),
                                           ("transformer", {"num_devices": 8})])
def test_sharded_feeds_train_to_the_same_numbers(model, devices):
    optimized = compare(model, "adam" if model != "wresnet" else "sgd", dtype="float64",
                        options=Options(shard_feeds=True), **devices)
    assert optimized.feed_shards and set(optimized.feed_shards) == set(optimized.feeds)
    assert not [t for t in optimized.ledger.transfers if t.kind == "feed"]
    nodes = {node.name: node for node in optimized.graph_def.node}
    for fed, shares in optimized.feed_shards.items():
        assert fed.split(":")[0] not in nodes            # no whole placeholder anywhere
        assert sorted(d for _, d, _ in shares) == list(range(optimized.num_devices))
        for placeholder, device, box in shares:
            node = nodes[placeholder.split(":")[0]]
            assert node.op == "Placeholder" and node.device == optimized.devices[device]
            assert [d.size for d in node.attr["shape"].shape.dim] == [b - a for a, b in box]
    assert optimized.ledger.step_bytes == optimized.plan.predicted_bytes


def test_sharded_feeds_through_wrap_function():
    from tofu_tf.api import optimize
    from tofu_tf.models import build
    step = build("mlp", optimizer="sgd", graph_only=True, batch_size=8, dtype="float64")
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        initial = single.values()
        batch = dict(zip(step.feeds, step.sample_batch(0)))
        want = single.run(batch)[0]
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=4,
                         options=Options(shard_feeds=True))
    got = WrappedRunner(optimized, initial).run(batch)[0]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


def test_a_decorated_step_with_sharded_feeds():
    import tofu_tf
    w = tf.Variable(np.random.default_rng(0).normal(size=(6, 4)))
    v = tf.Variable(w.numpy())

    def make(var):
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.matmul(x, var) - y))
            var.assign_sub(0.1 * tape.gradient(loss, var))
            return loss
        return step
    partitioned = tofu_tf.function(make(w), num_devices=4, options=Options(shard_feeds=True))
    whole = tf.function(make(v))
    rng = np.random.default_rng(1)
    for _ in range(3):
        x, y = rng.normal(size=(8, 6)), rng.normal(size=(8, 4))
        np.testing.assert_allclose(partitioned(x, y).numpy(), whole(x, y).numpy(), rtol=1e-12)
    assert partitioned.optimized.feed_shards
    partitioned.write_back()
    np.testing.assert_allclose(w.numpy(), v.numpy(), rtol=1e-12)
