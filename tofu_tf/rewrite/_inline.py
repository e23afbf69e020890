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
SymbolicGradient cannot, and the importer gives such graphs to Grappler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.python.framework import function_def_to_graph

from tofu_tf.rewrite._normalise import _output_index, node_of

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
        if function is None or name in seen or _flag(function.attr, "_noinline"):
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


class _Inliner:
    def __init__(self, graph_def: graph_pb2.GraphDef):
        self.library = _Library(graph_def)
        self.used = {node.name for node in graph_def.node}
        self.nodes: list[node_def_pb2.NodeDef] = []
        self.outputs: dict[str, str] = {}           # "call:k" -> the tensor it stands for
        self.controls: dict[str, list[str]] = {}    # call -> control inputs standing for it

    def place(self, node: node_def_pb2.NodeDef,
              scope: Mapping[str, node_def_pb2.NodeDef]) -> None:
        """Append `node` (final name and inputs), or its body if it is a call; `scope`
        holds the nodes of the same body (or graph) by final name."""
        function = self.library.called(node)
        if function is None:
            self.nodes.append(node)
        else:
            self.expand(node, function, scope)

    def expand(self, call: node_def_pb2.NodeDef, function: str,
               scope: Mapping[str, node_def_pb2.NodeDef]) -> None:
        body = self.library.body(function)
        data = [i for i in call.input if not i.startswith("^")]
        extra_controls = [i for i in call.input if i.startswith("^")]
        arguments = dict(zip(body.arguments, data))
        prefix = self._prefix(call, body, data, scope)
        names = {}
        for node in body.nodes:
            names[node.name] = self._unique(f"{prefix}/{node.name}")

        def outer(tensor: str) -> str:
            control = tensor.startswith("^")
            name = node_of(tensor)
            if name in arguments:
                mapped = arguments[name]
                return f"^{node_of(mapped)}" if control else mapped
            if control:
                return f"^{names[name]}"
            return f"{names[name]}:{_output_index(tensor)}"

        local = {}
        for node in body.nodes:
            copy = node_def_pb2.NodeDef()
            copy.CopyFrom(node)
            copy.name = names[node.name]
            del copy.input[:]
            copy.input.extend(outer(i) for i in node.input)
            copy.input.extend(extra_controls)
            if "_class" in copy.attr:          # colocation names refer to body names
                del copy.attr["_class"]
            local[copy.name] = copy
        for copy in local.values():
            self.place(copy, local)
        for k, tensor in enumerate(body.returns):
            self.outputs[f"{call.name}:{k}"] = outer(tensor)
        self.controls[call.name] = [outer(f"^{c}") for c in body.control_returns] + \
            [f"^{node_of(outer(t))}" for t in body.returns]

    def _prefix(self, call, body: _Body, data: list[str],
                scope: Mapping[str, node_def_pb2.NodeDef]) -> str:
        """The call's name, or for a tape's backward function its forward call's name."""
        if body.forward_function is not None:
            forward = {node_of(i) for i in data
                       if node_of(i) in scope and
                       self.library.called(scope[node_of(i)]) == body.forward_function}
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
            if tensor.startswith("^"):
                return tensor
            key = tensor if ":" in tensor else f"{tensor}:0"
            if key not in self.outputs:
                return tensor
            tensor = self.outputs[key]

    def rewired(self, node: node_def_pb2.NodeDef) -> node_def_pb2.NodeDef:
        data: list[str] = []
        controls: list[str] = []
        for name in node.input:
            if not name.startswith("^"):
                data.append(self.resolve(name))
            elif name[1:] in self.controls:
                controls.extend(self._control_closure(name[1:]))
            else:
                controls.append(name)
        inputs = data + list(dict.fromkeys(controls))
        if inputs == list(node.input):
            return node
        copy = node_def_pb2.NodeDef()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(inputs)
        return copy

    def _control_closure(self, call: str) -> list[str]:
        out = []
        for control in self.controls[call]:
            name = control[1:]
            out.extend(self._control_closure(name) if name in self.controls else [control])
        return out


def inline_calls(graph_def: graph_pb2.GraphDef, keep=()) -> graph_pb2.GraphDef:
    """`graph_def` with every function call replaced by its body (see the module
    docstring); the function library is dropped. A call named in `keep` (a fetch, a side
    effect) leaves a stand-in of its name: an IdentityN of its returns, or a NoOp, with
    control inputs on the function's control outputs. Check `inlinable` first."""
    inliner = _Inliner(graph_def)
    top = {node.name: node for node in graph_def.node}
    for node in graph_def.node:
        inliner.place(node, top)
        if node.name in keep and node.name in inliner.controls:
            inliner.nodes.append(_stand_in(node, inliner))
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.node.extend(inliner.rewired(node) for node in inliner.nodes)
    return out


def _stand_in(call: node_def_pb2.NodeDef, inliner: _Inliner) -> node_def_pb2.NodeDef:
    """A node named like the call that forwards its returns and waits for its effects."""
    function = inliner.library.called(call)
    outputs = inliner.library.functions[function].signature.output_arg
    node = node_def_pb2.NodeDef(name=call.name, op="IdentityN" if outputs else "NoOp")
    node.input.extend(inliner.outputs[f"{call.name}:{k}"] for k in range(len(outputs)))
    node.input.extend(inliner.controls[call.name])
    if outputs:
        node.attr["T"].list.type.extend(arg.type for arg in outputs)
    return node
