"""The step-time simulator: flops from descriptions, plans against one device, OOM."""

from __future__ import annotations

import dataclasses

import pytest
import tensorflow as tf

from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.importer.graphdef_io import import_concrete_function
from tofu_tf.search.memory import single_device_peak
from tofu_tf.search.recursive import search
from tofu_tf.search.simulate import (PROFILES, alternatives, op_flops, op_placement,
                                     plan_step_time, single_step_time)
from tofu_tf.search.topology import Topology

from tests.search.test_search import graph_of


def _entries(fn, *specs):
    graph = import_concrete_function(tf.function(fn).get_concrete_function(*specs)).graph
    return graph, catalog(graph)


def test_flops_come_from_the_description():
    graph, entries = _entries(lambda a, b: tf.matmul(a, b), tf.TensorSpec([6, 5]),
                              tf.TensorSpec([5, 7]))
    (matmul,) = [e for e in entries.values() if e.op.type == "MatMul"]
    assert op_flops(matmul.semantics) == 2 * 6 * 7 * 5
    graph, entries = _entries(
        lambda x, w: tf.nn.conv2d(x, w, strides=1, padding="VALID"),
        tf.TensorSpec([2, 9, 9, 3]), tf.TensorSpec([3, 3, 3, 4]))
    (conv,) = [e for e in entries.values() if e.op.type == "Conv2D"]
    assert op_flops(conv.semantics) == 2 * (2 * 7 * 7 * 4) * (3 * 3 * 3)


def test_a_plan_splits_the_work_and_adds_its_communication():
    graph = graph_of("wresnet")
    profile = PROFILES["h100_8"]
    single = single_step_time(graph, profile)
    result = search(graph, Topology.default(8))
    step = plan_step_time(graph, result, profile)
    # Every device runs about an eighth of the flops (halos and replicated small ops add).
    assert single.flops / 8 <= step.flops <= 0.3 * single.flops
    assert step.communication_seconds > 0
    slower = dataclasses.replace(profile, link_bandwidth=profile.link_bandwidth / 100)
    assert plan_step_time(graph, result, slower).seconds > step.seconds


def test_alternatives_that_do_not_fit_cannot_run():
    graph = graph_of("mlp", "adam")
    topology = Topology.default(8)
    from tofu_tf.search.baselines import data_parallel
    dp = data_parallel(graph, topology)
    single_peak = single_device_peak(graph)
    tiny = dataclasses.replace(PROFILES["h100_8"], memory_bytes=1000)
    placement = op_placement(graph, 8, single_peak.peak_bytes, single_peak.persistent_bytes)
    got = {a.name: a for a in alternatives(
        batch=8, num_devices=8, profile=tiny, single=single_step_time(graph, tiny),
        dp=plan_step_time(graph, dp, tiny), dp_peak=dp.memory.peak_bytes,
        dp_persistent=dp.memory.persistent_bytes, placement=placement)}
    assert got["Ideal"].samples_per_second > 0                 # memory does not bind it
    for name in ("SmallBatch", "Swap", "OpPlacement"):
        assert got[name].samples_per_second is None, got[name]
    roomy = {a.name: a for a in alternatives(
        batch=8, num_devices=8, profile=PROFILES["h100_8"],
        single=single_step_time(graph, PROFILES["h100_8"]),
        dp=plan_step_time(graph, dp, PROFILES["h100_8"]), dp_peak=dp.memory.peak_bytes,
        dp_persistent=dp.memory.persistent_bytes, placement=placement)}
    assert all(a.samples_per_second for a in roomy.values())
    assert roomy["Swap"].samples_per_second == pytest.approx(roomy["Ideal"].samples_per_second)


def test_strided_gradients_count_only_the_taps_that_hit():
    """The input gradient of a strided conv gates its terms by stride: the kernel skips the
    zero terms, so its FLOPs equal the forward conv's and the filter gradient's."""
    x, w = tf.TensorSpec([2, 16, 16, 8]), tf.TensorSpec([3, 3, 8, 4])

    def step(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            loss = tf.reduce_sum(tf.nn.conv2d(x, w, strides=2, padding="SAME") ** 2)
        return tape.gradient(loss, [x, w])

    _, entries = _entries(step, x, w)
    flops = {e.op.type: op_flops(e.semantics) for e in entries.values()
             if e.op.type.startswith("Conv2D")}
    assert flops == {t: 2 * (2 * 8 * 8 * 4) * (3 * 3 * 8) for t in
                     ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")}


def test_the_h200_profile_is_the_measured_one():
    """PROFILES['h200_8'] holds what bench/gpu_kernels.py measured and bench/gpu_ops.py
    fitted on one H200 (bench/results), not figures typed in by hand."""
    import json
    from pathlib import Path
    results = Path(__file__).parents[2] / "bench" / "results"
    measured = json.loads((results / "gpu_kernels.json").read_text())["profile"]
    fitted = json.loads((results / "gpu_ops.json").read_text())["profile"]
    profile = PROFILES["h200_8"]
    assert profile.peak_flops == pytest.approx(measured["peak_flops"], rel=0.005)
    assert profile.host_bandwidth == pytest.approx(measured["host_bandwidth"], rel=0.01)
    assert profile.efficiency == pytest.approx(fitted["efficiency"], abs=0.005)
    assert profile.op_overhead == pytest.approx(fitted["op_overhead"], abs=0.05e-6)
    assert profile.memory_bandwidth == pytest.approx(fitted["memory_bandwidth"], rel=0.005)
