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
