"""A memory budget in the search: fits, costs bytes only when it must, or a typed error."""

from __future__ import annotations

import pytest

from tofu_tf.api import optimize
from tofu_tf.errors import PlanInfeasibleError, TofuError
from tofu_tf.models import build
from tofu_tf.options import Options
from tofu_tf.importer.graphdef_io import import_graph_def
from tofu_tf.rewrite.memory import measure, persistent_bytes
from tofu_tf.runtime.session import Runner, SingleDevice
from tofu_tf.search.plan import Plan, make_plan


@pytest.fixture(scope="module")
def transformer():
    step = build("transformer", optimizer="adam", graph_only=True, batch_size=8)
    graph = import_graph_def(step.graph_def, step.fetches, feeds=list(step.feeds)).graph
    return step, graph, make_plan(graph, num_devices=8)


def test_a_loose_budget_keeps_the_least_communication_plan(transformer):
    _, graph, free = transformer
    plan = make_plan(graph, num_devices=8,
                     options=Options(memory_budget_bytes=free.peak_bytes))
    assert plan.total_bytes == free.total_bytes and plan.peak_bytes == free.peak_bytes


@pytest.mark.parametrize("fraction", [0.85, 0.6])
def test_a_tight_budget_is_met_by_moving_more_bytes(transformer, fraction):
    _, graph, free = transformer
    budget = int(fraction * free.peak_bytes)
    plan = make_plan(graph, num_devices=8, options=Options(memory_budget_bytes=budget))
    assert plan.peak_bytes <= budget < free.peak_bytes
    assert plan.total_bytes > free.total_bytes
    assert plan.single_device_peak_bytes == free.single_device_peak_bytes
    assert len(plan.per_device_peak_bytes) == 8
    assert Plan.from_json(plan.to_json()) == plan


def test_an_impossible_budget_names_the_smallest_peak_and_its_plan(transformer):
    _, graph, free = transformer
    budget = free.single_device_peak_bytes // 16          # below even the ideal share
    with pytest.raises(PlanInfeasibleError) as caught:
        make_plan(graph, num_devices=8, options=Options(memory_budget_bytes=budget))
    error = caught.value
    assert isinstance(error, TofuError)
    assert error.best_peak_bytes > budget
    assert error.best_plan.peak_bytes == error.best_peak_bytes
    assert "raise the budget to at least" in str(error)
    assert error.best_peak_bytes < free.peak_bytes


def test_the_budget_holds_when_tensorflow_runs_the_step(transformer):
    """The emitted step's estimate, buffers of its transfers included, fits the budget
    (the plan's own estimate leaves those out: optimize searches again for less where
    they overflow it), and TensorFlow's allocation records agree on every device."""
    step, graph, free = transformer
    budget = int(0.8 * free.peak_bytes)
    options = Options(memory_budget_bytes=budget)
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        values = single.values()
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=8,
                         options=options)
    estimated = {d: m.peak_bytes for d, m in optimized.memory(explain=0).items()}
    assert max(estimated.values()) <= budget
    assert optimized.plan.peak_bytes < max(estimated.values())     # transfer buffers
    feeds = dict(zip(step.feeds, step.sample_batch(0)))
    with Runner(optimized, values) as runner:
        runner.run(feeds)
        measured = measure(runner.session, list(optimized.fetches), feeds,
                           persistent_bytes(optimized.graph_def))
    assert len(measured) == 8
    assert max(measured.values()) <= 1.02 * budget, (measured, budget)


def test_a_budget_only_the_plan_meets_names_the_emitted_peak(transformer):
    """A budget the plan's own estimate meets but no emitted step does: the error names
    the emitted step's peak, not a plan that would overflow it."""
    step, _, free = transformer
    budget = int(0.6 * free.peak_bytes)
    with pytest.raises(PlanInfeasibleError, match="emitted step's estimated peak"):
        optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=8,
                 options=Options(memory_budget_bytes=budget))


def test_a_given_plan_over_the_budget_is_refused(transformer):
    """A stored plan is not searched again: where its emitted step's estimate exceeds the
    budget, the error says so; under a budget it meets, it is emitted as given."""
    step, _, free = transformer
    args = (step.graph_def, step.fetches)
    optimized = optimize(*args, feeds=list(step.feeds), plan=free)
    peak = max(m.peak_bytes for m in optimized.memory(explain=0).values())
    with pytest.raises(PlanInfeasibleError, match="given plan's emitted step"):
        optimize(*args, feeds=list(step.feeds), plan=free,
                 options=Options(memory_budget_bytes=peak - 1))
    again = optimize(*args, feeds=list(step.feeds), plan=free,
                     options=Options(memory_budget_bytes=peak))
    assert again.plan.total_bytes == free.total_bytes
