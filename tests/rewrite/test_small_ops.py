"""Small ops and small partial results: an op every device would run alike may run once
(Options.compute_once_below), and a small replicated partial result is combined at one
member of each reduction group, level by level (partition.exchange_rounds). Both must
leave the numbers and the ledger's agreement with the prediction intact."""

from __future__ import annotations

import collections

import pytest

from tofu_tf.importer.graphdef_io import import_graph_def
from tofu_tf.models import build
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.options import Options, VariableStorage
from tofu_tf.rewrite.ledger import STEP_KINDS
from tofu_tf.rewrite.partition import EXCHANGE_BYTES, computed_once, partition
from tofu_tf.search.plan import make_plan
from tofu_tf.search.topology import Topology, coordinates

from equivalence import compare


def _devices_running(optimized) -> dict[str, set[str]]:
    """Planner op -> the devices that run a piece of it (piece nodes are `op/tofu_N`;
    constants left out: the emitter places a constant's copy where it is read)."""
    nodes = {node.name: node for node in optimized.graph_def.node}
    running: dict[str, set[str]] = collections.defaultdict(set)
    for name in optimized.op_nodes:
        if nodes[name].op != "Const":
            running[name.rsplit("/", 1)[0]].add(nodes[name].device)
    return running


@pytest.mark.parametrize("model,optimizer,topology,below", [
    ("mlp", "adam", "2x2x2", 4096), ("transformer", "adam", "3x2", 4096),
    ("wresnet", "momentum", "8", 4096), ("lstm", "sgd", "3", 10 ** 9),
    ("wresnet", "adam", "4x2", 10 ** 9)])
def test_compute_once_below_a_size(model, optimizer, topology, below):
    """Under a threshold, ops that every device ran alike run on device 0 alone; the
    numbers and the prediction hold, and no op runs on more devices than without it."""
    every = compare(model, optimizer, topology=topology, dtype="float64",
                    options=Options(replicate_below=below))
    once = compare(model, optimizer, topology=topology, dtype="float64",
                   options=Options(replicate_below=below, compute_once_below=below))
    assert once.ledger.step_bytes == once.plan.predicted_bytes
    before, after = _devices_running(every), _devices_running(once)
    first = once.devices[0]
    moved = [op for op in after if after[op] == {first} and len(before[op]) > 1]
    assert moved, "some replicated op now runs once"
    assert all(after[op] <= before[op] | {first} and len(after[op]) <= len(before[op])
               for op in after)
    assert len(once.op_nodes) < len(every.op_nodes)


@pytest.mark.parametrize("topology", ["4", "2x2x2", "3x2"])
def test_a_small_partial_result_is_combined_level_by_level(topology):
    """Data parallel MLP: bias gradients and the loss are partial and small. Level by
    level, innermost first, a reduction group sends its copies to one member, which alone
    combines them (at the outermost level a pair swaps them), and the devices that read
    the result fetch it from the nearest member holding it. Per level, each such tensor
    moves what the search priced for it (a Replicated partial result: 2 (k - 1) |D| per
    group), and per level only a root receives more than one copy. (The recursion's
    plan: the joint optimum at 2x2x2 produces the bias gradients split at an outer level
    and partial at the inner one, which is not the data parallel pattern this checks.)"""
    optimized = compare("mlp", "sgd", topology=topology, dtype="float64",
                        options=Options(variable_storage=VariableStorage.REPLICABLE,
                                        joint_choices=0))
    plan = optimized.plan
    ways = tuple(level.ways for level in plan.levels)

    def replicated(t: str) -> bool:
        return all(plan.state(level, t) == "R" for level in range(len(plan.levels)))

    small = {m.tensor for m in optimized.ledger.transfers
             if m.kind == "reduce" and m.bytes <= EXCHANGE_BYTES and replicated(m.tensor)}
    assert small
    def level_of(m) -> int:
        src, dst = coordinates(m.src, ways), coordinates(m.dst, ways)
        return next(i for i, (a, b) in enumerate(zip(src, dst)) if a != b)

    searched, moved = collections.Counter(), collections.Counter()
    for index, level in enumerate(plan.levels):
        for transfer in level.transfers:
            if transfer.tensor in small:
                searched[transfer.tensor, index] += level.groups * transfer.bytes
    for m in optimized.ledger.transfers:
        if m.tensor in small and m.kind in STEP_KINDS:
            moved[m.tensor, level_of(m)] += m.bytes
    assert moved == searched
    roots = 0
    for t in small:            # per level, a device receives one copy, or combines them
        mine = [m for m in optimized.ledger.transfers if m.tensor == t and not m.shared]
        received = collections.Counter((m.dst, level_of(m)) for m in mine)
        senders = collections.defaultdict(set)
        for m in mine:
            if m.kind == "reduce":
                senders[m.dst, level_of(m)].add(m.src)
        combined = {key for key, srcs in senders.items() if len(srcs) > 1}
        assert all(count == 1 for key, count in received.items() if key not in combined), \
            received
        roots += len(combined)
    assert roots or topology == "2x2x2", "some reduction group has more than two devices"


@pytest.mark.parametrize("model,topology", [("wresnet", "2x2x2"), ("lstm", "4x2")])
def test_every_op_that_qualifies_runs_once(model, topology):
    """Ops of one class (equal signatures and choices: a ResNet's repeated blocks, an
    RNN's steps) share their device ops; each is computed once all the same."""
    step = build(model, optimizer="adam", graph_only=True, batch_size=8)
    imported = import_graph_def(step.graph_def, list(step.fetches), feeds=list(step.feeds))
    graph, entries = imported.graph, catalog(imported.graph)
    plan = make_plan(graph, Topology.parse(topology), options=Options(replicate_below=4096))
    every = partition(graph, entries, plan)
    once = partition(graph, entries, plan, once_below=4096)
    qualify = {op.name for op in graph if op.name in every.ops and computed_once(
        op, entries[op.name].semantics, every.ops[op.name], graph, 4096)}
    assert len(qualify) > 1
    for name, pieces in once.ops.items():
        assert all(p.elsewhere for p in pieces[1:]) == (name in qualify), name
        assert not pieces[0].elsewhere
