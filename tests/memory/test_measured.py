"""The memory estimates against TensorFlow's allocation records, per device, and the
plan's estimate (made before any graph exists) against the emitted graph's."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tofu_tf.api import optimize
from tofu_tf.models import build
from tofu_tf.options import Options, Recompute
from tofu_tf.importer.graphdef_io import import_graph_def
from tofu_tf.rewrite.memory import estimate, measure, persistent_bytes
from tofu_tf.rewrite.schedule import sequence_devices
from tofu_tf.runtime.session import Runner, SingleDevice
from tofu_tf.search.memory import single_device_peak

MODELS = ["mlp", "wresnet", "lstm", "transformer"]
CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"


def _close(estimated, measured, where):
    assert abs(estimated.peak_bytes - measured) <= 0.15 * measured, (where, estimated, measured)
    assert estimated.persistent_bytes > 0 and estimated.peak_op


@pytest.fixture(scope="module", params=MODELS)
def step_and_values(request):
    """A flat step (no layer functions): TensorFlow runs a function call's body in an
    executor of its own, whose allocations the caller's step trace does not hold."""
    step = build(request.param, optimizer="adam", graph_only=True, batch_size=8,
                 layer_functions=False)
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        values = single.values()
    return step, values


@pytest.mark.parametrize("options", [Options(), Options(early_updates=True,
                                                        recompute=Recompute.CHEAP)],
                         ids=["plain", "early-updates-cheap-recompute"])
def test_estimate_within_15_percent_of_measured_on_every_device(step_and_values, options):
    """Also with the step rewritten to hold less: the memory model follows its order."""
    step, values = step_and_values
    feeds = dict(zip(step.feeds, step.sample_batch(0)))
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=8,
                         options=options)
    estimated = estimate(optimized.graph_def, optimized.fetches)
    with Runner(optimized, values) as runner:
        runner.run(feeds)
        measured = measure(runner.session, list(optimized.fetches), feeds,
                           persistent_bytes(optimized.graph_def))
    assert len(estimated) == 8
    for device, memory in estimated.items():
        _close(memory, measured[tf.DeviceSpec.from_string(device).to_string()], device)
    # The plan's own estimate (search/memory.py), from the plan alone.
    largest = max(m.peak_bytes for m in estimated.values())
    single = estimate(step.graph_def, step.fetches, default_device=CPU0)[CPU0]
    assert largest < single.peak_bytes
    assert abs(optimized.plan.peak_bytes - largest) <= 0.15 * largest, (
        optimized.plan.peak_bytes, largest)


def test_single_device_estimate_within_15_percent(step_and_values):
    step, _ = step_and_values
    feeds = dict(zip(step.feeds, step.sample_batch(0)))
    graph_def = sequence_devices(step.graph_def, step.fetches)
    estimated = estimate(graph_def, step.fetches, default_device=CPU0)[CPU0]
    with SingleDevice(graph_def, step.init_op, step.fetches) as single:
        single.run(feeds)
        measured = measure(single.session, list(step.fetches), feeds,
                           persistent_bytes(graph_def, default_device=CPU0))
    _close(estimated, measured[tf.DeviceSpec.from_string(CPU0).to_string()], "single")
    graph = import_graph_def(step.graph_def, step.fetches, feeds=list(step.feeds)).graph
    planned = single_device_peak(graph).peak_bytes
    assert abs(planned - estimated.peak_bytes) <= 0.02 * estimated.peak_bytes, (
        planned, estimated)


def test_measure_counts_an_adopted_variable_buffer_once():
    """An AssignVariableOp that is its value's last reader adopts the value's buffer and
    frees the variable's old one (allocated before the step, so no record says so): the
    measured peak must not count both. Here the variable (4 KiB) is assigned 2 * v, then
    a 4 KiB function of the feed is made: 4 KiB of step buffers at a time, not 8."""
    graph = tf.Graph()
    with graph.as_default(), tf.device(CPU0):
        v = tf.Variable(tf.ones([1024]), name="v")
        x = tf.compat.v1.placeholder(tf.float32, [1024], name="x")
        assign = v.assign(v * 2.0, read_value=False)
        with tf.control_dependencies([assign]):
            y = tf.identity(x * 3.0 + 1.0, name="y")
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(v.initializer)
        feeds = {x: np.ones(1024, np.float32)}
        session.run(y, feeds)
        measured = measure(session, [y], feeds, {CPU0: 0})
    assert measured[tf.DeviceSpec.from_string(CPU0).to_string()] == 4096, measured
