"""Small ops and small partial results: an op every device would run alike may run once
(Options.compute_once_below), and a small replicated partial result is combined at one
member of its reduction group (partition.exchanges). Both must leave the numbers and the
ledger's agreement with the prediction intact."""

from __future__ import annotations

import collections

import pytest

from tofu_tf.importer.graphdef_io import import_graph_def
from tofu_tf.models import build
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.options import Options, VariableStorage
from tofu_tf.rewrite.partition import EXCHANGE_BYTES, computed_once, partition
from tofu_tf.search.plan import make_plan
from tofu_tf.search.topology import Topology

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
def test_a_small_partial_result_is_combined_at_one_member(topology):
    """Data parallel MLP: bias gradients and the loss are partial and small. A pair of
    devices swaps copies; a larger reduction group sends its g - 1 copies to one member,
    which alone combines them, and a device that reads the result fetches it from there:
    no device but a root receives more than one copy."""
    optimized = compare("mlp", "sgd", topology=topology, dtype="float64",
                        options=Options(variable_storage=VariableStorage.REPLICABLE))
    plan = optimized.plan

    def replicated(t: str) -> bool:
        return all(plan.state(level, t) == "R" for level in range(len(plan.levels)))

    messages = collections.defaultdict(set)
    for transfer in optimized.ledger.transfers:
        if transfer.kind == "reduce" and transfer.bytes <= EXCHANGE_BYTES and \
                replicated(transfer.tensor):
            messages[transfer.tensor].add((transfer.src, transfer.dst))
    stars = 0
    for t, pairs in messages.items():
        senders = collections.defaultdict(set)
        for src, dst in pairs:
            senders[dst].add(src)
        roots = {d for d, srcs in senders.items() if len(srcs) > 1}
        for src, dst in pairs:
            swapped = (dst, src) in pairs and len(senders[dst]) == 1
            assert swapped or dst in roots, (t, src, dst)
            assert src not in roots, (t, src, dst)
        stars += len(roots)
        received = collections.Counter(m.dst for m in optimized.ledger.transfers
                                       if m.tensor == t and not m.shared)
        assert all(count == 1 for d, count in received.items() if d not in roots), received
    assert stars, "some reduction group has more than two devices"


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
