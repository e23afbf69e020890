"""The execution order of a GraphDef, and control edges that make TensorFlow keep it.

TensorFlow's executor runs any ready op; on a partitioned step that lets a device run far
ahead (every forward op of many layers before the backward frees anything) and inflates
its peak. `sequence_devices` chains each device's ops with control edges in the order
`execution_order` gives — the order the memory estimate assumes — so the two agree.
"""

from __future__ import annotations

from typing import Iterable

from tensorflow.core.framework import graph_pb2

from tofu_tf._order import stable_topological_order

# Ops with no transient buffers: left out of the chain (they run once, up front).
UNCHAINED = frozenset({"Const", "VarHandleOp", "Placeholder", "NoOp"})


def _source(name: str) -> str:
    return name.lstrip("^").split(":")[0]


def execution_order(graph_def: graph_pb2.GraphDef, fetches: Iterable[str] = ()) -> list[int]:
    """Indices of the nodes a step fetching `fetches` runs (all nodes if none given), in
    a topological order, ties broken by the order in the GraphDef (for a graph built
    front to back, that order itself)."""
    index = {node.name: i for i, node in enumerate(graph_def.node)}
    preds = [{index[_source(name)] for name in node.input} for node in graph_def.node]
    runs = set(range(len(graph_def.node)))
    if fetches:
        runs, stack = set(), [index[_source(f)] for f in fetches]
        while stack:
            i = stack.pop()
            if i not in runs:
                runs.add(i)
                stack.extend(preds[i])
    order = stable_topological_order([preds[i] if i in runs else () for i in
                                      range(len(preds))])
    return [i for i in order if i in runs]


def sequence_devices(graph_def: graph_pb2.GraphDef, fetches: Iterable[str]
                     ) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which each device's ops that a step fetching `fetches`
    runs (but those in UNCHAINED) run in `execution_order`: each waits, by a control
    edge, for the one before it. Other nodes (initialisers) stay out of the chain."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    last: dict[str, str] = {}
    for i in execution_order(out, fetches):
        node = out.node[i]
        if node.op in UNCHAINED:
            continue
        before = last.get(node.device)
        if before is not None and not any(_source(name) == before for name in node.input):
            node.input.append("^" + before)
        last[node.device] = node.name
    return out
