"""Pipeline stages (search/pipeline.py): each op on one stage's devices, micro-batches
flowing through them; the step trains exactly like the unpartitioned one with the same
micro-batches, and moves what the plan predicts."""

from __future__ import annotations

import numpy as np
import pytest

from tofu_tf.errors import PlanInfeasibleError
from tofu_tf.models import build
from tofu_tf.options import Collectives, Options, Recompute
from tofu_tf.rewrite.verify import cross_device_bytes
from tofu_tf.runtime.session import SingleDevice
from tofu_tf.search.pipeline import stage_of_devices
from tofu_tf.search.plan import Plan

from equivalence import compare


@pytest.mark.parametrize("model,devices,stages,micro", [
    ("mlp", 4, 2, 2), ("transformer", 8, 2, 2), ("lstm", 8, 4, 4), ("wresnet", 8, 2, 1)])
def test_pipelined_step_equals_the_unpartitioned_one(model, devices, stages, micro):
    optimized = compare(model, "adam", num_devices=devices, dtype="float64",
                        micro_batches=micro, options=Options(pipeline_stages=stages))
    plan = optimized.plan
    assert plan.levels[0].ways == stages and set(plan.stages.values()) == set(range(stages))
    assert optimized.ledger.step_bytes == plan.predicted_bytes > 0
    assert cross_device_bytes(optimized.graph_def) == optimized.ledger.moved_bytes
    # every op's nodes run on its stage's devices only, and each variable is stored there
    stage_of = stage_of_devices(tuple(level.ways for level in plan.levels))
    device_of = {node.name: optimized.devices.index(node.device)
                 for node in optimized.graph_def.node}
    for variable, shards in optimized.shards.items():
        assert {stage_of[shard.device] for shard in shards} == {plan.stages[variable]}
        assert all(device_of[shard.handle] == shard.device for shard in shards)
    placed = 0
    for name in optimized.op_nodes:
        op = name.rsplit("/tofu_", 1)[0]
        if op in plan.stages:
            assert stage_of[device_of[name]] == plan.stages[op], name
            placed += 1
    assert placed > len(plan.stages) // 2


@pytest.mark.parametrize("model", ["lstm", "transformer"])
def test_stage_count_searched_trains_like_the_unpartitioned_step(model):
    """Options(pipeline_stages=0) at 8 devices without micro-batches, as bench/overhead.py's
    rows "stages searched" run it: whichever count the simulator keeps, the step's numbers
    are the unpartitioned step's and the ledger moves what the plan predicts."""
    optimized = compare(model, "sgd", num_devices=8, dtype="float64",
                        options=Options(pipeline_stages=0))
    plan = optimized.plan
    assert plan.num_devices == 8
    assert optimized.ledger.step_bytes == plan.predicted_bytes
    if plan.stages:
        assert set(plan.stages.values()) == set(range(plan.levels[0].ways))


def test_stages_hold_less_than_one_group_holding_all():
    """Each device holds its stage's variables and optimizer slots only: at 2 stages of 4
    devices, a device's variable bytes are about half those of 8 devices' partition over
    4 (the plan's whole model over one group) and close to the 8-device partition's."""
    step = build("transformer", optimizer="adam", graph_only=True, batch_size=8,
                 micro_batches=2)
    from tofu_tf.api import optimize
    staged = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=8,
                      options=Options(pipeline_stages=2))
    one_group = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=4)
    held = [0] * 8
    for shards in staged.shards.values():
        for shard in shards:
            held[shard.device] += int(np.prod([b - a for a, b in shard.box]))
    held_group = [0] * 4
    for shards in one_group.shards.values():
        for shard in shards:
            held_group[shard.device] += int(np.prod([b - a for a, b in shard.box]))
    assert max(held) < 0.75 * max(held_group)
    assert staged.plan.peak_bytes < one_group.plan.peak_bytes


def test_micro_batches_equal_the_whole_batch():
    """Without batch statistics, the mean of the micro-batches' gradients is the whole
    batch's gradient: the micro-batched step is the same step."""
    losses, finals = [], []
    for micro in (1, 4):
        step = build("transformer", optimizer="momentum", graph_only=True, batch_size=8,
                     dtype="float64", micro_batches=micro)
        with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
            losses.append([single.run(dict(zip(step.feeds, step.sample_batch(seed))))[0]
                           for seed in range(2)])
            finals.append(single.values())
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-12)
    for name, value in finals[0].items():
        np.testing.assert_allclose(finals[1][name], value, rtol=1e-10, atol=1e-13)


def test_recomputation_and_stages_together():
    optimized = compare("transformer", "sgd", num_devices=8, dtype="float64",
                        micro_batches=2, options=Options(pipeline_stages=2,
                                                         recompute=Recompute.CHEAP,
                                                         early_updates=True))
    assert optimized.plan.recompute and optimized.plan.stages
    assert optimized.ledger.step_bytes == optimized.plan.predicted_bytes
    # a stored plan rebuilds the same pipeline
    stored = Plan.from_json(optimized.plan.to_json())
    assert stored == optimized.plan
    again = compare("transformer", "sgd", dtype="float64", micro_batches=2, plan=stored)
    assert again.ledger.step_bytes == optimized.ledger.step_bytes
    assert again.graph_def == optimized.graph_def


def test_a_stage_count_that_does_not_divide_the_devices_is_an_error():
    with pytest.raises(PlanInfeasibleError, match="pipeline stages"):
        compare("mlp", "sgd", num_devices=8, options=Options(pipeline_stages=3))
    with pytest.raises(PlanInfeasibleError, match="pipeline stages"):
        compare("mlp", "sgd", num_devices=4, options=Options(pipeline_stages=4))


@pytest.mark.parametrize("model,where,options,micro", [
    # batch norm updates its statistics once per micro-batch: each read of them waits
    # for the last update (the executor free to run ahead, without the device chain)
    ("wresnet", {"topology": "2x4"}, Options(pipeline_stages=2, sequential=False), 2),
    # an op computed once runs on its stage's first device
    ("transformer", {"num_devices": 8}, Options(pipeline_stages=4, compute_once_below=4096,
                                                 replicate_below=4096), 4),
    ("lstm", {"num_devices": 8}, Options(pipeline_stages=2,
                                         collectives=Collectives.V2), 2),
    ("transformer", {"num_devices": 8}, Options(pipeline_stages=2, shard_feeds=True), 2)],
    ids=["batch-norm-free-executor", "computed-once", "v2-collectives", "sharded-feeds"])
def test_stages_with_the_other_options(model, where, options, micro):
    optimized = compare(model, "adam", dtype="float64", micro_batches=micro, options=options,
                        **where)
    assert optimized.plan.stages
    assert optimized.ledger.step_bytes == optimized.plan.predicted_bytes
