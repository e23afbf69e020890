"""Recomputation: the rewritten step, its memory (estimated and measured) and the budget."""

from __future__ import annotations

import numpy as np
import pytest

from tofu_tf.api import optimize
from tofu_tf.errors import PlanInfeasibleError, TofuError
from tofu_tf.graph import Role, split_tensor_name
from tofu_tf.importer.graphdef_io import import_graph_def
from tofu_tf.models import build
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.options import Options, Recompute
from tofu_tf.search.recompute import SUFFIX, candidates, draws_state, forward_end, recompute
from tofu_tf.rewrite.memory import measure, persistent_bytes
from tofu_tf.runtime.session import Runner, SingleDevice
from tofu_tf.search.memory import single_device_peak
from tofu_tf.search.plan import Plan, make_plan


def _imported(model, **kwargs):
    step = build(model, optimizer="adam", graph_only=True, batch_size=8, **kwargs)
    return step, import_graph_def(step.graph_def, step.fetches, feeds=list(step.feeds)).graph


@pytest.fixture(scope="module")
def transformer():
    return _imported("transformer")


@pytest.mark.parametrize("policy", [Recompute.CHEAP, Recompute.SEGMENTS])
def test_backward_readers_read_copies_that_run_late(transformer, policy):
    _, graph = transformer
    ops = candidates(graph, catalog(graph), policy)
    assert ops
    rewritten = recompute(graph, ops)
    copies = [op for op in rewritten if op.copy_of]
    assert {op.copy_of for op in copies} <= ops
    position = {op.name: i for i, op in enumerate(rewritten)}
    backward = forward_end(rewritten)
    assert backward == forward_end(graph) + sum(
        position[c.name] < backward for c in copies) and not any(
        position[c.name] < backward for c in copies)
    for i, op in enumerate(rewritten):
        producers = {split_tensor_name(t)[0] for t in op.inputs}
        if i >= backward and op.role in (Role.BACKWARD, Role.UPDATE):
            assert not producers & ops, f"{op.name} still reads an original"
        elif op.copy_of is None:                       # the forward pass is untouched
            assert op.inputs == graph.op(op.name).inputs
    for copy in copies:
        original = graph.op(copy.copy_of)
        assert copy.type == original.type and copy.attrs == original.attrs
        assert [rewritten.tensor(t).shape for t in copy.outputs] == \
            [graph.tensor(t).shape for t in original.outputs]
        readers = [r for t in copy.outputs for r in rewritten.consumers(t)]
        assert readers and all(r.role is not Role.FORWARD or r.copy_of for r in readers)
        # it runs after the forward pass: behind a backward op, or reading another copy
        assert copy.control_inputs or any(
            rewritten.producer(t).copy_of for t in copy.inputs), copy.name
        for c in copy.control_inputs:
            assert rewritten.op(c).role is Role.BACKWARD and position[c] < position[copy.name]


def test_random_ops_are_never_recomputed():
    _, graph = _imported("transformer", dtype="float64", dropout=0.2)
    drawn = [op.name for op in graph if draws_state(op.type)]
    for policy in (Recompute.CHEAP, Recompute.SEGMENTS):
        ops = candidates(graph, catalog(graph), policy)
        assert ops and not ops & set(drawn)


@pytest.mark.parametrize("policy,saves", [(Recompute.CHEAP, 0.15), (Recompute.SEGMENTS, 0.05)])
def test_recomputation_lowers_the_one_device_estimate(transformer, policy, saves):
    _, graph = transformer
    plain = single_device_peak(graph).transient_peak_bytes
    cut = single_device_peak(recompute(graph, candidates(graph, catalog(graph), policy)))
    assert cut.transient_peak_bytes <= (1 - saves) * plain


def measured_peaks(step, options_list, num_devices: int = 4) -> list[tuple[int, int]]:
    """Per Options: (the largest device peak TensorFlow's allocator records in one emitted
    step, the plan's estimate), from the same values and batch."""
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        values = single.values()
    feeds = dict(zip(step.feeds, step.sample_batch(0)))
    peaks = []
    for options in options_list:
        optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                             num_devices=num_devices, options=options)
        with Runner(optimized, values) as runner:
            runner.run(feeds)
            measured = measure(runner.session, list(optimized.fetches), feeds,
                               persistent_bytes(optimized.graph_def))
        peaks.append((max(measured.values()), optimized.plan.peak_bytes))
    return peaks


def test_recomputation_lowers_the_peak_tensorflow_measures(transformer):
    """The emitted step with CHEAP recomputation, run by TensorFlow on 4 logical devices:
    its largest device peak (allocator statistics) is below the plain plan's."""
    step, _ = transformer
    peaks = measured_peaks(step, [Options(), Options(recompute=Recompute.CHEAP)])
    (measured_plain, estimated_plain), (measured_cheap, estimated_cheap) = peaks
    assert estimated_cheap < 0.95 * estimated_plain
    assert measured_cheap < 0.95 * measured_plain, peaks


def _smallest_peak(graph, policy) -> int:
    with pytest.raises(PlanInfeasibleError) as caught:
        make_plan(graph, num_devices=4,
                  options=Options(recompute=policy, memory_budget_bytes=1))
    return caught.value.best_peak_bytes


def test_auto_keeps_the_budget_and_recomputes_where_only_that_fits(transformer):
    _, graph = transformer
    plain = make_plan(graph, num_devices=4)
    # a loose budget (the plain plan's own peak): the mix predicted fastest within it,
    # which may recompute (a copy may be stored otherwise than the tensor it copies: on
    # this tiny Transformer CHEAP is predicted 21% faster than no rewrite)
    loose = make_plan(graph, num_devices=4, options=Options(
        recompute=Recompute.AUTO, memory_budget_bytes=plain.peak_bytes))
    assert loose.peak_bytes <= plain.peak_bytes
    # below the smallest peak that partitioning alone reaches, only recomputation fits
    alone, cheap = _smallest_peak(graph, Recompute.NONE), _smallest_peak(graph, Recompute.CHEAP)
    assert cheap < alone
    budget = (cheap + alone) // 2
    tight = make_plan(graph, num_devices=4, options=Options(
        recompute=Recompute.AUTO, memory_budget_bytes=budget))
    assert (tight.recompute or tight.early_updates) and tight.peak_bytes <= budget
    assert Plan.from_json(tight.to_json()) == tight
    with pytest.raises(PlanInfeasibleError) as caught:
        make_plan(graph, num_devices=4, options=Options(
            recompute=Recompute.AUTO, memory_budget_bytes=cheap // 4))
    error = caught.value
    assert "with or without recomputation" in str(error)
    assert error.best_peak_bytes == error.best_plan.peak_bytes <= cheap
    assert error.best_plan.recompute or error.best_plan.early_updates
    with pytest.raises(Exception, match="memory budget"):
        make_plan(graph, num_devices=4, options=Options(recompute=Recompute.AUTO))
    with pytest.raises(TofuError, match="no device profile"):
        make_plan(graph, num_devices=4, options=Options(
            recompute=Recompute.AUTO, memory_budget_bytes=budget, step_profile="tpu"))


def test_a_stored_recomputing_plan_is_reused(transformer):
    step, graph = transformer
    plan = make_plan(graph, num_devices=4, options=Options(recompute=Recompute.CHEAP))
    again = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=4,
                     plan=Plan.from_json(plan.to_json()))
    assert again.plan.recompute == plan.recompute
    assert any(n.name.startswith(plan.recompute[0] + SUFFIX) for n in again.graph_def.node)
    assert np.isfinite(again.plan.peak_bytes)


def test_the_simulator_prices_the_recomputed_work(transformer):
    """The copies are ops of the step: one device's predicted compute grows by their work,
    and no more than one extra forward pass (SEGMENTS) or a fraction of it (CHEAP)."""
    from tofu_tf.search.recursive import search
    from tofu_tf.search.simulate import PROFILES, op_flops, plan_step_time, single_step_time
    from tofu_tf.search.topology import Topology
    _, graph = transformer
    profile = PROFILES["h200_8"]
    flops = {}
    for policy in (Recompute.NONE, Recompute.CHEAP, Recompute.SEGMENTS):
        g = recompute(graph, candidates(graph, catalog(graph), policy))
        flops[policy] = (single_step_time(g, profile).flops,
                         plan_step_time(g, search(g, Topology.default(4)), profile).flops)
    whole, _ = flops[Recompute.NONE]
    entries = catalog(graph)
    forward = sum(op_flops(entries[op.name].semantics) for op in graph
                  if op.role is Role.FORWARD and entries[op.name].semantics is not None)
    for policy in (Recompute.CHEAP, Recompute.SEGMENTS):
        assert whole < flops[policy][0] <= whole + forward, policy
        assert flops[policy][1] > flops[Recompute.NONE][1]
