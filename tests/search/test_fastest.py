"""Options.fastest_step: among the searches at a few memory weights, the plan predicted
fastest, within the budget; and the plan it picks trains to the same numbers."""

from __future__ import annotations

import pytest

from tofu_tf.errors import TofuError
from tofu_tf.options import Options
from tofu_tf.search.plan import STEP_WEIGHTS, make_plan
from tofu_tf.search.recursive import search
from tofu_tf.search.simulate import PROFILES, plan_step_time
from tofu_tf.search.topology import Topology

from tests.rewrite.equivalence import compare
from tests.search.test_search import graph_of


def _predicted(graph, weight, profile):
    result = search(graph, Topology.default(8), memory_weight=weight,
                    options=Options(step_profile=profile.name))
    return plan_step_time(graph, result, profile).seconds, result


@pytest.mark.parametrize("model", ["lstm", "transformer", "wresnet"])
def test_no_searched_plan_is_predicted_faster(model):
    graph = graph_of(model)
    profile = PROFILES["h200_8"]
    chosen = make_plan(graph, num_devices=8,
                       options=Options(fastest_step=True, step_profile="h200_8"))
    times = {w: _predicted(graph, w, profile) for w in STEP_WEIGHTS}
    best_seconds, best = min(times.values(), key=lambda t: (t[0], t[1].total_bytes))
    assert chosen.total_bytes == best.total_bytes
    assert best_seconds <= times[0.0][0]              # never slower than the fewest bytes
    # within a budget below the fastest plan's peak, the pick fits it
    budget = best.memory.peak_bytes - 1
    fitting = make_plan(graph, num_devices=8, options=Options(
        fastest_step=True, step_profile="h200_8", memory_budget_bytes=budget))
    assert fitting.peak_bytes <= budget


def test_an_unknown_profile_is_named():
    with pytest.raises(TofuError, match="no device profile"):
        make_plan(graph_of("mlp"), num_devices=4,
                  options=Options(fastest_step=True, step_profile="tpu"))


def test_the_fastest_plan_trains_to_the_same_numbers():
    compare("lstm", "adam", dtype="float64", num_devices=8,
            options=Options(fastest_step=True, step_profile="h200_8"))
