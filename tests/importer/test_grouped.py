"""Grouped convolutions rewritten by the importer (importer/_grouped): a user's raw grouped
Conv2D (which TensorFlow's CPU kernels run forward) and grouped ops compiled by XLA
partition to the numbers TensorFlow computes; no grouped op reaches the planner."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tofu_tf

RNG = np.random.default_rng(5)


def _ungrouped(graph) -> None:
    """Every convolution of the planner graph reads a filter of its input's channels."""
    for op in graph.ops:
        if op.type in ("Conv2D", "Conv3D"):
            x, w = (graph.tensors[t] for t in op.inputs[:2])
            assert x.shape[-1] == w.shape[-2], op.name


@pytest.mark.parametrize("filter_shape, num_devices", [((3, 3, 2, 8), 4), ((3, 3, 1, 8), 3)])
def test_a_raw_grouped_conv2d_partitions_to_the_same_number(filter_shape, num_devices):
    x = tf.constant(RNG.normal(size=(6, 8, 8, 8)))
    w = tf.Variable(RNG.normal(size=filter_shape))

    def f(x):
        y = tf.nn.conv2d(x, w, 2, "SAME")
        return tf.reduce_sum(y * tf.nn.conv2d(x, w, 2, "SAME"))

    partitioned = tofu_tf.function(f, num_devices=num_devices)
    np.testing.assert_allclose(partitioned(x).numpy(), tf.function(f)(x).numpy(), rtol=1e-12)
    _ungrouped(partitioned.optimized.graph)


@pytest.mark.parametrize("groups", [2, 4])
def test_grouped_gradients_compiled_by_xla_partition_to_the_same_numbers(groups):
    """A jit-compiled grouped convolution and its gradients (ops TensorFlow's CPU kernels
    do not run grouped): 2 groups as one op per group, 4 as a depthwise op."""
    x = tf.constant(RNG.normal(size=(4, 9, 9, 4)))
    w = tf.constant(RNG.normal(size=(3, 3, 4 // groups, 8)))

    @tf.function(jit_compile=True)
    def conv(x, w):
        return tf.nn.conv2d(x, w, 1, "VALID")

    def step(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            loss = tf.reduce_sum(tf.sin(conv(tf.tanh(x), w)))
        return tape.gradient(loss, [x, w])

    partitioned = tofu_tf.function(step, num_devices=4)
    for got, want in zip(partitioned(x, w), tf.function(step)(x, w)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)
    graph = partitioned.optimized.graph
    _ungrouped(graph)
    types = {op.type for op in graph.ops}
    assert ("DepthwiseConv2dNativeBackpropFilter" in types) == (groups == 4)
    assert not types & {"PartitionedCall", "StatefulPartitionedCall"}
