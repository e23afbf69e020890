"""The plan's prediction of what the emitted step moves (rewrite/pricing.py) is made
before emission, from the partition alone, and the verifier holds the emitter to it."""

from __future__ import annotations

import pytest

from tofu_tf.api import optimize, predict
from tofu_tf.errors import RewriteError
from tofu_tf.models import build
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.rewrite import emit as emit_module
from tofu_tf.importer.graphdef_io import import_graph_def
from tofu_tf.search.plan import Plan, make_plan
from tofu_tf.search.topology import Topology


def _imported(model: str, **sizes):
    step = build(model, optimizer="adam", graph_only=True, batch_size=8, dtype="float64",
                 **sizes)
    return step, import_graph_def(step.graph_def, step.fetches, feeds=list(step.feeds))


@pytest.mark.parametrize("model,topology", [("transformer", "2x2x2"), ("mlp", "4x2"),
                                            ("lstm", "2x3")])
def test_prediction_before_emission_equals_ledger(model, topology):
    step, imported = _imported(model)
    topo = Topology.parse(topology)
    plan = make_plan(imported.graph, topo)
    predicted, _ = predict(plan, imported, catalog(imported.graph))
    assert not plan.predicted_per_level            # the search alone does not price it
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                         plan=plan)
    ways = tuple(level.ways for level in plan.levels)
    assert optimized.ledger.step_bytes_per_level(ways) == predicted.predicted_per_level
    # the prediction survives JSON
    assert Plan.from_json(predicted.to_json()) == predicted


def test_the_verifier_catches_an_emitter_that_strays(monkeypatch):
    """An emitter that receives what its device already holds of a region (a convolution
    reads its own part and a halo) from another holder builds a consistent graph and
    ledger, but moves more than predicted: it fails loudly."""
    nearest = emit_module._Emitter._source

    def elsewhere(self, cell, d, pieces):
        others = [(e, v) for e, v in pieces if e != d]
        return nearest(self, cell, d, others) or nearest(self, cell, d, pieces)

    monkeypatch.setattr(emit_module._Emitter, "_source", elsewhere)
    step, _ = _imported("wresnet", units=(1, 1, 1, 1), image_size=16)
    with pytest.raises(RewriteError, match="plan predicts"):
        optimize(step.graph_def, step.fetches, feeds=list(step.feeds), topology="2x2x2")
