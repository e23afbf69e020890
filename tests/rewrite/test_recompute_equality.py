"""Recomputation changes no number: every tiny reference model, both policies, against
the unpartitioned step (which keeps every result). float64, as tests/rewrite/test_emit.py:
float32 partitioned sums differ from the unpartitioned ones by more than the tolerance on
some models, with or without recomputation (the recomputed kernels repeat the same
numbers bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest

from tofu_tf.api import optimize
from tofu_tf.models import build
from tofu_tf.options import Options, Recompute
from tofu_tf.runtime.session import Runner, SingleDevice

from tests.rewrite.equivalence import compare

CASES = [("mlp", "adam", Recompute.SEGMENTS, {"num_devices": 8}),
         ("wresnet", "sgd", Recompute.CHEAP, {"num_devices": 4}),
         ("wresnet", "adam", Recompute.SEGMENTS, {"topology": "2x4"}),
         ("lstm", "momentum", Recompute.CHEAP, {"num_devices": 8}),
         ("lstm", "adam", Recompute.SEGMENTS, {"num_devices": 4}),
         ("transformer", "adam", Recompute.CHEAP, {"topology": "2x2x2"}),
         ("transformer", "sgd", Recompute.SEGMENTS, {"num_devices": 8})]


def _ids(cases) -> list[str]:
    return [f"{m}-{o}-{p.value}-{next(iter(d.values()))}" for m, o, p, d in cases]


@pytest.mark.parametrize("model,optimizer,policy,devices", CASES, ids=_ids(CASES))
def test_recomputed_steps_equal_the_unpartitioned_step(model, optimizer, policy, devices):
    optimized = compare(model, optimizer, dtype="float64", options=Options(recompute=policy),
                        **devices)
    assert optimized.plan.recompute
    assert any("/tofu_recompute" in n.name for n in optimized.graph_def.node)
    assert optimized.ledger.step_bytes == optimized.plan.predicted_bytes


def test_dropout_masks_are_drawn_once_with_recomputation():
    """The random ops are kept, not drawn again: the same losses as the unpartitioned
    step with dropout (and dropout changes them)."""
    step = build("transformer", optimizer="adam", graph_only=True, batch_size=8,
                 dtype="float64", dropout=0.2)
    batches = [dict(zip(step.feeds, step.sample_batch(seed))) for seed in range(3)]
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        initial = single.values()
        want = [single.run(b)[0] for b in batches]
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=8,
                         options=Options(recompute=Recompute.CHEAP))
    assert optimized.plan.recompute
    with Runner(optimized, initial) as runner:
        got = [runner.run(b)[0] for b in batches]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


EARLY = [("mlp", "adam", Recompute.NONE, {"num_devices": 4}),
         ("wresnet", "momentum", Recompute.CHEAP, {"num_devices": 8}),
         ("lstm", "adam", Recompute.NONE, {"topology": "2x4"}),
         ("transformer", "adam", Recompute.SEGMENTS, {"num_devices": 8})]


@pytest.mark.parametrize("model,optimizer,policy,devices", EARLY, ids=_ids(EARLY))
def test_early_updates_equal_the_unpartitioned_step(model, optimizer, policy, devices):
    """Updates moved up to where their gradients are complete (Adam's slots, step count
    and bias corrections, batch norm's moving averages included)."""
    optimized = compare(model, optimizer, dtype="float64",
                        options=Options(early_updates=True, recompute=policy), **devices)
    assert optimized.plan.early_updates
    assert optimized.ledger.step_bytes == optimized.plan.predicted_bytes
