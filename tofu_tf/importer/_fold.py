"""Folding and bypassing in a flat GraphDef once its static shapes are known.

    fold_constants     a node computed from Consts alone whose outputs are small (shape
                       arithmetic, permutations, axes, BroadcastGradientArgs) -> Const;
                       the values come from TensorFlow's own kernels (one Session run)
    bypass_forwarding  Identity, IdentityN, StopGradient, PreventGradient (the step is
                       differentiated already), Reshape to its input's own shape, and AddN
                       of one tensor and zeros: their consumers read the forwarded tensor
    merge_constants    equal small Consts: their consumers read one

All work in place on the pipeline's own copy and leave the `keep` nodes (fetches, feeds,
side effects) and every node with a control input from a non-Const alone; what they leave
unused is pruned afterwards.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.framework import errors as tf_errors
from tensorflow.python.framework import op_def_registry

from tofu_tf.errors import GraphImportError
from tofu_tf.importer._normalise import _first_line, _output_index, const_node, node_of

FORWARDING_OPS = frozenset({"Identity", "IdentityN", "StopGradient", "PreventGradient"})


def fold_constants(graph_def: graph_pb2.GraphDef, shapes: dict[str, list],
                   keep: Iterable[str] = (), max_elements: int = 4096) -> bool:
    """Stateless nodes whose inputs are all Consts (or folded) and whose every output has
    at most `max_elements` elements become Consts, in place: a node keeps its name for
    output 0, output i > 0 becomes a new Const `<name>/folded_i` placed right after it
    (the node order is the schedule memory is estimated in). An output of unknown
    static shape (BroadcastGradientArgs) is measured once computed. `shapes` is updated;
    returns whether anything folded (the inputs of what folded may be left unused)."""
    candidates = _candidates(graph_def, shapes, set(keep), max_elements)
    if not candidates:
        return False
    values = _evaluate(graph_def, candidates)
    dropped = {n.name for n in candidates
               if any(v.size > max_elements for v in values[n.name])}
    while dropped:                          # what reads a large value is not constant
        more = {n.name for n in candidates if n.name not in dropped
                and any(node_of(i) in dropped for i in n.input)}
        if not more:
            break
        dropped |= more
    renames: dict[str, str] = {}
    extra: dict[str, list[node_def_pb2.NodeDef]] = {}   # node -> Consts of outputs 1, 2 ...
    for node in candidates:
        if node.name in dropped:
            continue
        outputs = values[node.name]
        for i, value in enumerate(outputs[1:], start=1):
            name = renames[f"{node.name}:{i}"] = f"{node.name}/folded_{i}"
            extra.setdefault(node.name, []).append(
                const_node(name, tf.make_tensor_proto(value)))
            shapes[name] = [(tuple(value.shape), tf.as_dtype(value.dtype).name)]
        _make_constant(node, outputs[0])
        shapes[node.name] = [(tuple(outputs[0].shape), tf.as_dtype(outputs[0].dtype).name)]
    if extra:
        _insert_after(graph_def, extra)
        _rename_inputs(graph_def, renames)
    return len(dropped) < len(candidates)


def merge_constants(graph_def: graph_pb2.GraphDef, shapes: Mapping[str, list],
                    keep: Iterable[str] = (), max_elements: int = 4096) -> bool:
    """Equal small Consts (device, dtype and value; at most `max_elements` elements; no
    control input) become one, in place: their consumers read the first in node order (a
    model's reduction axes, epsilons and shape vectors repeat hundreds of times, a Const
    per op that reads one, and per inlined call). The others are left unused (pruning
    drops them); returns whether any was merged."""
    keep = set(keep)
    first: dict[tuple, str] = {}
    renames: dict[str, str] = {}
    for node in graph_def.node:
        if node.op != "Const" or node.name in keep or node.input or \
                not _may_be_small(shapes[node.name][0][0], max_elements):
            continue
        key = (node.device, node.attr["dtype"].type,
               node.attr["value"].tensor.SerializeToString(deterministic=True))
        kept = first.setdefault(key, node.name)
        if kept != node.name:
            renames.update({node.name: kept, f"{node.name}:0": kept, f"^{node.name}": f"^{kept}"})
    if renames:
        _rename_inputs(graph_def, renames)
    return bool(renames)


def _insert_after(graph_def: graph_pb2.GraphDef,
                  extra: Mapping[str, list[node_def_pb2.NodeDef]]) -> None:
    nodes = []
    for node in graph_def.node:
        nodes.append(node)
        nodes.extend(extra.get(node.name, ()))
    del graph_def.node[:]
    graph_def.node.extend(nodes)


def _make_constant(node: node_def_pb2.NodeDef, value: np.ndarray) -> None:
    proto = tf.make_tensor_proto(value)
    node.op = "Const"
    node.device = ""
    del node.input[:]
    node.attr.clear()
    node.attr["dtype"].type = proto.dtype
    node.attr["value"].tensor.CopyFrom(proto)


def _rename_inputs(graph_def: graph_pb2.GraphDef, renames: Mapping[str, str]) -> None:
    for node in graph_def.node:
        if any(i in renames for i in node.input):
            inputs = [renames.get(i, i) for i in node.input]
            del node.input[:]
            node.input.extend(inputs)


def _candidates(graph_def: graph_pb2.GraphDef, shapes: Mapping[str, list], keep: set[str],
                max_elements: int) -> list[node_def_pb2.NodeDef]:
    """The non-Const nodes whose fan-in is Consts and candidates only (depth first, from
    the nodes whose outputs may be small: a data-sized output is never folded)."""
    small = {name for name, outputs in shapes.items()
             if all(_may_be_small(shape, max_elements) for shape, _ in outputs)}
    nodes = {node.name: node for node in graph_def.node if node.name in small}
    status: dict[str, bool] = {}
    entered: set[str] = set()
    stateful: dict[str, bool] = {}

    def constant(name: str) -> bool:
        stack = [name]
        while stack:
            top = stack[-1]
            node = nodes.get(top)
            if top in status:
                stack.pop()
            elif node is None:              # a large output: not constant
                status[top] = False
            elif top in entered:            # inputs decided (or on a cycle: not constant)
                status[top] = all(status.get(node_of(i), False) for i in node.input)
                stack.pop()
            elif node.op == "Const":
                status[top] = True
            elif not node.input or top in keep or stateful.setdefault(
                    node.op, _stateful(node.op)):
                status[top] = False
            else:
                entered.add(top)
                stack.extend(p for p in map(node_of, node.input) if p not in status)
        return status[name]

    return [node for node in nodes.values() if node.op != "Const" and constant(node.name)]


def _stateful(op_type: str) -> bool:
    """Stateful, or not a registered op (a function's name)."""
    op_def = op_def_registry.get(op_type)
    return op_def is None or op_def.is_stateful


def _may_be_small(shape, max_elements: int) -> bool:
    return shape is None or -1 in shape or math.prod(shape) <= max_elements


def _evaluate(graph_def: graph_pb2.GraphDef, nodes: list[node_def_pb2.NodeDef]
              ) -> dict[str, list[np.ndarray]]:
    """Every output of `nodes` (whose inputs are Consts or other `nodes`), from one
    Session run on this process's CPU."""
    needed = {node.name for node in nodes} | {node_of(i) for node in nodes for i in node.input}
    sub = graph_pb2.GraphDef()
    sub.versions.CopyFrom(graph_def.versions)
    for node in graph_def.node:
        if node.name in needed:
            copy = sub.node.add()
            copy.CopyFrom(node)
            copy.device = ""
            if "_class" in copy.attr:       # colocation with nodes left outside
                del copy.attr["_class"]
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(sub, name="")
    outputs = {node.name: graph.get_operation_by_name(node.name).outputs for node in nodes}
    config = config_pb2.ConfigProto(inter_op_parallelism_threads=1,
                                    intra_op_parallelism_threads=1)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    try:
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            values = session.run(outputs)
    except tf_errors.OpError as error:
        raise GraphImportError(
            f"an op computed from constants alone fails: {_first_line(error)}",
            node=getattr(error.op, "name", None), op_type=getattr(error.op, "type", None),
            fix="check the op's constant inputs (a permutation, axis or shape out of "
                "range); the step would fail the same way when run.") from error
    return {name: [np.asarray(v) for v in vs] for name, vs in values.items()}


def bypass_forwarding(graph_def: graph_pb2.GraphDef, shapes: Mapping[str, list],
                      keep: Iterable[str] = ()) -> bool:
    """Consumers of FORWARDING_OPS / same-shape Reshape nodes (and of an AddN of one
    tensor and zeros) read the forwarded tensors instead, in place; a control input on such
    a node becomes one on the producers it forwards. The bypassed nodes are left unused
    (pruning drops them); returns whether any was bypassed."""
    keep = set(keep)
    zeros: set[str] | None = None           # Consts of zeros, found on the first AddN
    forwarded: dict[str, list[str]] = {}    # bypassed node -> the tensors it passes on
    for node in graph_def.node:
        if node.op not in FORWARDING_OPS and node.op not in ("Reshape", "AddN") or \
                node.name in keep or any(i.startswith("^") for i in node.input):
            continue
        if node.op == "AddN" and zeros is None:
            zeros = {n.name for n in graph_def.node if n.op == "Const" and _zeros(n)}
        if node.op in FORWARDING_OPS or node.op == "Reshape" and _same_shape(node, shapes):
            forwarded[node.name] = list(node.input[:1] if node.op == "Reshape" else node.input)
        elif node.op == "AddN":
            others = [i for i in node.input if node_of(i) not in zeros]
            if len(others) == 1 and _same_shape(node, shapes, others[0]):
                forwarded[node.name] = others   # the tape's zero gradient of an unused output
    if not forwarded:
        return False

    def resolve(tensor: str) -> str:
        while node_of(tensor) in forwarded:
            tensor = forwarded[node_of(tensor)][_output_index(tensor)]
        return tensor

    # Every way an input names a bypassed node: 'n', 'n:k', '^n'.
    names = {f"{prefix}{n}{suffix}" for n, sources in forwarded.items()
             for prefix, suffix in [("", ""), ("^", "")] + [("", f":{k}")
                                                           for k in range(len(sources))]}
    for node in graph_def.node:
        if node.name not in forwarded and any(i in names for i in node.input):
            inputs = _rewired(node, forwarded, resolve)
            del node.input[:]
            node.input.extend(inputs)
    return True


def _same_shape(node: node_def_pb2.NodeDef, shapes: Mapping[str, list],
                data: str | None = None) -> bool:
    """Whether output 0 has the static shape of input `data` (default: the first)."""
    shape = shapes[node.name][0][0]
    data = node.input[0] if data is None else data
    return shape is not None and shapes[node_of(data)][_output_index(data)][0] == shape


def _zeros(node: node_def_pb2.NodeDef) -> bool:
    """A Const of real or integer zeros (all-zero bytes, or zeros as repeated values)."""
    tensor = node.attr["value"].tensor if "value" in node.attr else None
    if tensor is None:
        return False
    dtype = tf.as_dtype(tensor.dtype)
    if not (dtype.is_floating or dtype.is_integer or dtype.is_bool) or dtype.is_complex:
        return False
    if tensor.tensor_content:
        return not tensor.tensor_content.strip(b"\0")
    return all(v == 0 for field in _NUMBER_FIELDS for v in getattr(tensor, field))


_NUMBER_FIELDS = ("half_val", "float_val", "double_val", "int_val", "int64_val", "bool_val",
                  "uint32_val", "uint64_val")


def _rewired(node: node_def_pb2.NodeDef, forwarded, resolve) -> list[str]:
    data: list[str] = []
    controls: list[str] = []
    for name in node.input:
        if not name.startswith("^"):
            data.append(resolve(name))
        elif name[1:] in forwarded:
            controls.extend(f"^{node_of(resolve(t))}" for t in forwarded[name[1:]])
        else:
            controls.append(name)
    return data + list(dict.fromkeys(controls))
