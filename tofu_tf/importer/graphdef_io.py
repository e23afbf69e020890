"""Import: a GraphDef plus fetches, or a TF2 concrete function, becomes a planner Graph.

Pass pipeline (the caller's GraphDef is never mutated: the first prune copies it; from the
clean pass on the passes edit that copy in place, and a prune after clean and after fold
drops what they leave unused):
  1. inputs      concrete function: captured variables (resource Placeholders) ->
                 VarHandleOp(dtype, shape, shared_name), captured eager tensors -> Const;
                 GraphDef: a fed output of a non-Placeholder op -> Placeholder
  2. prune       keep the fan-in of fetches and feeds; reject control flow
  3. calls       function calls inlined (_inline); where one cannot be (a polymorphic or
                 `_noinline` function), Grappler inlines them and folds shape arithmetic
                 (_normalise.GRAPPLER_PASSES)
  4. clean       strip Const control inputs (`^ShapeN`), prune again, reject control flow
  5. shapes      import into a fresh graph, read every output's static shape and dtype;
                 an unknown dimension raises DynamicShapeError
  6. groups      grouped convolutions -> depthwise ops, or one op per group (_grouped)
  7. fold        Shape/ShapeN/Size/Rank of static tensors and small values computed from
                 Consts alone become Consts; Identity, IdentityN, StopGradient,
                 PreventGradient, Reshapes to their input's shape and AddN of one tensor
                 and zeros are bypassed; equal small Consts become one (_fold)
  8. structure   roles, forward_op, variables and slots (_structure.analyse)
  9. build       attrs -> plain Python, small Const values -> Graph.constants, Graph(...)
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tofu_tf import _tf_graph
from tofu_tf._gc import paused_gc
from tofu_tf.errors import DynamicShapeError, GraphImportError
from tofu_tf.graph import Graph, Op, Tensor, tensor_name
from tofu_tf.importer import _fold, _grouped, _inline, _normalise
from tofu_tf.importer._nodes import NodeRecord, topological_order
from tofu_tf.importer._structure import Structure, analyse
from tofu_tf.importer.tf_attrs import python_value

MAX_CONSTANT_ELEMENTS = 4096  # Const values up to this size are kept in Graph.constants

Shape = tuple[int, ...] | None  # None: unknown rank; -1 entries: unknown dimension


@dataclass(frozen=True)
class ImportedGraph:
    """The planner graph and what the rewriter needs to transform and run it."""
    graph: Graph                         # the planner graph
    graph_def: graph_pb2.GraphDef        # the normalised GraphDef the graph was built from
    captures: Mapping[str, object]       # variable handle op name -> captured tf.Variable
    seconds: float                       # wall time of the whole import
    stats: Mapping[str, float] = field(default_factory=dict)  # per-stage seconds, node counts


def import_graph_def(graph_def: graph_pb2.GraphDef, fetches: Sequence[str], *,
                     feeds: Sequence[str] = ()) -> ImportedGraph:
    """Import a GraphDef; `fetches` are tensor ('loss:0') or op ('train_op') names."""
    start = time.perf_counter()
    _check_names(graph_def, fetches, feeds)
    _reject_resource_placeholders(
        graph_def, "import the tf.function with import_concrete_function("
                   "step.get_concrete_function(...)), which knows the captured variables.")
    return _import(_cut_at_feeds(graph_def, feeds), fetches, feeds, {}, start)


def import_concrete_function(cf) -> ImportedGraph:
    """Import a traced `tf.function` (`step.get_concrete_function(...)`)."""
    start = time.perf_counter()
    replacements, captures = _capture_replacements(cf)
    graph_def = _normalise.replace_nodes(cf.graph.as_graph_def(), replacements)
    _reject_resource_placeholders(
        graph_def, "use the variable inside the function (it is captured) instead of "
                   "passing it as an argument.")
    fetches = [t.name for t in cf.outputs]
    side_effects = [op.name for op in cf.graph.control_outputs]
    if not fetches and not side_effects:
        raise GraphImportError("the function has no outputs and no side effects.",
                               node=cf.name, fix="return the loss from the training step.")
    internal = {t.ref() for _, t in cf.graph.captures}
    feeds = [t.name for t in cf.inputs if t.ref() not in internal]
    return _import(graph_def, fetches, feeds, captures, start, side_effects)


# -- the pipeline -------------------------------------------------------------------------

def _import(graph_def: graph_pb2.GraphDef, fetches: Sequence[str], feeds: Sequence[str],
            captures: Mapping[str, object], start: float,
            side_effects: Sequence[str] = ()) -> ImportedGraph:
    """`side_effects`: ops that must run (a function's control outputs), fetched only
    where the fetches do not already depend on them."""
    with paused_gc():  # the passes allocate ~10^6 small objects; collection is pure cost
        return _run_passes(graph_def, fetches, feeds, captures, start, side_effects)


def _run_passes(graph_def, fetches, feeds, captures, start, side_effects) -> ImportedGraph:
    stats: dict[str, float] = {"nodes_in": len(graph_def.node)}
    roots = _normalise.fetch_node_names([*fetches, *feeds, *side_effects])
    graph_def = _normalise.prune(graph_def, roots)
    _normalise.assert_guards_as_asserts(graph_def)
    _normalise.reject_unsupported(graph_def, inlined=False)
    if _normalise.calls_functions(graph_def):
        if _inline.inlinable(graph_def):
            with _timed(stats, "inline_seconds"):
                graph_def = _inline.inline_calls(graph_def, keep=set(roots), prune=True)
        else:
            with _timed(stats, "grappler_seconds"):
                graph_def = _normalise.restore_order(
                    _normalise.run_grappler(graph_def, roots), graph_def)
            stats["nodes_grappler"] = len(graph_def.node)
            _check_survivors(graph_def, roots)
            graph_def = _normalise.prune(graph_def, roots)
    # From here the passes edit the pipeline's own copy in place; a prune after each
    # stage drops what it leaves unused.
    stale = _normalise.strip_const_control_inputs(graph_def)
    if stale:
        graph_def = _normalise.prune(graph_def, roots)
    if _normalise.assert_guards_as_asserts(graph_def):     # those of inlined calls
        graph_def = _normalise.prune(graph_def, roots)
    _normalise.reject_unsupported(graph_def)
    fetches = [*fetches, *_normalise.unreached(graph_def, fetches, side_effects)]
    with _timed(stats, "shape_seconds"):
        shapes = _static_shapes(graph_def)
    graph_def = _grouped.ungroup(graph_def, shapes)
    with _timed(stats, "fold_seconds"):
        graph_def = _normalise.fold_shape_ops(graph_def, shapes, keep=roots)
        stale = _fold.fold_constants(graph_def, shapes, keep=roots,
                                     max_elements=MAX_CONSTANT_ELEMENTS)
        stale = _fold.bypass_forwarding(graph_def, shapes, keep=roots) or stale
        stale = _fold.merge_constants(graph_def, shapes, keep=roots,
                                      max_elements=MAX_CONSTANT_ELEMENTS) or stale
        if stale:
            graph_def = _normalise.prune(graph_def, roots)
    graph_def = _normalise.set_default_attrs(graph_def)
    stats["nodes_out"] = len(graph_def.node)
    with _timed(stats, "build_seconds"):
        graph = _build_graph(graph_def, shapes, fetches)
    used = {name: value for name, value in captures.items() if name in graph.variables}
    return ImportedGraph(graph=graph, graph_def=graph_def, captures=MappingProxyType(used),
                         seconds=time.perf_counter() - start, stats=MappingProxyType(stats))


@contextmanager
def _timed(stats: dict[str, float], key: str) -> Iterator[None]:
    begin = time.perf_counter()
    yield
    stats[key] = time.perf_counter() - begin


def _check_names(graph_def: graph_pb2.GraphDef, fetches: Sequence[str],
                 feeds: Sequence[str]) -> None:
    if not fetches:
        raise GraphImportError("no fetches given.",
                               fix="pass the loss tensor and the train op as fetches.")
    _normalise.check_well_formed(graph_def)
    _normalise.check_fetches(graph_def, fetches, "fetch")
    _normalise.check_fetches(graph_def, feeds, "feed")


def _check_survivors(graph_def: graph_pb2.GraphDef, roots: Sequence[str]) -> None:
    names = {node.name for node in graph_def.node}
    for root in roots:
        if root not in names:
            raise GraphImportError("Grappler removed a fetched node.", node=root,
                                   fix="fetch a tensor computed by a real op, not an "
                                       "Identity of a constant.")


def _cut_at_feeds(graph_def: graph_pb2.GraphDef, feeds: Sequence[str]) -> graph_pb2.GraphDef:
    """A fed output of another op becomes a Placeholder: its producer's fan-in is not run."""
    nodes = {node.name: node for node in graph_def.node}
    fed = {_normalise.node_of(f) for f in feeds} - \
        {name for name, node in nodes.items() if node.op == "Placeholder"}
    if not fed:
        return graph_def
    shapes = _static_shapes(graph_def)
    replacements = {}
    for name in sorted(fed):
        if len(shapes[name]) != 1:
            raise GraphImportError("only an op with one output can be fed.", node=name,
                                   op_type=nodes[name].op,
                                   fix="feed a tf.identity of the tensor instead.")
        shape, dtype = shapes[name][0]
        replacements[name] = _normalise.placeholder_node(
            name, tf.as_dtype(dtype).as_datatype_enum, shape)
    return _normalise.replace_nodes(graph_def, replacements)


def _reject_resource_placeholders(graph_def: graph_pb2.GraphDef, fix: str) -> None:
    for node in graph_def.node:
        if node.op == "Placeholder" and "dtype" in node.attr and \
                node.attr["dtype"].type == tf.resource.as_datatype_enum:
            raise GraphImportError(
                "a resource placeholder (a variable handle) has no variable shape.",
                node=node.name, op_type=node.op, fix=fix)


# -- captures -----------------------------------------------------------------------------

def _capture_replacements(cf) -> tuple[dict[str, Any], dict[str, object]]:
    """VarHandleOps for captured resources, Consts for captured eager tensors."""
    try:
        variables = {id(v.handle): v for v in cf.graph.variables}
    except AssertionError:  # TensorFlow's message when a captured variable was freed
        raise GraphImportError(
            "the function captures variables that no longer exist.",
            fix="keep a reference to the model (or the object holding the tf.Variables) "
                "while the function is imported.") from None
    replacements: dict[str, Any] = {}
    captures: dict[str, object] = {}
    shared_names: set[str] = set()
    for external, internal in cf.graph.captures:
        name = internal.op.name
        if internal.dtype != tf.resource:
            replacements[name] = _normalise.const_node(name, _captured_value(external, name))
            continue
        variable = variables.get(id(external))
        dtype, shape = _resource_spec(variable, external, name)
        shared = _unique(_shared_name(variable, name), shared_names)
        replacements[name] = _normalise.var_handle_node(name, dtype, shape, shared)
        captures[name] = variable if variable is not None else external
    return replacements, captures


def _captured_value(external, name: str):
    try:
        return tf.make_tensor_proto(external.numpy())
    except (AttributeError, ValueError, TypeError) as error:
        raise GraphImportError(
            "a captured tensor has no concrete value.", node=name, op_type="Placeholder",
            fix="capture eager tensors or variables only, not tensors of another graph."
        ) from error


def _resource_spec(variable, external, name: str) -> tuple[int, list[int]]:
    if variable is not None:
        if not variable.shape.is_fully_defined():
            raise DynamicShapeError(f"variable '{variable.name}' has shape {variable.shape}.",
                                    node=name, op_type="VarHandleOp",
                                    fix="create the variable with a fully known shape.")
        return variable.dtype.as_datatype_enum, variable.shape.as_list()
    handle_data = getattr(external, "_handle_data", None)
    if handle_data is None or not handle_data.shape_and_type:
        raise GraphImportError("a captured resource is not a variable.", node=name,
                               op_type="Placeholder",
                               fix="only tf.Variable resources can be partitioned; create "
                                   "tables and iterators outside the training step.")
    spec = handle_data.shape_and_type[0]
    return spec.dtype, [d.size for d in spec.shape.dim]


def _shared_name(variable, name: str) -> str:
    if variable is None:
        return name
    return variable.name[:-2] if variable.name.endswith(":0") else variable.name


def _unique(name: str, used: set[str]) -> str:
    candidate, k = name, 1
    while candidate in used:
        candidate, k = f"{name}_{k}", k + 1
    used.add(candidate)
    return candidate


# -- shapes -------------------------------------------------------------------------------

def _static_shapes(graph_def: graph_pb2.GraphDef) -> dict[str, list[tuple[Shape, str]]]:
    """Every op's output (shape, dtype name), from TensorFlow's C++ shape inference.

    The GraphDef goes into a fresh graph through the C API only (`_import_operations`):
    the Python-side bookkeeping of a full `tf.graph_util.import_graph_def` (device scopes,
    colocation, control-flow contexts, default attrs written into the caller's GraphDef)
    costs three times the inference itself, and no pass here needs it."""
    graph = tf.Graph()
    try:
        operations = _import_operations(graph, graph_def)
    except (ValueError, tf.errors.OpError) as error:
        message = str(error).strip().splitlines()[0]
        match = re.search(r"[Nn]ode '?([^' :}]+)", message)
        raise GraphImportError(f"TensorFlow cannot import the normalised graph: {message}",
                               node=match.group(1) if match else None,
                               fix="load the ops' libraries first and make sure the GraphDef "
                                   "is complete (every input names a node).") from error
    return {op.name: [(_shape_of(t), t.dtype.name) for t in op.outputs]
            for op in operations}


def _import_operations(graph: tf.Graph, graph_def: graph_pb2.GraphDef) -> list:
    """`graph_def` imported into the empty `graph`; its operations as light Python
    wrappers (name, outputs) over the C graph (`tofu_tf._tf_graph`)."""
    if not _tf_graph.C_IMPORT:
        with graph.as_default():
            tf.graph_util.import_graph_def(_copy(graph_def), name="")
        return graph.get_operations()
    return [_tf_graph.wrap(graph, c_op) for c_op in _tf_graph.import_c_graph(graph, graph_def)]


def _copy(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    return out


def _shape_of(tensor) -> Shape:
    """The static shape as a tuple (-1: unknown dim), or None for an unknown rank."""
    raw = getattr(tensor, "_shape", None)       # (dims, unknown rank) without TensorShape
    if not isinstance(raw, tuple):
        return _shape_tuple(tensor.shape)
    dims, unknown_rank = raw
    return None if unknown_rank else tuple(-1 if d is None else d for d in dims)


def _shape_tuple(shape: tf.TensorShape) -> Shape:
    if shape.rank is None:
        return None
    return tuple(-1 if d is None else int(d) for d in shape.as_list())


def _check_static(node: NodeRecord, outputs: list[tuple[Shape, str]]) -> None:
    for index, (shape, dtype) in enumerate(outputs):
        if shape is not None and -1 not in shape:
            continue
        shown = "unknown rank" if shape is None else \
            "[" + ", ".join("None" if d < 0 else str(d) for d in shape) + "]"
        raise DynamicShapeError(f"output {index} has shape {shown}.", node=node.name,
                                op_type=node.type, fix=_shape_fix(node, shape, dtype))


# Outputs TensorFlow leaves without a static shape that carry no data the step needs:
# scratch space a kernel hands to its gradient kernel. Op type -> output indices.
SCRATCH_OUTPUTS = {"FusedBatchNormV3": (5,)}


def _scratch_outputs_empty(graph_def: graph_pb2.GraphDef,
                           shapes: Mapping[str, list[tuple[Shape, str]]]
                           ) -> dict[str, list[tuple[Shape, str]]]:
    """Give scratch outputs of unknown shape the empty shape (0,) instead of refusing."""
    out = dict(shapes)
    for node in graph_def.node:
        for index in SCRATCH_OUTPUTS.get(node.op, ()):
            shape, dtype = out[node.name][index]
            if shape is None or -1 in shape:
                out[node.name] = list(out[node.name])
                out[node.name][index] = ((0,), dtype)
    return out


def _shape_fix(node: NodeRecord, shape: Shape, dtype: str) -> str:
    if node.type in ("Placeholder", "PlaceholderWithDefault"):
        dims = [8, 224, 224, 3] if shape is None else [d if d >= 0 else 8 for d in shape]
        return (f"give the input a fixed shape, e.g. tf.TensorSpec({dims}, tf.{dtype}) "
                "with the batch size you train with.")
    return ("make this op's output shape static: feed fixed-shape inputs, and avoid ops "
            "whose output size depends on values (tf.where, tf.unique, boolean masks).")


# -- building the planner graph -----------------------------------------------------------

def _build_graph(graph_def: graph_pb2.GraphDef, shapes: Mapping[str, list[tuple[Shape, str]]],
                 fetches: Sequence[str]) -> Graph:
    nodes = {node.name: node for node in graph_def.node}
    order = topological_order([_record(node) for node in graph_def.node])
    shapes = _scratch_outputs_empty(graph_def, shapes)
    for record in order:
        _check_static(record, shapes[record.name])
    specs = {r.name: _variable_spec(nodes[r.name]) for r in order if r.type == "VarHandleOp"}
    structure = analyse(order, _normalise.fetch_node_names(fetches), specs)
    tensors = _tensors(order, shapes, structure, specs)
    ops = [_op(nodes[r.name], r, shapes, structure) for r in order]
    return Graph(ops, tensors, fetches=[f.lstrip("^") for f in fetches],
                 variables=structure.variables, constants=_constants(graph_def))


def _record(node) -> NodeRecord:
    inputs, controls = [], []
    for name in node.input:
        if name.startswith("^"):
            controls.append(name[1:])
        else:
            inputs.append(name if ":" in name else f"{name}:0")
    return NodeRecord(node.name, node.op, tuple(inputs), tuple(controls))


def _variable_spec(node) -> tuple[tuple[int, ...], str]:
    shape = node.attr["shape"].shape if "shape" in node.attr else None
    if shape is None or shape.unknown_rank or any(d.size < 0 for d in shape.dim):
        raise DynamicShapeError("the variable's shape is not fully known.", node=node.name,
                                op_type=node.op,
                                fix="create the variable with a fully known shape.")
    return tuple(d.size for d in shape.dim), _dtype_name(node.attr["dtype"].type)


def _tensors(order: Sequence[NodeRecord], shapes: Mapping[str, list[tuple[Shape, str]]],
             structure: Structure, specs: Mapping[str, tuple[tuple[int, ...], str]]
             ) -> list[Tensor]:
    tensors = []
    for record in order:
        for index, (shape, dtype) in enumerate(shapes[record.name]):
            name = tensor_name(record.name, index)
            variable = structure.resource_of.get(name) if dtype == "resource" else None
            if variable is not None:
                var_shape, var_dtype = specs[variable]
                tensors.append(Tensor(name, var_shape, var_dtype, is_resource=True))
            else:
                tensors.append(Tensor(name, shape, dtype))
    return tensors


def _op(node, record: NodeRecord, shapes, structure: Structure) -> Op:
    outputs = tuple(tensor_name(record.name, i) for i in range(len(shapes[record.name])))
    return Op(name=record.name, type=record.type, inputs=record.inputs, outputs=outputs,
              attrs=MappingProxyType(_attrs(node)), control_inputs=record.control_inputs,
              device=node.device, role=structure.roles[record.name],
              forward_op=structure.forward_op.get(record.name))


def _constants(graph_def: graph_pb2.GraphDef) -> dict[str, np.ndarray]:
    constants = {}
    for node in graph_def.node:
        if node.op != "Const" or "value" not in node.attr:
            continue
        proto = node.attr["value"].tensor
        if np.prod([d.size for d in proto.tensor_shape.dim]) <= MAX_CONSTANT_ELEMENTS:
            constants[tensor_name(node.name, 0)] = tf.make_ndarray(proto)
    return constants


# -- attrs -> plain Python ----------------------------------------------------------------

def _attrs(node) -> dict[str, Any]:
    """Plain-Python attrs (tf_attrs conventions); '_'-prefixed attrs and Const's value dropped."""
    return {key: python_value(node.attr[key]) for key in sorted(node.attr)
            if not key.startswith("_") and not (key == "value" and node.op == "Const")}


def _dtype_name(enum: int) -> str:
    return tf.dtypes.as_dtype(enum).name
