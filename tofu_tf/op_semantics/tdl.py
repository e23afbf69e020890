"""TDL: op semantics as lambdas over output coordinates.

A description computes one output element from input elements:

    ctx.compute(lambda i, j: Sum(lambda k: A[i, k] * B[k, j]))

- Index variables are the lambda's parameters; their extents are the output's shape.
  Reduction variables (`Sum(lambda k: ...)`) get their extent from a direct use as an
  index (`A[i, k]`), or from `extents=`.
- Element access `T[e0, e1, ...]` takes one index expression per dimension: affine in the
  index variables (`h * 2 + kh - 1`), floor-divided or taken modulo a constant, or a value
  read from another tensor (data-dependent, e.g. a gather index).
- Arithmetic (`+ - * / // % **`, comparisons), named element-wise functions (`Fn("exp",
  x)`), `where(c, a, b)`, reductions `Sum Mean Max Min Prod`, and `Opaque(name, ...)` for
  what TDL cannot express; `Window(lambda a, b: ...)` binds variables that an opaque
  function ranges over without reducing.
- `T.T`, `T.transpose(perm)` are views; `T.padded(fill)` makes out-of-range reads give
  `fill` (convolution zero padding, -inf for max pooling).

Descriptions are checked when they are built (`OpContext.compute`): arity, ranks, scoping
of reduction variables, extents, constant indices in range. A malformed description is a
`DescriptionError` naming the op, never a wrong strategy later.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tofu_tf.errors import DescriptionError

SPLITTABLE_REDUCERS = ("sum", "mean", "max", "min", "prod")
INDEX_FUNCTIONS = ("add", "sub", "neg", "mul", "floordiv", "mod", "min", "max")


class Expr:
    """A TDL expression; operators build larger expressions."""

    def __add__(self, o): return Apply("add", (self, wrap(o)))
    def __radd__(self, o): return Apply("add", (wrap(o), self))
    def __sub__(self, o): return Apply("sub", (self, wrap(o)))
    def __rsub__(self, o): return Apply("sub", (wrap(o), self))
    def __mul__(self, o): return Apply("mul", (self, wrap(o)))
    def __rmul__(self, o): return Apply("mul", (wrap(o), self))
    def __truediv__(self, o): return Apply("div", (self, wrap(o)))
    def __rtruediv__(self, o): return Apply("div", (wrap(o), self))
    def __floordiv__(self, o): return Apply("floordiv", (self, wrap(o)))
    def __mod__(self, o): return Apply("mod", (self, wrap(o)))
    def __pow__(self, o): return Apply("pow", (self, wrap(o)))
    def __neg__(self): return Apply("neg", (self,))
    def __lt__(self, o): return Apply("lt", (self, wrap(o)))
    def __le__(self, o): return Apply("le", (self, wrap(o)))
    def __gt__(self, o): return Apply("gt", (self, wrap(o)))
    def __ge__(self, o): return Apply("ge", (self, wrap(o)))
    __hash__ = object.__hash__


class Var(Expr):
    """An index variable: an output coordinate, or bound by a reduction or window."""

    def __init__(self, name: str, extent: int | None, kind: str):
        self.name, self.extent, self.kind = name, extent, kind

    def __repr__(self) -> str:
        return self.name


class Const(Expr):
    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


class Access(Expr):
    """Element `indices` of op input `input_index`, indices in the input's own dim order."""

    def __init__(self, ref: "TensorRef", indices: tuple[Expr, ...]):
        self.ref, self.indices = ref, indices

    @property
    def input_index(self) -> int:
        return self.ref.input_index

    def __repr__(self) -> str:
        return f"in{self.input_index}[{', '.join(map(repr, self.indices))}]"


class Apply(Expr):
    """A named function of its arguments (arithmetic, element-wise math, opaque)."""

    def __init__(self, fn: str, args: tuple[Expr, ...]):
        self.fn, self.args = fn, args

    def __repr__(self) -> str:
        return f"{self.fn}({', '.join(map(repr, self.args))})"


class Reduce(Expr):
    """A reduction (or, with reducer 'window', a non-reducing binding) over `vars`."""

    def __init__(self, reducer: str, vars: tuple[Var, ...], body: Expr):
        self.reducer, self.vars, self.body = reducer, vars, body

    def __repr__(self) -> str:
        return f"{self.reducer.capitalize()}({', '.join(v.name for v in self.vars)}: {self.body!r})"


def wrap(x: Any) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, (bool, int, float, np.integer, np.floating)):
        return Const(x.item() if isinstance(x, np.generic) else x)
    raise DescriptionError(f"{x!r} of type {type(x).__name__} is not a TDL expression.")


def _lambda_params(fn: Callable) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as err:
        raise DescriptionError(f"cannot read the parameters of {fn!r}: {err}") from None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        raise DescriptionError("a TDL lambda needs named parameters, not *args; "
                               "use ctx.compute_nd(fn, rank) for rank-generic bodies.")
    return [p.name for p in params]


def _bind(reducer: str, fn: Callable, extents: Sequence[int] | None, names=None) -> Reduce:
    names = list(names) if names is not None else _lambda_params(fn)
    if extents is not None and len(extents) != len(names):
        raise DescriptionError(f"{reducer}: {len(names)} variables but {len(extents)} extents.")
    vars = tuple(Var(n, None if extents is None else int(extents[i]), "reduce")
                 for i, n in enumerate(names))
    return Reduce(reducer, vars, wrap(fn(*vars)))


def Sum(fn: Callable, extents: Sequence[int] | None = None) -> Reduce:
    return _bind("sum", fn, extents)


def Mean(fn: Callable, extents: Sequence[int] | None = None) -> Reduce:
    return _bind("mean", fn, extents)


def Max(fn: Callable, extents: Sequence[int] | None = None) -> Reduce:
    return _bind("max", fn, extents)


def Min(fn: Callable, extents: Sequence[int] | None = None) -> Reduce:
    return _bind("min", fn, extents)


def Prod(fn: Callable, extents: Sequence[int] | None = None) -> Reduce:
    return _bind("prod", fn, extents)


def ReduceN(reducer: str, fn: Callable, extents: Sequence[int],
            names: Sequence[str] | None = None) -> Reduce:
    """A reduction over len(extents) variables named `names` (default r0, r1, ...);
    `fn` receives them as positional arguments. For rank-generic descriptions."""
    names = list(names) if names is not None else [f"r{i}" for i in range(len(extents))]
    return _bind(reducer, fn, extents, names)


def Window(fn: Callable, extents: Sequence[int] | None = None) -> Reduce:
    """Bind variables an opaque function ranges over (never split, never reduced)."""
    return _bind("window", fn, extents)


def Fn(name: str, *args: Any) -> Apply:
    """A named element-wise function (exp, tanh, cast ...); only its inputs matter."""
    return Apply(name, tuple(wrap(a) for a in args))


def Opaque(name: str, *args: Any) -> Apply:
    """What TDL cannot express: a function of exactly these elements."""
    return Apply("opaque." + name, tuple(wrap(a) for a in args))


def where(cond: Any, a: Any, b: Any) -> Apply:
    return Apply("where", (wrap(cond), wrap(a), wrap(b)))


def Eq(a: Any, b: Any) -> Apply:
    return Apply("eq", (wrap(a), wrap(b)))


def Minimum(a: Any, b: Any) -> Apply:
    return Apply("min", (wrap(a), wrap(b)))


def Maximum(a: Any, b: Any) -> Apply:
    return Apply("max", (wrap(a), wrap(b)))


@dataclass(frozen=True)
class TensorRef:
    """A description's view of one op input: its shape, a dim permutation and a fill."""
    input_index: int
    base_shape: tuple[int, ...]
    dtype: str
    perm: tuple[int, ...] | None = None
    fill: float | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        if self.perm is None:
            return self.base_shape
        return tuple(self.base_shape[p] for p in self.perm)

    @property
    def rank(self) -> int:
        return len(self.base_shape)

    @property
    def T(self) -> "TensorRef":
        if self.rank != 2:
            raise DescriptionError(f".T needs a rank-2 tensor, input {self.input_index} has "
                                   f"rank {self.rank}; use .transpose(perm).")
        return self.transpose((1, 0))

    def transpose(self, perm: Sequence[int]) -> "TensorRef":
        perm = tuple(int(p) for p in perm)
        if sorted(perm) != list(range(self.rank)):
            raise DescriptionError(f"{perm} is not a permutation of {self.rank} dims.")
        base = self.perm or tuple(range(self.rank))
        return TensorRef(self.input_index, self.base_shape, self.dtype,
                         tuple(base[p] for p in perm), self.fill)

    def padded(self, fill: float) -> "TensorRef":
        return TensorRef(self.input_index, self.base_shape, self.dtype, self.perm, float(fill))

    def __getitem__(self, index: Any) -> Access:
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != self.rank:
            raise DescriptionError(f"input {self.input_index} has rank {self.rank} "
                                   f"(shape {list(self.shape)}) but is indexed with "
                                   f"{len(index)} indices.")
        exprs = [wrap(i) for i in index]
        if self.perm is not None:
            base = [None] * self.rank
            for view_dim, base_dim in enumerate(self.perm):
                base[base_dim] = exprs[view_dim]
            exprs = base
        return Access(self, tuple(exprs))

    def __iter__(self):
        raise DescriptionError("a TensorRef is not iterable; index it with T[i, j].")


@dataclass(frozen=True)
class Compute:
    """One output of an op: `body` over index `vars` (one per output dim).

    `alias` names the input that the op writes in place (variable updates); the output
    is then the new value of that input.
    """
    output: int
    vars: tuple[Var, ...]
    body: Expr
    alias: int | None = None

    @property
    def var_names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.vars)


def is_index_expr(expr: Expr) -> bool:
    """True for expressions built from index variables and integer constants only."""
    if isinstance(expr, Var):
        return True
    if isinstance(expr, Const):
        return isinstance(expr.value, (int, np.integer)) and not isinstance(expr.value, bool)
    if isinstance(expr, Apply) and expr.fn in INDEX_FUNCTIONS:
        return all(is_index_expr(a) for a in expr.args)
    return False


def check_compute(compute: Compute, shape: tuple[int, ...], where: str) -> None:
    """Validate a finished Compute; raises DescriptionError naming `where`."""
    _Checker(where).check(compute.body, {id(v): v for v in compute.vars})


class _Checker:
    def __init__(self, where: str):
        self.where = where

    def fail(self, message: str) -> None:
        raise DescriptionError(message, node=self.where)

    def check(self, expr: Expr, scope: dict[int, Var]) -> None:
        if isinstance(expr, Var):
            if id(expr) not in scope:
                self.fail(f"index variable '{expr.name}' is used outside the lambda or "
                          "reduction that binds it.")
        elif isinstance(expr, Access):
            self._check_access(expr, scope)
        elif isinstance(expr, Apply):
            for a in expr.args:
                self.check(a, scope)
        elif isinstance(expr, Reduce):
            self._check_reduce(expr, scope)
        elif not isinstance(expr, Const):
            self.fail(f"{expr!r} is not a TDL expression.")

    def _check_access(self, access: Access, scope: dict[int, Var]) -> None:
        shape = access.ref.base_shape
        for dim, index in enumerate(access.indices):
            self.check(index, scope)
            if isinstance(index, Const):
                value = index.value
                if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                    self.fail(f"index {value!r} into input {access.input_index} is not an "
                              "integer.")
                if access.ref.fill is None and not 0 <= value < shape[dim]:
                    self.fail(f"constant index {value} is out of range for dim {dim} of "
                              f"input {access.input_index} (size {shape[dim]}).")

    def _check_reduce(self, reduce: Reduce, scope: dict[int, Var]) -> None:
        names = {v.name for v in scope.values()}
        for v in reduce.vars:
            if v.name in names:
                self.fail(f"reduction variable '{v.name}' shadows an enclosing variable.")
        inner = dict(scope)
        inner.update({id(v): v for v in reduce.vars})
        for v in reduce.vars:
            if v.extent is None:
                v.extent = self._infer_extent(v, reduce.body)
            if int(v.extent) <= 0:
                self.fail(f"reduction variable '{v.name}' has extent {v.extent}.")
        self.check(reduce.body, inner)

    def _infer_extent(self, var: Var, body: Expr) -> int:
        sizes = {access.ref.base_shape[dim] for access in iter_accesses(body)
                 for dim, index in enumerate(access.indices) if index is var}
        if not sizes:
            self.fail(f"the extent of reduction variable '{var.name}' cannot be inferred: "
                      "it is never a plain index; pass extents=(...).")
        if len(sizes) > 1:
            self.fail(f"reduction variable '{var.name}' indexes dims of different sizes "
                      f"{sorted(sizes)}.")
        return sizes.pop()


def iter_accesses(expr: Expr):
    """Every Access in `expr`, including those inside index expressions."""
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Access):
            yield e
            stack.extend(e.indices)
        elif isinstance(e, Apply):
            stack.extend(e.args)
        elif isinstance(e, Reduce):
            stack.append(e.body)
