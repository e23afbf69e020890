"""GraphDef-level normalisation before a training step becomes a planner Graph.

    captured resources -> VarHandleOp     (C++ shape inference sees variable shapes)
    Grappler: function, constfold, shape, constfold, dependency
                                          (only where a node calls a function: inline
                                          the calls, fold shape arithmetic to Const)
    strip control inputs of Const nodes   (the `^ShapeN` edges constfold leaves behind)
    prune to the fetches' fan-in          (data and control inputs)
    fold Shape/ShapeN/Size/Rank           (once static shapes are known)
    reject control flow and TensorLists   (While/If/Case cannot be partitioned op by op)

A graph without function calls skips Grappler: `_fold` (constant subgraphs, forwarding
ops) does all the planner needs of it in a tenth of the time, and the ops the planner
sees are then the ones the user wrote (Grappler would also rewrite x / c as x * (1 / c)).

No function mutates the GraphDef it is given, except `set_default_attrs` and
`strip_const_control_inputs` (in place, on the pipeline's own copy).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2
from tensorflow.python.framework import errors as tf_errors
from tensorflow.python.grappler import tf_optimizer

from tofu_tf._order import stable_topological_order
from tofu_tf.errors import GraphImportError

# Grappler passes, in order. An explicit list runs only these: layout and remapper stay
# off so the op types the planner sees are the ones the user wrote.
GRAPPLER_PASSES = ("function", "constfold", "shape", "constfold", "dependency")

CONTROL_FLOW_OPS = frozenset({
    "While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
    "Enter", "Exit", "Switch", "Merge", "NextIteration", "LoopCond", "RefEnter", "RefSwitch",
})
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "SymbolicGradient"})
# TensorFlow 1's reference variables: their reads and in-place updates carry ref-typed
# tensors, which no part of a step can hold a shard of.
REF_VARIABLE_OPS = frozenset({"VariableV2", "Variable", "TemporaryVariable"})
SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})

_UNROLL_FIX = ("unroll the loop in Python (for i in range(n)) with a fixed n, or "
               "use an unrolled layer (e.g. keras.layers.LSTM(..., unroll=True)); "
               "replace tf.cond with Python if on static values.")
# A conditional in a training step is most often Keras's LossScaleOptimizer (the
# mixed_float16 policy), which skips a step whose gradients are not finite.
_COND_FIX = ("replace tf.cond with Python if on static values. Under mixed_float16, "
             "keras.optimizers.LossScaleOptimizer adds one (it skips steps with non-finite "
             "gradients): scale the loss by a constant instead (loss * S, then the "
             "gradients / S), or use the mixed_bfloat16 policy, which needs no loss scaling.")


def node_of(input_name: str) -> str:
    """The node an input string refers to: 'x:1' -> 'x', '^x' -> 'x'."""
    name = input_name[1:] if input_name.startswith("^") else input_name
    head, sep, tail = name.rpartition(":")
    return head if sep and tail.isdigit() else name


def fetch_node_names(fetches: Iterable[str]) -> list[str]:
    return [node_of(f) for f in fetches]


def check_fetches(graph_def: graph_pb2.GraphDef, fetches: Sequence[str], what: str) -> None:
    """Every fetch (or feed) must name a node of `graph_def`."""
    names = {node.name for node in graph_def.node}
    for fetch in fetches:
        if node_of(fetch) not in names:
            raise GraphImportError(
                f"{what} '{fetch}' names no node of the graph.", node=fetch,
                fix=f"pass an existing tensor ('name:0') or op name as the {what}.")


def check_well_formed(graph_def: graph_pb2.GraphDef) -> None:
    """Names the first node TensorFlow would reject (or abort on) when importing: a name
    used twice, an op type neither registered nor in the graph's function library, an
    input naming no node."""
    from tensorflow.python.framework import op_def_registry
    functions = {f.signature.name for f in graph_def.library.function}
    seen: set[str] = set()
    for node in graph_def.node:
        if node.name in seen:
            raise GraphImportError("two nodes have this name.", node=node.name,
                                   op_type=node.op, fix="give every node a unique name.")
        seen.add(node.name)
        if node.op not in functions and op_def_registry.get(node.op) is None:
            raise GraphImportError(
                f"op type '{node.op}' is not registered in this TensorFlow.", node=node.name,
                op_type=node.op, fix="load the library that defines it "
                                     "(tf.load_op_library) before importing the graph.")
    for node in graph_def.node:
        for name in node.input:
            if node_of(name) not in seen:
                raise GraphImportError(
                    f"input '{name}' names no node of the graph.", node=node.name,
                    op_type=node.op, fix="pass a complete GraphDef (every input's node "
                                         "included), e.g. graph.as_graph_def().")


def replace_nodes(graph_def: graph_pb2.GraphDef,
                  replacements: Mapping[str, node_def_pb2.NodeDef]) -> graph_pb2.GraphDef:
    """A copy of `graph_def` with the named nodes swapped for new NodeDefs."""
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        out.node.append(replacements.get(node.name, node))
    return out


def calls_functions(graph_def: graph_pb2.GraphDef) -> bool:
    """Whether some node calls a function (a call op, or a library function as its type)."""
    functions = {f.signature.name for f in graph_def.library.function}
    return any(node.op in CALL_OPS or node.op in functions for node in graph_def.node)


def run_grappler(graph_def: graph_pb2.GraphDef, keep: Sequence[str]) -> graph_pb2.GraphDef:
    """Inline function calls and fold shape arithmetic; the `keep` nodes survive."""
    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.graph_def.CopyFrom(graph_def)
    meta_graph.collection_def["train_op"].node_list.value.extend(keep)
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.min_graph_nodes = -1
    rewrite.optimizers.extend(GRAPPLER_PASSES)
    # One round suffices (the list already folds twice) and halves the time.
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    rewrite.disable_tfg_optimizer = True  # its MLIR round trip only sinks control flow
    try:
        return tf_optimizer.OptimizeGraph(config, meta_graph, verbose=False)
    except (tf_errors.OpError, ValueError, RuntimeError) as error:
        raise GraphImportError(
            f"Grappler could not normalise the graph: {_first_line(error)}",
            fix="check that the GraphDef imports with tf.graph_util.import_graph_def; "
                "ops from custom libraries must be loaded (tf.load_op_library) first.") from error


def restore_order(graph_def: graph_pb2.GraphDef, reference: graph_pb2.GraphDef
                  ) -> graph_pb2.GraphDef:
    """`graph_def`'s nodes in `reference`'s order (Grappler emits its own): the original
    order is the schedule the model's author wrote, and the one memory is estimated in.
    A node `reference` lacks (inlined, folded) goes just before its first consumer; then
    a stable topological sort mends whatever that order breaks."""
    position = {node.name: float(i) for i, node in enumerate(reference.node)}
    consumers: dict[str, list[str]] = {}
    for node in graph_def.node:
        for name in node.input:
            consumers.setdefault(node_of(name), []).append(node.name)
    keys: dict[str, float] = {}

    def key(name: str, seen=()) -> float:
        if name not in keys:
            if name in position:
                keys[name] = position[name]
            else:
                later = [key(c, (*seen, name)) for c in consumers.get(name, ())
                         if c not in seen]
                keys[name] = min(later, default=float(len(position))) - 0.5
        return keys[name]

    nodes = sorted(graph_def.node, key=lambda node: key(node.name))
    index = {node.name: i for i, node in enumerate(nodes)}
    order = stable_topological_order([{index[node_of(i)] for i in node.input}
                                      for node in nodes])
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    del out.node[:]
    out.node.extend(nodes[i] for i in order)
    return out


def set_default_attrs(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """Give every node the attrs its op registers a default for (in place; returns it), as
    TensorFlow's Python import does, so the planner reads each attr, set or defaulted."""
    from tensorflow.python.framework import op_def_registry
    defaults: dict[str, list] = {}
    for node in graph_def.node:
        wanted = defaults.get(node.op)
        if wanted is None:
            op_def = op_def_registry.get(node.op)
            wanted = defaults[node.op] = [] if op_def is None else [
                (a.name, a.default_value) for a in op_def.attr if a.HasField("default_value")]
        for name, value in wanted:
            if name not in node.attr:
                node.attr[name].CopyFrom(value)
    return graph_def


def strip_const_control_inputs(graph_def: graph_pb2.GraphDef) -> bool:
    """Drop control inputs of Const nodes (a Const needs no ordering in a flat graph), in
    place on the pipeline's own copy; returns whether any was dropped."""
    stripped = False
    for node in graph_def.node:
        if node.op == "Const" and node.input:
            del node.input[:]      # a Const's inputs are all control inputs
            stripped = True
    return stripped


def reachable(inputs: Mapping[str, Iterable[str]], roots: Iterable[str]) -> set[str]:
    """Names reachable backwards from `roots` (node or tensor names) through `inputs`
    (node -> its data and '^'-control inputs); names not in `inputs` are left out."""
    keep: set[str] = set()
    stack = [node_of(r) for r in roots]
    while stack:
        name = stack.pop()
        if name in keep or name not in inputs:
            continue  # a dangling input is reported when the graph is imported
        keep.add(name)
        stack.extend(n for n in map(node_of, inputs[name]) if n not in keep)
    return keep


def fan_in(graph_def: graph_pb2.GraphDef, roots: Iterable[str]) -> set[str]:
    """Names of the nodes reachable backwards (data and control inputs) from `roots`."""
    return reachable({node.name: node.input for node in graph_def.node}, roots)


def unreached(graph_def: graph_pb2.GraphDef, fetches: Iterable[str],
              extra: Iterable[str]) -> list[str]:
    """The `extra` nodes that the fetches do not depend on."""
    extra = list(extra)
    if not extra:
        return []
    reached = fan_in(graph_def, fetches)
    return [name for name in extra if name not in reached]


def prune(graph_def: graph_pb2.GraphDef, roots: Iterable[str]) -> graph_pb2.GraphDef:
    """Keep the nodes reachable backwards (data and control inputs) from `roots`."""
    keep = fan_in(graph_def, roots)
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    out.node.extend(node for node in graph_def.node if node.name in keep)
    for node in out.node:            # colocation with a pruned node: TensorFlow rejects it
        if "_class" in node.attr:    # (tf.gradients colocates a gradient with its op)
            kept = [c for c in node.attr["_class"].list.s
                    if not c.startswith(b"loc:@") or c[5:].decode() in keep]
            if len(kept) < len(node.attr["_class"].list.s):
                del node.attr["_class"].list.s[:]
                node.attr["_class"].list.s.extend(kept)
                if not kept:
                    del node.attr["_class"]
    return out


def fold_shape_ops(graph_def: graph_pb2.GraphDef, shapes: dict[str, list],
                   keep: Iterable[str] = ()) -> graph_pb2.GraphDef:
    """Shape/ShapeN/Size/Rank of statically shaped inputs -> Const (those constfold missed).

    `shapes` (op name -> [(shape, dtype name)]) is updated in place for the new Consts;
    the `keep` nodes are left alone. Returns `graph_def` itself when nothing folds.
    """
    replacements: dict[str, list[node_def_pb2.NodeDef]] = {}
    renames: dict[str, str] = {}
    keep = set(keep)
    for node in graph_def.node:
        foldable = node.op in SHAPE_OPS and node.name not in keep
        values = _static_shape_values(node, shapes) if foldable else None
        if values is None:
            continue
        names = [node.name] if len(values) == 1 else \
            [f"{node.name}/folded_{i}" for i in range(len(values))]
        replacements[node.name] = [const_node(n, tf.make_tensor_proto(v))
                                   for n, v in zip(names, values)]
        shapes.update({n: [(v.shape, v.dtype.name)] for n, v in zip(names, values)})
        if len(values) > 1:
            renames.update({f"{node.name}:{i}": n for i, n in enumerate(names)})
            renames[node.name] = names[0]
    if not replacements:
        return graph_def
    return _rebuild(graph_def, replacements, renames)


def _static_shape_values(node: node_def_pb2.NodeDef, shapes) -> list[np.ndarray] | None:
    inputs = [i for i in node.input if not i.startswith("^")]
    in_shapes = [shapes[node_of(i)][_output_index(i)][0] for i in inputs]
    if any(shape is None or -1 in shape for shape in in_shapes):
        return None
    dtype = tf.as_dtype(node.attr["out_type"].type).as_numpy_dtype \
        if "out_type" in node.attr else np.int32
    if node.op == "Size":
        return [np.array(int(np.prod(in_shapes[0])), dtype)]
    if node.op == "Rank":
        return [np.array(len(in_shapes[0]), np.int32)]
    return [np.array(shape, dtype) for shape in in_shapes]


def _output_index(input_name: str) -> int:
    _, sep, tail = input_name.rpartition(":")
    return int(tail) if sep and tail.isdigit() else 0


def _rebuild(graph_def: graph_pb2.GraphDef, replacements: Mapping[str, list],
             renames: Mapping[str, str]) -> graph_pb2.GraphDef:
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in replacements:
            out.node.extend(replacements[node.name])
            continue
        if any(i in renames or i.lstrip("^") in renames for i in node.input):
            node = _renamed_inputs(node, renames)
        out.node.append(node)
    return out


def _renamed_inputs(node: node_def_pb2.NodeDef, renames: Mapping[str, str]
                    ) -> node_def_pb2.NodeDef:
    copy = node_def_pb2.NodeDef()
    copy.CopyFrom(node)
    del copy.input[:]
    for name in node.input:
        if name.startswith("^"):
            if name[1:] not in renames:  # a control edge on a folded op is dropped
                copy.input.append(name)
        else:
            copy.input.append(renames.get(name, name))
    return copy


_GUARD_OPS = frozenset({"Const", "Assert", "Identity", "NoOp"})


def assert_guards_as_asserts(graph_def: graph_pb2.GraphDef) -> int:
    """In place: each assertion's guard (tf.debugging.Assert in a function: an If whose
    true branch does nothing and whose false branch asserts) becomes the Assert itself,
    which fails the step as the guard did; the guard's name stays, an Identity of the
    condition that waits for it. Returns how many were rewritten."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    rewritten, added = 0, []
    for node in graph_def.node:
        if node.op != "If":
            continue
        then_fn = functions.get(node.attr["then_branch"].func.name)
        else_fn = functions.get(node.attr["else_branch"].func.name)
        if then_fn is None or else_fn is None or \
                any(n.op not in ("Identity", "NoOp") for n in then_fn.node_def) or \
                any(n.op not in _GUARD_OPS for n in else_fn.node_def):
            continue
        asserts = [n for n in else_fn.node_def if n.op == "Assert"]
        if len(asserts) != 1 or len(node.attr["Tout"].list.type) != 1:
            continue
        # the Assert reads the branch's arguments (the If's inputs past the condition)
        # and its own constants (the message), which move out of the function
        sources = {a.name: node.input[1 + i] for i, a in enumerate(else_fn.signature.input_arg)}
        consts = {inner.name: inner for inner in else_fn.node_def if inner.op == "Const"}
        sources.update({name: f"{node.name}/{name.split('/')[-1]}" for name in consts})
        data = [name.split(":")[0] for name in asserts[0].input if not name.startswith("^")]
        if any(name not in sources for name in data):
            continue
        for name, inner in consts.items():
            const = node_def_pb2.NodeDef(name=sources[name], op="Const", device=node.device)
            const.attr["dtype"].CopyFrom(inner.attr["dtype"])
            const.attr["value"].CopyFrom(inner.attr["value"])
            added.append(const)
        check = node_def_pb2.NodeDef(name=f"{node.name}/Assert", op="Assert",
                                     device=node.device)
        check.input.extend(sources[name] for name in data)
        check.input.extend(i for i in node.input if i.startswith("^"))
        check.attr["T"].CopyFrom(asserts[0].attr["T"])
        check.attr["summarize"].CopyFrom(asserts[0].attr["summarize"])
        added.append(check)
        condition = node.input[0]
        node.Clear()
        node.name, node.op = check.name[:-len("/Assert")], "Identity"
        node.input.extend([condition, "^" + check.name])
        node.attr["T"].type = tf.bool.as_datatype_enum
        rewritten += 1
    graph_def.node.extend(added)
    return rewritten


def reject_unsupported(graph_def: graph_pb2.GraphDef, *, inlined: bool = True) -> None:
    """Raise on control flow, TensorList ops, reference variables and (once `inlined`)
    calls left in place."""
    for node in graph_def.node:
        if node.op in REF_VARIABLE_OPS:
            raise GraphImportError(
                "a reference variable (TensorFlow 1's) cannot be sharded: its reads and "
                "in-place updates are ref-typed.", node=node.name, op_type=node.op,
                fix="build the graph with resource variables: call "
                    "tf.compat.v1.enable_resource_variables() first, or pass "
                    "use_resource=True to tf.compat.v1.get_variable (TensorFlow 2's "
                    "tf.Variable is one).")
        if node.op in CONTROL_FLOW_OPS:
            raise GraphImportError(
                "control flow cannot be partitioned op by op (loops and conditionals "
                "must be unrolled before import).", node=node.name, op_type=node.op,
                fix=_COND_FIX if node.op in ("If", "StatelessIf") else _UNROLL_FIX)
        if node.op.startswith("TensorList"):
            raise GraphImportError(
                "TensorList ops (from loops over tensors) have no static element shapes.",
                node=node.name, op_type=node.op, fix=_UNROLL_FIX)
        if inlined and node.op in CALL_OPS:
            if _compiled(graph_def, node):
                raise GraphImportError(
                    "this call runs a function compiled with XLA (jit_compile=True) that "
                    "could not be inlined (a polymorphic body or a SymbolicGradient): its "
                    "ops cannot be partitioned one by one.", node=node.name, op_type=node.op,
                    fix="build the function without jit compilation, or keep it out of the "
                        "step.")
            raise GraphImportError(
                "this function call could not be inlined.", node=node.name, op_type=node.op,
                fix="remove the @tf.function(experimental_attributes={'_noinline': True}) "
                    "marker, or call the inner function's Python body directly.")


def _compiled(graph_def: graph_pb2.GraphDef, node) -> bool:
    """Whether a call node's function must be compiled with XLA."""
    name = node.attr["f"].func.name if "f" in node.attr else node.op
    return any(f.signature.name == name and "_XlaMustCompile" in f.attr and
               f.attr["_XlaMustCompile"].b for f in graph_def.library.function)


def _first_line(error: BaseException) -> str:
    text = getattr(error, "message", None) or str(error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def var_handle_node(name: str, dtype_enum: int, shape: Sequence[int],
                    shared_name: str) -> node_def_pb2.NodeDef:
    """A VarHandleOp standing in for a captured resource placeholder."""
    node = node_def_pb2.NodeDef(name=name, op="VarHandleOp")
    node.attr["dtype"].type = dtype_enum
    for size in shape:
        node.attr["shape"].shape.dim.add(size=size)
    node.attr["shape"].shape.SetInParent()
    node.attr["shared_name"].s = shared_name.encode()
    node.attr["container"].s = b""
    node.attr["allowed_devices"].list.SetInParent()
    return node


def placeholder_node(name: str, dtype_enum: int, shape: Sequence[int] | None
                     ) -> node_def_pb2.NodeDef:
    """A Placeholder replacing a fed op; `shape` None: unknown rank, -1: unknown dimension."""
    node = node_def_pb2.NodeDef(name=name, op="Placeholder")
    node.attr["dtype"].type = dtype_enum
    if shape is None:
        node.attr["shape"].shape.unknown_rank = True
    else:
        for size in shape:
            node.attr["shape"].shape.dim.add(size=size)
        node.attr["shape"].shape.SetInParent()
    return node


def const_node(name: str, tensor_proto) -> node_def_pb2.NodeDef:
    """A Const holding a captured eager tensor's value."""
    node = node_def_pb2.NodeDef(name=name, op="Const")
    node.attr["dtype"].type = tensor_proto.dtype
    node.attr["value"].tensor.CopyFrom(tensor_proto)
    return node
