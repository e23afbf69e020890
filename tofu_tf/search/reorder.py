"""Updates as early as they may run: each weight gradient dies at once. No TensorFlow.

A training step written the usual way (`optimizer.apply_gradients` after the whole
backward pass) updates every variable at the end, so every weight gradient is alive at
once: on the paper's models at batch 8 that, not the activations, is most of the peak
(WResNet-152 widen 10: 27 of 49 GiB on one device). `updates_early(graph)` is the same
step with every update-role op (the optimizer's math, its slot and variable updates) moved
to the earliest point of the graph's order where it may run:

- after its inputs and control inputs;
- after every earlier op (in the given order) on the same variable: reads stay before the
  updates they preceded, updates keep their order;
- for an update of a variable, after every reader of the values read from it before (the
  read is a view of the variable's buffer; TensorFlow copies the variable when it is
  updated under a live view, a copy this keeps from happening).

Constants move too (a learning rate may be written after the backward pass); every other
op keeps its place, and each variable is read and written in the same order. First, each
gradient sum of many terms becomes a running sum (`accumulated`), so that its terms die as
they come too: the one change of value, the sum's rounding in another order. Everything
downstream (the search, the memory estimate, the emitter's sequential chain) follows the
graph's order.
"""

from __future__ import annotations

import dataclasses
import heapq

from tofu_tf.graph import Graph, Op, Role, split_tensor_name
from tofu_tf.liveness import ALIASING
from tofu_tf.search.recompute import forward_end


def updates_early(graph: Graph) -> Graph:
    """`graph` with running gradient sums and every update as early as it may run."""
    graph = accumulated(graph)
    ops = graph.ops
    index = {op.name: i for i, op in enumerate(ops)}
    preds: list[set[int]] = [
        {index[split_tensor_name(t)[0]] for t in op.inputs} | {index[c] for c in op.control_inputs}
        for op in ops]
    handles = {v.handle for v in graph.variables.values()}
    updates = {name for v in graph.variables.values() for name in v.update_ops}
    touched: dict[str, list[int]] = {}          # handle -> ops on it so far
    readers: dict[str, set[int]] = {}           # handle -> readers of its reads so far
    for i, op in enumerate(ops):
        for h in {t for t in op.inputs if t in handles}:
            preds[i].update(touched.get(h, ()))
            if op.name in updates:
                preds[i].update(readers.get(h, ()))
            touched.setdefault(h, []).append(i)
            if op.name not in updates:
                readers.setdefault(h, set()).update(_readers(graph, op, index))
    users: list[list[int]] = [[] for _ in ops]
    waiting = [len(p - {i}) for i, p in enumerate(preds)]
    for i, p in enumerate(preds):
        for q in p - {i}:
            users[q].append(i)
    ready = [(_key(ops[i], i), i) for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(ops[i])
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (_key(ops[u], u), u))
    assert len(order) == len(ops), "the given order was not topological"
    return Graph(order, graph.tensors.values(), fetches=graph.fetches,
                 variables=graph.variables.values(), constants=graph.constants)


def _key(op, i: int) -> tuple[int, int]:
    """Update-role ops (and the constants they read, such as a learning rate written
    last) first once ready; the others in their given order."""
    return (0 if op.role in (Role.UPDATE, Role.CONSTANT) else 1, i)


def _readers(graph: Graph, read, index) -> set[int]:
    """The ops reading a read's values, through views (Identity, Reshape ...)."""
    out, stack = set(), list(read.outputs)
    while stack:
        for consumer in graph.consumers(stack.pop()):
            out.add(index[consumer.name])
            if consumer.type in ALIASING:
                stack.extend(consumer.outputs)
    return out


def accumulated(graph: Graph) -> Graph:
    """`graph` with every gradient sum (an AddN of three or more terms after the forward
    pass) made a chain of two-term sums, each placed just after the later of its terms:
    a term is added as soon as it is computed (a weight shared over the 20 steps of an
    LSTM has 20 weight-sized gradient terms; summed at the end, all 20 are alive at once).
    The sum is the same up to the rounding of its order: the terms in the order they are
    computed instead of the order the AddN lists them."""
    ops = graph.ops
    position = {op.name: i for i, op in enumerate(ops)}
    first = forward_end(graph)
    tensors = dict(graph.tensors)
    after: dict[int, list[Op]] = {}            # position -> chain pieces placed after it
    replaced: set[str] = set()
    for op in ops[first:]:
        if op.type != "AddN" or len(op.inputs) < 3:
            continue
        terms = sorted(op.inputs, key=lambda t: position[split_tensor_name(t)[0]])
        acc, at = terms[0], position[split_tensor_name(terms[0])[0]]
        for k, term in enumerate(terms[1:], start=1):
            at = max(at, position[split_tensor_name(term)[0]])
            last = k == len(terms) - 1
            name = op.name if last else f"{op.name}/tofu_acc_{k}"
            piece = dataclasses.replace(
                op, name=name, inputs=(acc, term), outputs=(f"{name}:0",),
                attrs={**op.attrs, "N": 2}, control_inputs=op.control_inputs if last else (),
                copy_of=op.name)
            tensors[piece.outputs[0]] = dataclasses.replace(graph.tensor(op.outputs[0]),
                                                            name=piece.outputs[0])
            after.setdefault(position[op.name] if last else at, []).append(piece)
            acc = piece.outputs[0]
        replaced.add(op.name)
    if not replaced:
        return graph
    order = []
    for i, op in enumerate(ops):
        if op.name not in replaced:
            order.append(op)
        order.extend(after.get(i, ()))
    return Graph(order, tensors.values(), fetches=graph.fetches,
                 variables=graph.variables.values(), constants=graph.constants)
