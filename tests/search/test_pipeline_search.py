"""Pipeline stages in the search: which stage runs each op, the stage count chosen by
predicted step time within a budget, and the pipelined step time's overlap."""

from __future__ import annotations

import dataclasses

import pytest

from tofu_tf.errors import PlanInfeasibleError, TofuError
from tofu_tf.graph import Role
from tofu_tf.importer.graphdef_io import import_graph_def
from tofu_tf.models import build
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.options import Options
from tofu_tf.search.pipeline import assign_stages, split_topology
from tofu_tf.search.plan import _make_plan, _pipeline_plan, make_plan
from tofu_tf.search.recursive import search
from tofu_tf.search.simulate import PROFILES, plan_step_time
from tofu_tf.search.topology import Topology

_GRAPHS = {}


def graph_of(model, micro=1, **sizes):
    key = (model, micro, tuple(sorted(sizes.items())))
    if key not in _GRAPHS:
        step = build(model, optimizer="adam", batch_size=8, graph_only=True,
                     initializers=False, micro_batches=micro, **sizes)
        _GRAPHS[key] = import_graph_def(step.graph_def, step.fetches).graph
    return _GRAPHS[key]


@pytest.mark.parametrize("model,stages", [("mlp", 2), ("transformer", 4), ("lstm", 2),
                                          ("wresnet", 4)])
def test_stages_keep_layers_together(model, stages):
    graph = graph_of(model, micro=2)
    stage = assign_stages(graph, stages)
    handles = {v.handle: v.name for v in graph.variables.values()}
    assert set(stage.values()) == set(range(stages))
    for op in graph:
        if op.type == "Const":
            assert op.name not in stage
            continue
        for t in op.inputs:               # a handle's readers and writers: its stage
            if t in handles:
                assert stage[op.name] == stage[handles[t]], op.name
        if op.role is Role.BACKWARD and op.forward_op in stage:
            assert stage[op.name] == stage[op.forward_op], op.name
    # slots with their variables; every stage holds some variable
    for v in graph.variables.values():
        if v.slot_of:
            assert stage[v.name] == stage[v.slot_of]
    assert {stage[v.name] for v in graph.variables.values()} == set(range(stages))
    # both micro-batches' copies of a layer read its weights in its stage
    reads = [op for op in graph if op.type == "ReadVariableOp"]
    assert all(stage[op.name] == stage[handles[op.inputs[0]]] for op in reads)


def test_forward_pass_moves_forward_through_the_stages():
    graph = graph_of("transformer", micro=2)
    stage = assign_stages(graph, 2)
    handles = {v.handle for v in graph.variables.values()}
    back = 0
    for op in graph:
        if op.role is not Role.FORWARD or op.name not in stage:
            continue
        if any(t in handles for t in op.inputs):
            continue                      # a variable's own stage, wherever its reader is
        for t in op.inputs:
            producer = graph.producer(t).name
            if producer in stage and stage[producer] > stage[op.name]:
                back += 1
    assert back == 0


def test_too_many_stages_for_the_variables():
    graph = graph_of("mlp")
    with pytest.raises(PlanInfeasibleError, match="variable groups"):
        assign_stages(graph, 64)


def test_stage_level_takes_the_outer_level():
    level, inner = split_topology(Topology.parse("2x4"), 2)
    assert (level.ways, inner.ways) == (2, (4,))
    level, inner = split_topology(Topology.default(8), 4)
    assert (level.ways, inner.ways) == (4, (2,))
    with pytest.raises(PlanInfeasibleError):
        split_topology(Topology.default(8), 8)


def test_options_reject_a_negative_stage_count():
    with pytest.raises(TofuError, match="pipeline_stages"):
        Options(pipeline_stages=-1)


def test_micro_batches_overlap_in_the_predicted_step():
    """With 4 micro-batches over 2 stages, a stage works on the next micro-batch while the
    other works on this one: the step is shorter than the two stages' busy times added
    (on a profile whose devices do not share cores), and longer than the busiest."""
    graph = graph_of("transformer", micro=4, layers=4, d_model=64, seq_len=32)
    options = Options(pipeline_stages=2)
    _, inner = split_topology(Topology.default(8), 2)
    result = search(graph, inner, entries=catalog(graph), options=options)
    stages = assign_stages(graph, 2)
    profile = dataclasses.replace(PROFILES["h200_8"], op_overhead=0.0)
    piped = plan_step_time(graph, result, profile, stages=stages)
    serial = plan_step_time(graph, result, profile,
                            stages={name: 0 for name in stages})   # one resource
    assert piped.seconds < serial.seconds
    assert piped.seconds > piped.compute_seconds


def test_the_stage_count_search_keeps_the_fastest_that_fits():
    graph = graph_of("transformer", micro=2)
    topology = Topology.default(8)
    options = Options(step_profile="h200_8")
    chosen = make_plan(graph, topology, options=dataclasses.replace(options,
                                                                    pipeline_stages=0))
    timed = [_make_plan(graph, topology, options, timed=True)]
    timed += [_pipeline_plan(graph, topology, dataclasses.replace(options, pipeline_stages=s),
                             timed=True) for s in (2, 4)]
    assert chosen.step_seconds == min(p.step_seconds for p in timed)
    budget = sorted(p.peak_bytes for p in timed)[1]        # the smallest peak no longer fits
    within = make_plan(graph, topology, options=dataclasses.replace(
        options, pipeline_stages=0, memory_budget_bytes=budget))
    assert within.peak_bytes <= budget
    with pytest.raises(PlanInfeasibleError) as err:
        make_plan(graph, topology, options=dataclasses.replace(
            options, pipeline_stages=0, memory_budget_bytes=1000))
    assert err.value.best_peak_bytes > 1000


@pytest.mark.parametrize("model,stages", [("wresnet", 2), ("transformer", 4)])
def test_stage_boundaries_move_to_lower_the_largest_stage(model, stages, monkeypatch):
    """The boundaries start where the bytes balance and move while the largest stage's
    peak (search/memory.stage_peaks) falls: never above the starting cut's."""
    from tofu_tf.search import pipeline
    from tofu_tf.search.memory import stage_peaks
    graph = graph_of(model, micro=2)
    balanced = stage_peaks(graph, assign_stages(graph, stages))
    monkeypatch.setattr(pipeline, "BALANCE_EVALUATIONS", 0)
    monkeypatch.setattr(pipeline, "_ASSIGNED", {})
    start = stage_peaks(graph, assign_stages(graph, stages))
    assert max(balanced) <= max(start)
    assert len(balanced) == stages and min(balanced) > 0
