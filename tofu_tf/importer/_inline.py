"""Function calls inlined in Python: each call's body stamped into the graph under its name.

A call (PartitionedCall, StatefulPartitionedCall, or a node whose type is a library
function) is replaced by its function's body:

    body node n                -> node `<call>/n`
    an argument                -> the call's input
    call output k (`call:k`)   -> the body tensor the function returns as output k
    `^call` on a consumer      -> control inputs on the function's control outputs and on
                                  the producers of its returns
    the call's control inputs  -> control inputs of every body node

A tape's backward function (one with a `forward_function_name`) is stamped under the name
of the forward call whose outputs it reads: its gradient scopes (`gradients/<op>_grad/..`)
then name the forward op they differentiate (`<forward call>/<op>`), which is how the
gradient analysis (_gradients.py) pairs them. Names that would clash get a `_k` suffix.
Calls inside bodies are inlined in turn. `inlinable` tells whether every call can be done
this way: a polymorphic body (attr placeholders), a `_noinline` function or a
SymbolicGradient cannot, and the importer gives such graphs to Grappler. A function
compiled with XLA (`_XlaMustCompile`, which TensorFlow also marks `_noinline`: Keras
compiles grouped convolutions so) is inlined like any other: its body is TensorFlow ops,
the grouped convolutions among them rewritten once shapes are known (_grouped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.python.framework import function_def_to_graph

from tofu_tf.importer._normalise import _output_index, node_of, reachable

CALL_TYPES = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


@dataclass(frozen=True)
class _Body:
    """A function's body as NodeDefs with flat input names ('node:index')."""
    nodes: tuple[node_def_pb2.NodeDef, ...]       # without the argument placeholders
    arguments: tuple[str, ...]                    # argument placeholder names, in order
    returns: tuple[str, ...]                      # the body tensor of each output
    control_returns: tuple[str, ...]              # body nodes the function's callers wait for
    forward_function: str | None                  # set for a tape's backward function


class _Library:
    def __init__(self, graph_def: graph_pb2.GraphDef):
        self.functions = {f.signature.name: f for f in graph_def.library.function}
        self._bodies: dict[str, _Body] = {}

    def called(self, node: node_def_pb2.NodeDef) -> str | None:
        """The function a node calls, or None."""
        if node.op in CALL_TYPES and "f" in node.attr:
            return node.attr["f"].func.name
        return node.op if node.op in self.functions else None

    def body(self, name: str) -> _Body:
        if name not in self._bodies:
            self._bodies[name] = self._convert(self.functions[name])
        return self._bodies[name]

    @staticmethod
    def _convert(function) -> _Body:
        graph_def, flat = function_def_to_graph.function_def_to_graph_def(function)
        arguments = tuple(arg.name for arg in function.signature.input_arg)
        argument_set = set(arguments)
        nodes = tuple(n for n in graph_def.node if n.name not in argument_set)
        returns = tuple(flat[function.ret[arg.name]] for arg in function.signature.output_arg)
        control = tuple(function.control_ret[name]
                        for name in function.signature.control_output)
        forward = function.attr["forward_function_name"].s.decode() \
            if "forward_function_name" in function.attr else None
        return _Body(nodes, arguments, returns, control, forward)

    def inlinable(self, name: str, seen: frozenset = frozenset()) -> bool:
        function = self.functions.get(name)
        if function is None or name in seen or (_flag(function.attr, "_noinline") and
                                                not _flag(function.attr, "_XlaMustCompile")):
            return False
        for node in function.node_def:
            if any(value.placeholder for value in node.attr.values()):
                return False             # polymorphic: its attrs are bound per call
            inner = self.called(node)
            if node.op == "SymbolicGradient" or \
                    inner is not None and not self.inlinable(inner, seen | {name}):
                return False
        return True


def _flag(attrs, key: str) -> bool:
    return key in attrs and attrs[key].b


def inlinable(graph_def: graph_pb2.GraphDef) -> bool:
    """Whether every function call of the graph can be inlined here."""
    library = _Library(graph_def)
    for node in graph_def.node:
        if node.op == "SymbolicGradient":
            return False
        name = library.called(node)
        if name is not None and not library.inlinable(name):
            return False
    return True


@dataclass
class _Record:
    """A node of the inlined graph before it is written: its source NodeDef (a body node,
    or the graph's own), its final name and inputs."""
    source: node_def_pb2.NodeDef
    name: str
    inputs: list[str]


class _Inliner:
    def __init__(self, graph_def: graph_pb2.GraphDef):
        self.library = _Library(graph_def)
        self.used = {node.name for node in graph_def.node}
        self.records: list[_Record] = []
        self.outputs: dict[str, str] = {}           # "call:k" -> the tensor it stands for
        self.controls: dict[str, list[str]] = {}    # call -> control inputs standing for it

    def place(self, record: _Record, scope: Mapping[str, _Record]) -> None:
        """Append `record`, or its body if it calls a function; `scope` holds the records
        of the same body (or graph) by final name."""
        function = self.library.called(record.source)
        if function is None:
            self.records.append(record)
        else:
            self.expand(record, function, scope)

    def expand(self, call: _Record, function: str, scope: Mapping[str, _Record]) -> None:
        body = self.library.body(function)
        data = [i for i in call.inputs if not i.startswith("^")]
        extra_controls = [i for i in call.inputs if i.startswith("^")]
        arguments = dict(zip(body.arguments, data))
        prefix = self._prefix(call, body, data, scope)
        names = {node.name: self._unique(f"{prefix}/{node.name}") for node in body.nodes}

        def outer(tensor: str) -> str:
            control = tensor.startswith("^")
            name = node_of(tensor)
            if name in arguments:
                mapped = arguments[name]
                return f"^{node_of(mapped)}" if control else mapped
            if control:
                return f"^{names[name]}"
            return f"{names[name]}:{_output_index(tensor)}"

        local = {names[node.name]: _Record(node, names[node.name],
                                           [outer(i) for i in node.input] + extra_controls)
                 for node in body.nodes}
        for record in local.values():
            self.place(record, local)
        for k, tensor in enumerate(body.returns):
            self.outputs[f"{call.name}:{k}"] = outer(tensor)
        self.controls[call.name] = [outer(f"^{c}") for c in body.control_returns] + \
            [f"^{node_of(outer(t))}" for t in body.returns]

    def _prefix(self, call: _Record, body: _Body, data: list[str],
                scope: Mapping[str, _Record]) -> str:
        """The call's name, or for a tape's backward function its forward call's name."""
        if body.forward_function is not None:
            forward = {node_of(i) for i in data
                       if node_of(i) in scope and
                       self.library.called(scope[node_of(i)].source) == body.forward_function}
            if len(forward) == 1:
                return forward.pop()
        return call.name

    def _unique(self, name: str) -> str:
        candidate, k = name, 1
        while candidate in self.used:
            candidate, k = f"{name}_{k}", k + 1
        self.used.add(candidate)
        return candidate

    def resolve(self, tensor: str) -> str:
        while True:
            key = tensor if ":" in tensor else f"{tensor}:0"
            if key not in self.outputs:
                return tensor
            tensor = self.outputs[key]

    def rewire(self, record: _Record) -> None:
        """Its inputs through the calls' outputs and control closures."""
        data: list[str] = []
        controls: list[str] = []
        for name in record.inputs:
            if not name.startswith("^"):
                data.append(self.resolve(name))
            elif name[1:] in self.controls:
                controls.extend(self._control_closure(name[1:]))
            else:
                controls.append(name)
        record.inputs = data + list(dict.fromkeys(controls))

    def _control_closure(self, call: str) -> list[str]:
        out = []
        for control in self.controls[call]:
            name = control[1:]
            out.extend(self._control_closure(name) if name in self.controls else [control])
        return out


def inline_calls(graph_def: graph_pb2.GraphDef, keep=(), prune: bool = False
                 ) -> graph_pb2.GraphDef:
    """`graph_def` with every function call replaced by its body (see the module
    docstring); the function library is dropped. A call named in `keep` (a fetch, a side
    effect) leaves a stand-in of its name: an IdentityN of its returns, or a NoOp, with
    control inputs on the function's control outputs. `prune`: only the fan-in of the
    `keep` nodes is written. Check `inlinable` first."""
    inliner = _Inliner(graph_def)
    top = {node.name: _Record(node, node.name, list(node.input)) for node in graph_def.node}
    for record in top.values():
        inliner.place(record, top)
        if record.name in keep and record.name in inliner.controls:
            inliner.records.append(_stand_in(record, inliner))
    for record in inliner.records:
        inliner.rewire(record)
    records = inliner.records
    if prune:
        reached = reachable({r.name: r.inputs for r in records}, keep)
        records = [r for r in records if r.name in reached]
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.node.extend(_written(r) for r in records)
    return out


def _written(record: _Record) -> node_def_pb2.NodeDef:
    source = record.source
    if record.name == source.name and record.inputs == list(source.input):
        return source
    node = node_def_pb2.NodeDef()
    node.CopyFrom(source)
    node.name = record.name
    del node.input[:]
    node.input.extend(record.inputs)
    if "_class" in node.attr:          # colocation names refer to body names
        del node.attr["_class"]
    return node


def _stand_in(call: _Record, inliner: _Inliner) -> _Record:
    """A node named like the call that forwards its returns and waits for its effects."""
    function = inliner.library.called(call.source)
    outputs = inliner.library.functions[function].signature.output_arg
    node = node_def_pb2.NodeDef(name=call.name, op="IdentityN" if outputs else "NoOp")
    if outputs:
        node.attr["T"].list.type.extend(arg.type for arg in outputs)
    inputs = [inliner.outputs[f"{call.name}:{k}"] for k in range(len(outputs))]
    return _Record(node, call.name, inputs + list(inliner.controls[call.name]))
