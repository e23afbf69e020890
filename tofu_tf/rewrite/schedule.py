"""The execution order of a GraphDef, and control edges that make TensorFlow keep it.

TensorFlow's executor runs any ready op; on a partitioned step that lets a device run far
ahead (every forward op of many layers before the backward frees anything) and inflates
its peak. `sequence_devices` chains each device's ops with control edges in the order
`execution_order` gives — the order the memory estimate assumes — so the two agree.
`chain` finds those edges from plain lists (names, op types, devices, inputs), so an
emitter that keeps its nodes' records adds them without reading the GraphDef back.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from tensorflow.core.framework import graph_pb2

from tofu_tf._order import stable_topological_order

# Ops with no transient buffers: left out of the chain (they run once, up front).
UNCHAINED = frozenset({"Const", "VarHandleOp", "Placeholder", "NoOp"})


def _source(name: str) -> str:
    return name.lstrip("^").partition(":")[0]


def execution_order(graph_def: graph_pb2.GraphDef, fetches: Iterable[str] = ()) -> list[int]:
    """Indices of the nodes a step fetching `fetches` runs (all nodes if none given), in
    a topological order: the nodes without inputs first, then ties broken by the order in
    the GraphDef (for a graph built front to back, that order itself)."""
    nodes = graph_def.node
    return order([node.name for node in nodes], [list(node.input) for node in nodes], fetches)


def order(names: Sequence[str], inputs: Sequence[Sequence[str]], fetches: Iterable[str] = ()
          ) -> list[int]:
    """`execution_order` of nodes given as their names and input lists, in graph order."""
    index = {name: i for i, name in enumerate(names)}
    preds = [{index[_source(name)] for name in node_inputs} for node_inputs in inputs]
    runs = set(range(len(names)))
    if fetches:
        runs, stack = set(), [index[_source(f)] for f in fetches]
        while stack:
            i = stack.pop()
            if i not in runs:
                runs.add(i)
                stack.extend(preds[i])
    # Nodes without inputs (constants, handles, feeds) first: the executor starts them
    # all at once, and one placed after its readers (a constant the emitter made for an
    # early node and reused for a late one) would otherwise hold back every node that
    # waits for those readers.
    rank = sorted(range(len(preds)), key=lambda i: (bool(preds[i]), i))
    at = {i: r for r, i in enumerate(rank)}
    ordered = stable_topological_order([{at[p] for p in preds[i]} if i in runs else ()
                                        for i in rank])
    return [rank[r] for r in ordered if rank[r] in runs]


def chain(names: Sequence[str], ops: Sequence[str], devices: Sequence[str],
          inputs: Sequence[Sequence[str]], fetches: Iterable[str]) -> list[tuple[int, str]]:
    """(node index, the node it waits for) of the control edges `sequence_devices` adds,
    for nodes given as names, op types, devices and input lists in graph order."""
    last: dict[str, str] = {}
    waits = []
    for i in order(names, inputs, fetches):
        if ops[i] in UNCHAINED:
            continue
        before = last.get(devices[i])
        if before is not None and not any(_source(name) == before for name in inputs[i]):
            waits.append((i, before))
        last[devices[i]] = names[i]
    return waits


# oneDNN's graph pass (TensorFlow's MklLayoutRewritePass, on CPUs when oneDNN is on) merges
# each of these producer-consumer pairs into one node: (producer op, consumer op, the
# consumer's input the producer feeds). BiasAddGrad pairs with the Conv2DBackpropFilter
# that reads the same gradient at its input 2 (a sibling, not a producer).
ONEDNN_MERGES = (("Conv2D", "BiasAdd", 0), ("Pad", "Conv2D", 0))
ONEDNN_SIBLING_MERGES = (("Conv2DBackpropFilter", 2, "BiasAddGrad", 0),)


def merge_barriers(names: Sequence[str], ops: Sequence[str], devices: Sequence[str],
                   inputs: Sequence[Sequence[str]]) -> list[tuple[int, int]]:
    """(node index, input position) of the CPU nodes oneDNN would merge with another
    node, where an Identity must stand between them in a chained graph. A merged node
    inherits both nodes' control edges; with a node chained between the two (the first
    -> X -> the second), X waits for the merged node and the merged node for X: a cycle
    the executor never leaves (every thread idle, the step hung). The Identity (a
    forwarded buffer, no copy) makes the pair no longer match."""
    index = {name: i for i, name in enumerate(names)}
    readers: dict[str, list[tuple[int, int]]] = {}
    for i, node_inputs in enumerate(inputs):
        for k, name in enumerate(node_inputs):
            if not name.startswith("^"):
                readers.setdefault(_tensor(name), []).append((i, k))
    barriers = []
    for i, op in enumerate(ops):
        if "CPU" not in devices[i].upper():
            continue
        for producer, consumer, k in ONEDNN_MERGES:
            if op == consumer and len(inputs[i]) > k and \
                    ops[index[_source(inputs[i][k])]] == producer:
                barriers.append((i, k))
        for sibling, at, consumer, k in ONEDNN_SIBLING_MERGES:
            if op == consumer and any(ops[j] == sibling and position == at for j, position
                                      in readers.get(_tensor(inputs[i][k]), ())):
                barriers.append((i, k))
    return barriers


def _tensor(name: str) -> str:
    return name if ":" in name else name + ":0"


def sequence_devices(graph_def: graph_pb2.GraphDef, fetches: Iterable[str]
                     ) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which each device's ops that a step fetching `fetches`
    runs (but those in UNCHAINED) run in `execution_order`: each waits, by a control
    edge, for the one before it. Other nodes (initialisers) stay out of the chain."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    nodes = out.node
    waits = chain([n.name for n in nodes], [n.op for n in nodes], [n.device for n in nodes],
                  [list(n.input) for n in nodes], fetches)
    for i, before in waits:
        nodes[i].input.append("^" + before)
    return out
