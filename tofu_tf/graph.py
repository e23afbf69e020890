"""The planner's graph: plain Python values, no TensorFlow.

`importer/graphdef_io.py` builds a `Graph` from a GraphDef or a concrete function; every
later stage (semantics, search, plan) reads only this. A `Graph` is immutable once built:
ops are kept in a topological order, every tensor has a static shape and a dtype name,
and small constant values (shape arguments, axes, perms) are kept as NumPy arrays.

Names follow TensorFlow: an op is named by its node name, a tensor by "node:index".

Relations recorded for coarsening:
- `Op.role`: what part of the training step the op belongs to.
- `Op.forward_op`: for a gradient op, the forward op it differentiates (or None).
- `Op.copy_of`: for an op a rewrite of the step added (a forward op run again in the
  backward pass, `search/recompute.py`; a piece of a gradient sum, `search/reorder.py`),
  the op of the imported graph whose NodeDef it is written from, with its own attrs.
- `Variable`: a trainable variable or optimizer slot with its read and update ops;
  `Variable.slot_of` names the variable an optimizer slot belongs to.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from tofu_tf._order import stable_topological_order
from tofu_tf.errors import GraphImportError

# Bytes per element of the dtypes a training graph holds. "resource" and "variant" are
# handles: they carry no tensor data across devices.
DTYPE_SIZES: Mapping[str, int] = MappingProxyType({
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "bool": 1, "complex64": 8, "complex128": 16,
    "string": 8, "resource": 0, "variant": 0,
})


class Role(enum.Enum):
    """What part of a training step an op belongs to."""
    INPUT = "input"          # a fed placeholder (data, labels)
    CONSTANT = "constant"    # a Const
    VARIABLE = "variable"    # a variable handle (VarHandleOp or captured resource)
    FORWARD = "forward"      # forward pass and loss
    BACKWARD = "backward"    # gradient computation
    UPDATE = "update"        # optimizer: slot and variable updates


def tensor_name(op_name: str, index: int) -> str:
    """TensorFlow's name of output `index` of op `op_name`."""
    return f"{op_name}:{index}"


def split_tensor_name(name: str) -> tuple[str, int]:
    """'node:1' -> ('node', 1); a bare 'node' means output 0."""
    op_name, sep, index = name.rpartition(":")
    if not sep or not index.isdigit():
        return name, 0
    return op_name, int(index)


@dataclass(frozen=True)
class Tensor:
    """One op output with its static shape and dtype name.

    For a resource handle of a variable, `shape` and `dtype` are the variable's, and
    `is_resource` is set: region analysis treats the handle as the variable's value.
    """
    name: str
    shape: tuple[int, ...]
    dtype: str
    is_resource: bool = False

    @property
    def op_name(self) -> str:
        return split_tensor_name(self.name)[0]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def num_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def num_bytes(self) -> int:
        return self.num_elements * DTYPE_SIZES.get(self.dtype, 4)

    def __str__(self) -> str:
        return f"{self.name}{list(self.shape)}:{self.dtype}"


@dataclass(frozen=True)
class Op:
    """One node of the planner graph.

    `attrs` holds plain Python values (int, float, bool, str, bytes, lists, dtype names,
    shapes as tuples); TensorFlow-only attrs that no stage needs are dropped on import.
    """
    name: str
    type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    control_inputs: tuple[str, ...] = ()
    device: str = ""
    role: Role = Role.FORWARD
    forward_op: str | None = None
    copy_of: str | None = None      # added by a rewrite: the imported op it is written from

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def __str__(self) -> str:
        return f"{self.name} ({self.type})"


@dataclass(frozen=True)
class Variable:
    """A variable (model weight or optimizer slot) and the ops that touch it."""
    name: str                       # the handle op's name
    handle: str                     # the handle tensor's name
    shape: tuple[int, ...]
    dtype: str
    read_ops: tuple[str, ...] = ()
    update_ops: tuple[str, ...] = ()
    slot_of: str | None = None      # for an optimizer slot: the variable it serves
    trainable: bool = True

    @property
    def num_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * DTYPE_SIZES.get(self.dtype, 4)


class Graph:
    """An immutable training-step graph with static shapes.

    Build it with `Graph.build(...)`, which checks that every input names a tensor,
    that the ops can be ordered topologically, and that every shape is static.
    """

    def __init__(self, ops: Iterable[Op], tensors: Iterable[Tensor], *,
                 fetches: Iterable[str] = (), variables: Iterable[Variable] = (),
                 constants: Mapping[str, np.ndarray] | None = None):
        self._ops: dict[str, Op] = {}
        for op in ops:
            if op.name in self._ops:
                raise GraphImportError("two ops share this name.", node=op.name,
                                       op_type=op.type, fix="give every node a unique name.")
            self._ops[op.name] = op
        self._tensors: dict[str, Tensor] = {t.name: t for t in tensors}
        self.fetches: tuple[str, ...] = tuple(fetches)
        self.variables: Mapping[str, Variable] = MappingProxyType(
            {v.name: v for v in variables})
        self.constants: Mapping[str, np.ndarray] = MappingProxyType(dict(constants or {}))
        self._check_references()
        self._order = self._topological_order()
        self._consumers: dict[str, list[str]] = {}
        for op in self._order:
            for t in op.inputs:
                self._consumers.setdefault(t, []).append(op.name)

    # -- construction checks -------------------------------------------------
    def _check_references(self) -> None:
        for op in self._ops.values():
            for t in op.inputs:
                if t not in self._tensors:
                    raise GraphImportError(f"input '{t}' is not produced by any node.",
                                           node=op.name, op_type=op.type,
                                           fix="import the complete graph, or feed the tensor.")
            for c in op.control_inputs:
                if c not in self._ops:
                    raise GraphImportError(f"control input '^{c}' names no node.",
                                           node=op.name, op_type=op.type,
                                           fix="drop the dangling control edge.")
            for t in op.outputs:
                if t not in self._tensors:
                    raise GraphImportError(f"output '{t}' has no shape record.",
                                           node=op.name, op_type=op.type)
        for f in self.fetches:
            if split_tensor_name(f)[0] not in self._ops:
                raise GraphImportError(f"fetch '{f}' names no node.", node=f,
                                       fix="fetch an existing tensor or op.")

    def _topological_order(self) -> list[Op]:
        # Ties broken by insertion order: a graph given in a topological order (a
        # GraphDef written by TensorFlow) keeps it, and so does its schedule.
        ops = list(self._ops.values())
        index = {op.name: i for i, op in enumerate(ops)}
        order = [ops[i] for i in stable_topological_order(
            [{index[split_tensor_name(t)[0]] for t in op.inputs}
             | {index[c] for c in op.control_inputs} for op in ops])]
        if len(order) != len(self._ops):
            placed = {op.name for op in order}
            stuck = next(op for op in ops if op.name not in placed)
            raise GraphImportError("the graph has a cycle through this node.", node=stuck.name,
                                   op_type=stuck.type,
                                   fix="unroll loops before import (while loops are not supported).")
        return order

    # -- queries -------------------------------------------------------------
    @property
    def ops(self) -> list[Op]:
        """All ops in a topological order."""
        return list(self._order)

    def __iter__(self) -> Iterator[Op]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._ops)

    def __contains__(self, op_name: str) -> bool:
        return op_name in self._ops

    def op(self, name: str) -> Op:
        return self._ops[name]

    def tensor(self, name: str) -> Tensor:
        return self._tensors[name]

    @property
    def tensors(self) -> Mapping[str, Tensor]:
        return MappingProxyType(self._tensors)

    def producer(self, tensor: str) -> Op:
        return self._ops[split_tensor_name(tensor)[0]]

    def consumers(self, tensor: str) -> list[Op]:
        return [self._ops[n] for n in self._consumers.get(tensor, ())]

    def input_tensors(self, op: Op) -> list[Tensor]:
        return [self._tensors[t] for t in op.inputs]

    def output_tensors(self, op: Op) -> list[Tensor]:
        return [self._tensors[t] for t in op.outputs]

    def constant_value(self, tensor: str) -> np.ndarray | None:
        """The value of a constant tensor (small constants only), else None."""
        return self.constants.get(tensor)

    def variable_of_handle(self, tensor: str) -> Variable | None:
        for v in self.variables.values():
            if v.handle == tensor:
                return v
        return None

    def ops_by_role(self, role: Role) -> list[Op]:
        return [op for op in self._order if op.role is role]

    def op_types(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self._order:
            counts[op.type] = counts.get(op.type, 0) + 1
        return dict(sorted(counts.items()))

    def __repr__(self) -> str:
        return (f"Graph({len(self._ops)} ops, {len(self._tensors)} tensors, "
                f"{len(self.variables)} variables, fetches={list(self.fetches)})")
