"""The registry of op descriptions, and the context a description is built in.

Families register in `op_semantics/ops/<family>.py`:

    @semantics("MatMul")
    def matmul(ctx):
        a, b = ctx.inputs
        A = a.T if ctx.attr("transpose_a") else a
        B = b.T if ctx.attr("transpose_b") else b
        ctx.compute(lambda i, j: Sum(lambda k: A[i, k] * B[k, j]))

    opaque("RandomUniform", reason="stateful random numbers differ when split")

A second registration of the same op type is a `RegistryError`. `describe(...)` builds the
`Semantics` of one op instance (shapes, attrs and constant inputs known). An instance whose
shape arguments are not constants is opaque, with that reason.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tofu_tf.errors import DescriptionError, RegistryError, UnsupportedOpError
from tofu_tf.op_semantics.tdl import (Compute, TensorRef, Var, _lambda_params, check_compute,
                                      wrap)


@dataclass(frozen=True)
class Description:
    """How one op type is described: a TDL builder, or an explicit opaque reason."""
    op_type: str
    build: Callable[["OpContext"], None] | None
    opaque_reason: str | None = None
    localize: Callable | None = None
    family: str = ""


@dataclass(frozen=True)
class Semantics:
    """The description of one op instance."""
    op_name: str
    op_type: str
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    computes: tuple[Compute | None, ...]      # per output; None: computed whole
    meta_inputs: frozenset[int] = frozenset()  # inputs read as constants (shapes, axes)
    opaque_reason: str | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)
    num_outputs: int | None = None             # real outputs; the rest are in-place updates
    unsplittable: Mapping[str, str] = field(default_factory=dict)  # var name -> reason
    constants: Mapping[int, np.ndarray] = field(default_factory=dict)  # meta input values

    @property
    def updates(self) -> tuple[Compute, ...]:
        """The in-place writes (variable updates), after the real outputs."""
        n = len(self.computes) if self.num_outputs is None else self.num_outputs
        return tuple(c for c in self.computes[n:] if c is not None)

    @property
    def is_opaque(self) -> bool:
        return self.opaque_reason is not None


class _NotConstant(Exception):
    def __init__(self, index: int):
        self.index = index


class OpContext:
    """What a description sees of one op: shapes, dtypes, attrs, constant inputs."""

    def __init__(self, name: str, op_type: str, attrs: Mapping[str, Any],
                 input_shapes: Sequence[Sequence[int]], input_dtypes: Sequence[str],
                 output_shapes: Sequence[Sequence[int]], output_dtypes: Sequence[str],
                 constants: Mapping[int, np.ndarray] | None = None):
        self.name, self.type, self.attrs = name, op_type, dict(attrs)
        self.input_shapes = tuple(tuple(int(d) for d in s) for s in input_shapes)
        self.input_dtypes = tuple(input_dtypes)
        self.output_shapes = tuple(tuple(int(d) for d in s) for s in output_shapes)
        self.output_dtypes = tuple(output_dtypes)
        self._constants = dict(constants or {})
        self.inputs = tuple(TensorRef(i, s, d) for i, (s, d) in
                            enumerate(zip(self.input_shapes, self.input_dtypes)))
        self._computes: dict[int, Compute] = {}
        self._meta: set[int] = set()
        self._updates: list[int] = []
        self._unsplittable: dict[str, str] = {}

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def const(self, index: int) -> np.ndarray:
        """The value of constant input `index`; the input becomes a meta input."""
        if index not in self._constants:
            raise _NotConstant(index)
        self._meta.add(index)
        return np.asarray(self._constants[index])

    def is_const(self, index: int) -> bool:
        return index in self._constants

    def fail(self, message: str, fix: str | None = None) -> None:
        raise DescriptionError(message, node=self.name, op_type=self.type, fix=fix)

    def compute(self, fn: Callable, output: int = 0, alias: int | None = None) -> Compute:
        """Describe output `output` by a lambda with one parameter per output dim."""
        shape = self._output_shape(output)
        names = _lambda_params(fn)
        if len(names) != len(shape):
            self.fail(f"output {output} has rank {len(shape)} (shape {list(shape)}) but "
                      f"the lambda takes {len(names)} indices ({', '.join(names)}).")
        vars = tuple(Var(n, d, "output") for n, d in zip(names, shape))
        return self._finish(output, vars, lambda: fn(*vars), alias)

    def update(self, index: int, fn: Callable) -> Compute:
        """Describe an in-place write of input `index` (a variable): its new value.

        `fn` receives the tuple of index variables (d0, d1, ...), as in compute_nd.
        """
        output = len(self.output_shapes) + len(self._updates)
        self._updates.append(index)
        vars = tuple(Var(f"d{i}", d, "output") for i, d in enumerate(self.input_shapes[index]))
        return self._finish(output, vars, lambda: fn(vars), index)

    def unsplittable(self, var: str, reason: str) -> None:
        """Withhold a candidate variable from splitting, saying why the kernel needs it whole."""
        self._unsplittable[var] = reason

    def compute_nd(self, fn: Callable, output: int = 0, alias: int | None = None,
                   prefix: str = "d") -> Compute:
        """Like compute, for rank-generic bodies: fn receives the tuple of index vars."""
        shape = self._output_shape(output)
        vars = tuple(Var(f"{prefix}{i}", d, "output") for i, d in enumerate(shape))
        return self._finish(output, vars, lambda: fn(vars), alias)

    def _all_output_shapes(self) -> tuple[tuple[int, ...], ...]:
        return self.output_shapes + tuple(self.input_shapes[i] for i in self._updates)

    def _output_shape(self, output: int) -> tuple[int, ...]:
        if not 0 <= output < len(self.output_shapes):
            self.fail(f"output {output} does not exist (the op has "
                      f"{len(self.output_shapes)} outputs).")
        if output in self._computes:
            self.fail(f"output {output} is described twice.")
        return self.output_shapes[output]

    def _finish(self, output: int, vars: tuple[Var, ...], make_body: Callable[[], Any],
                alias: int | None) -> Compute:
        """Build the body, check it, record it; errors name this op."""
        try:
            compute = Compute(output, vars, wrap(make_body()), alias)
            check_compute(compute, self._all_output_shapes()[output], self.name)
        except DescriptionError as err:
            if err.node is not None:
                raise
            raise DescriptionError(str(err), node=self.name, op_type=self.type) from None
        self._computes[output] = compute
        return compute

    def semantics(self) -> Semantics:
        shapes = self._all_output_shapes()
        computes = tuple(self._computes.get(i) for i in range(len(shapes)))
        return Semantics(self.name, self.type, self.input_shapes, shapes, computes,
                         frozenset(self._meta), None, self.attrs, len(self.output_shapes),
                         dict(self._unsplittable),
                         {i: np.asarray(self._constants[i]) for i in sorted(self._meta)})


_REGISTRY: dict[str, Description] = {}
_LOADED = False


def register(description: Description) -> None:
    existing = _REGISTRY.get(description.op_type)
    if existing is not None:
        raise RegistryError(f"is registered twice: in {existing.family} and in "
                            f"{description.family}.", op_type=description.op_type,
                            fix="keep one registration per op type.")
    _REGISTRY[description.op_type] = description


def semantics(*op_types: str, localize: Callable | None = None):
    """Decorator: register a TDL builder for these op types."""
    def decorate(fn: Callable[[OpContext], None]):
        for t in op_types:
            register(Description(t, fn, None, localize, fn.__module__))
        return fn
    return decorate


def opaque(*op_types: str, reason: str, family: str = "") -> None:
    """Declare op types that are kept whole, with the reason why."""
    for t in op_types:
        register(Description(t, None, reason, None, family))


def _load_families() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    import tofu_tf.op_semantics.ops as ops_pkg
    for info in pkgutil.iter_modules(ops_pkg.__path__):
        importlib.import_module(f"{ops_pkg.__name__}.{info.name}")


def registered() -> dict[str, Description]:
    """Every description by op type (a copy)."""
    _load_families()
    return dict(_REGISTRY)


def description(op_type: str) -> Description | None:
    """The description of `op_type`, None when it has none (no copy: per op, hot)."""
    _load_families()
    return _REGISTRY.get(op_type)


def lookup(op_type: str) -> Description:
    _load_families()
    try:
        return _REGISTRY[op_type]
    except KeyError:
        raise UnsupportedOpError(
            "has no semantics description.", op_type=op_type,
            fix=f"describe it in tofu_tf/op_semantics/ops/ with @semantics('{op_type}'), or "
                f"declare it opaque('{op_type}', reason=...).") from None


def describe(name: str, op_type: str, attrs: Mapping[str, Any],
             input_shapes: Sequence[Sequence[int]], input_dtypes: Sequence[str],
             output_shapes: Sequence[Sequence[int]], output_dtypes: Sequence[str],
             constants: Mapping[int, np.ndarray] | None = None) -> Semantics:
    """Build the Semantics of one op instance (opaque when its type says so)."""
    desc = lookup(op_type)
    ctx = OpContext(name, op_type, attrs, input_shapes, input_dtypes, output_shapes,
                    output_dtypes, constants)
    if desc.build is None:
        return _opaque(ctx, desc.opaque_reason)
    try:
        desc.build(ctx)
    except _NotConstant as nc:
        return _opaque(ctx, f"input {nc.index} must be a constant for a split to be derived")
    return ctx.semantics()


def _opaque(ctx: OpContext, reason: str) -> Semantics:
    return opaque_semantics(ctx.name, ctx.type, ctx.attrs, ctx.input_shapes,
                            ctx.output_shapes, reason)


def opaque_semantics(name: str, op_type: str, attrs: Mapping[str, Any],
                     input_shapes: Sequence[Sequence[int]],
                     output_shapes: Sequence[Sequence[int]], reason: str) -> Semantics:
    """The description of an op kept whole: no strategies, every output whole."""
    return Semantics(name, op_type, tuple(map(tuple, input_shapes)),
                     tuple(map(tuple, output_shapes)), (None,) * len(output_shapes),
                     frozenset(), reason, attrs, len(output_shapes))


def describe_op(graph, op) -> Semantics:
    """Semantics of a planner-graph op (constants taken from the graph)."""
    ins = graph.input_tensors(op)
    outs = graph.output_tensors(op)
    constants = {i: graph.constants[t] for i, t in enumerate(op.inputs)
                 if t in graph.constants}
    return describe(op.name, op.type, op.attrs, [t.shape for t in ins],
                    [t.dtype for t in ins], [t.shape for t in outs],
                    [t.dtype for t in outs], constants)


_SCALARS = frozenset({int, float, str, bool, bytes, type(None)})


def freeze(value: Any) -> Any:
    """A hashable stand-in for attrs and constants (arrays by shape, dtype and bytes)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is tuple or kind is list:
        return tuple(v if type(v) in _SCALARS else freeze(v) for v in value)
    if kind is dict or kind is MappingProxyType:
        return tuple(sorted((k, v if type(v) in _SCALARS else freeze(v))
                            for k, v in value.items()))
    if isinstance(value, np.ndarray):
        return ("ndarray", value.shape, value.dtype.str, value.tobytes())
    if isinstance(value, Mapping):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


# Attrs that name a resource rather than shape the computation.
NAMING_ATTRS = frozenset({"shared_name", "container", "debug_name"})


def signature(op_type: str, attrs: Mapping[str, Any], input_shapes, input_dtypes,
              output_shapes, output_dtypes, constants) -> tuple:
    """Two ops with equal signatures have the same semantics up to their names."""
    shaping = {k: v for k, v in attrs.items() if k not in NAMING_ATTRS}
    return (op_type, freeze(shaping), freeze(input_shapes), tuple(input_dtypes),
            freeze(output_shapes), tuple(output_dtypes), freeze(constants or {}))
