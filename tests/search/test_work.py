"""The search prices the computation a replicated op repeats (Options.flop_bytes): each
device then runs less of the step's arithmetic than under the fewest-bytes plan, the
search's bytes still are the plan's bytes, and the price is the profile's rate."""

from __future__ import annotations

import pytest

from tofu_tf.errors import TofuError
from tofu_tf.options import Options
from tofu_tf.search.profiles import PROFILES, flop_bytes
from tofu_tf.search.recursive import search
from tofu_tf.search.simulate import plan_step_time, single_step_time
from tofu_tf.search.topology import Topology

from tests.search.test_search import graph_of


@pytest.mark.parametrize("model", ["mlp", "wresnet", "lstm", "transformer"])
@pytest.mark.parametrize("joint_choices", [0, Options().joint_choices])
def test_priced_work_splits_what_the_fewest_bytes_repeat(model, joint_choices):
    """By the recursion (joint_choices 0) the fewest bytes repeat work on every model,
    which priced work splits; the joint optimum of the fewest bytes may repeat no more
    (the Transformer's at 2x2x2), and its priced plan then computes as much."""
    graph, profile = graph_of(model), PROFILES["this_cpu"]
    fewest = search(graph, Topology.default(8),
                    options=Options(flop_bytes=0.0, joint_choices=joint_choices))
    priced = search(graph, Topology.default(8), options=Options(joint_choices=joint_choices))
    per_device = [plan_step_time(graph, r, profile).flops for r in (fewest, priced)]
    ideal = single_step_time(graph, profile).flops / 8
    assert ideal * (1 - 1e-9) <= per_device[1] <= per_device[0]
    assert per_device[1] < per_device[0] or (joint_choices and fewest.joint)
    assert priced.total_work > 0 or per_device[1] <= ideal * (1 + 1e-9)
    assert priced.total_bytes >= fewest.total_bytes            # bytes bought the split
    assert priced.objective == pytest.approx(priced.total_bytes + priced.total_work)


def test_the_price_is_the_profiles_rate():
    h200 = PROFILES["h200_8"]
    assert flop_bytes(Options(step_profile="h200_8")) == pytest.approx(
        h200.link_bandwidth / (h200.peak_flops * h200.efficiency))
    assert flop_bytes(Options(flop_bytes=0.5)) == 0.5


@pytest.mark.parametrize("bad", [{"flop_bytes": -1.0}, {"transfer_bytes": float("inf")},
                                 {"flop_bytes": "fast"}])
def test_a_bad_price_is_a_typed_error(bad):
    with pytest.raises(TofuError, match=f"Options.{next(iter(bad))}"):
        Options(**bad)


def test_priced_transfers_send_fewer_messages():
    """With a price per message (Options.transfer_bytes), the emitted step of the LSTM
    sends fewer cross-device messages than the fewest-bytes plan's, and moves more bytes."""
    from tofu_tf.api import optimize
    from tofu_tf.models import build
    from tofu_tf.rewrite.verify import cross_device_edges
    step = build("lstm", optimizer="sgd", graph_only=True, batch_size=8)
    sent = {}
    for price in (0.0, 4096.0):
        optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                             num_devices=8, options=Options(transfer_bytes=price))
        sent[price] = (len(cross_device_edges(optimized.graph_def)),
                       optimized.ledger.step_bytes)
    assert sent[4096.0][0] < 0.9 * sent[0.0][0]
    assert sent[4096.0][1] > sent[0.0][1]
