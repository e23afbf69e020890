"""Partition strategies of an op, derived from its TDL description.

For each candidate variable v of an op — every output index variable, and every variable
of a top-level reduction (`Sum`, `Mean`, `Max`, `Min`, `Prod`, possibly scaled) — the
description is evaluated over intervals: v ranges over one part [lo, hi] (kept symbolic),
every other variable over its full extent. Each input access yields, per input dim, an
interval affine in lo and hi (`intervals.py`); the hull over all accesses of an input is
the region a part needs. Splitting:

- an output variable: each output holding it is Split on that dim; an output without it
  is computed whole on every part (Replicated).
- a reduction variable: the outputs it reduces are Partial (combine with the reducer);
  other outputs are computed whole.
- a name that is an output variable of one output and a top-level reduction variable of
  another (same extent) splits both jointly, as one strategy: Split where it indexes,
  Partial where it is reduced (dx and d_scale of an inference batch-norm gradient).

Sound by construction: an index the intervals cannot bound gives the whole dim. A part of
a k-way split of extent n is the usual uneven split: the first n % k parts get one more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from tofu_tf.errors import PartitionError
from tofu_tf.op_semantics.intervals import TOP, Interval
from tofu_tf.op_semantics.registry import Semantics
from tofu_tf.op_semantics.tdl import (INDEX_FUNCTIONS, SPLITTABLE_REDUCERS, Access, Apply,
                                      Compute, Const, Expr, Reduce, Var)

LO, HI = "lo", "hi"


def part_range(extent: int, k: int, part: int) -> tuple[int, int]:
    """Inclusive [first, last] of part `part` of an extent split k ways (uneven allowed)."""
    if not 0 <= part < k:
        raise PartitionError(f"part {part} of a {k}-way split does not exist.")
    base, extra = divmod(extent, k)
    first = part * base + min(part, extra)
    return first, first + base + (1 if part < extra else 0) - 1


@dataclass(frozen=True)
class OutputState:
    """How an output is held after the op: Split on a dim, Replicated, or Partial. A
    stored Split may be `gathered` (the search's G(d), search/cost.py): stored as Split
    on dim, assembled whole on every part once for the ops that read it."""
    kind: str                    # "split" | "replicated" | "partial"
    dim: int | None = None
    reducer: str | None = None
    gathered: bool = False

    def __str__(self) -> str:
        if self.kind == "split":
            return f"G({self.dim})" if self.gathered else f"S({self.dim})"
        if self.kind == "partial":
            return f"P({self.reducer})"
        return "R"


def Split(dim: int) -> OutputState:
    return OutputState("split", dim=dim)


def Partial(reducer: str) -> OutputState:
    return OutputState("partial", reducer=reducer)


REPLICATED = OutputState("replicated")


def clamp_slices(requested: tuple[tuple[int, int], ...], shape: tuple[int, ...]
                 ) -> tuple[tuple[int, int], ...]:
    """Half-open `requested` slices clamped to [0, n) per dim (may be empty, never inverted)."""
    out = []
    for (a, b), size in zip(requested, shape):   # min/max by comparisons: a hot loop
        start = 0 if a < 0 else (size if a > size else a)
        stop = size if b > size else b
        out.append((start, start if stop < start else stop))
    return tuple(out)


@dataclass(frozen=True)
class InputRegion:
    """What one part needs of one input.

    kind "data": `dims` gives, per dim, an inclusive interval in the part's [lo, hi]
    (TOP: the whole dim); out-of-range reads give `fill`. kind "meta": a constant read
    for its value (a shape, an axis), recreated on each device. kind "unused": not read.
    """
    kind: str
    dims: tuple[Interval, ...] = ()
    fill: float | None = None

    def requested(self, lo: int, hi: int, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
        """Half-open [start, stop) per dim, before clamping to the tensor. (Each bound is
        affine in lo and hi: evaluated inline, the hottest loop of building choices.)"""
        out = []
        for interval, size in zip(self.dims, shape):
            first, last = interval.lo, interval.hi
            if first is None or last is None:
                out.append((0, size))
                continue
            a = first.const
            for symbol, coef in first.coefs:
                a += coef * (lo if symbol == LO else hi)
            b = last.const
            for symbol, coef in last.coefs:
                b += coef * (lo if symbol == LO else hi)
            out.append((a // first.den, b // last.den + 1))
        return tuple(out)

    def slices(self, lo: int, hi: int, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
        """Half-open [start, stop) per dim, clamped to the tensor (may be empty)."""
        return clamp_slices(self.requested(lo, hi, shape), shape)

    def dim_label(self, dim: int, size: int) -> str:
        interval = self.dims[dim]
        if interval.is_top:
            return "*"
        if interval.is_constant:
            first, last = interval.lo.const, interval.hi.const
            return "*" if first <= 0 and last >= size - 1 else f"[{first}:{last + 1}]"
        lo, hi = interval.lo, interval.hi
        if (lo.coefs == ((LO, 1),) and hi.coefs == ((HI, 1),) and lo.den == hi.den == 1):
            if lo.const == 0 and hi.const == 0:
                return "S"
            return f"S{lo.const:+d}{hi.const:+d}"
        return f"[{lo}..{hi}]"

    def label(self, shape: tuple[int, ...]) -> str:
        if self.kind != "data":
            return self.kind
        return "(" + ",".join(self.dim_label(d, s) for d, s in enumerate(shape)) + ")"


@dataclass(frozen=True)
class Strategy:
    """Split one variable of an op k ways: what each part needs and what it produces."""
    var: str
    kind: str                            # "output" | "reduce"
    extent: int
    inputs: tuple[InputRegion, ...]
    outputs: tuple[OutputState, ...]
    input_shapes: tuple[tuple[int, ...], ...]

    @property
    def label(self) -> str:
        """How plans name it: 'o:i' (split output index i), 'r:k' (reduction index k)."""
        return f"{self.kind[0]}:{self.var}"

    def valid_for(self, k: int) -> bool:
        return 2 <= k <= self.extent

    def part(self, k: int, part: int) -> tuple[int, int]:
        return part_range(self.extent, k, part)

    def input_slices(self, index: int, k: int, part: int) -> tuple[tuple[int, int], ...] | None:
        """Clamped half-open slices of input `index` that part `part` needs (None: no data)."""
        region = self.inputs[index]
        if region.kind != "data":
            return None
        return region.slices(*self.part(k, part), self.input_shapes[index])

    def __str__(self) -> str:
        ins = " ".join(r.label(s) for r, s in zip(self.inputs, self.input_shapes))
        outs = " ".join(str(o) for o in self.outputs)
        return f"{self.label} in {ins} -> {outs}"


# -- evaluation over intervals ------------------------------------------------------


def index_interval(expr: Expr, env: dict[int, Interval]) -> Interval:
    """The interval of an index expression; TOP when it is not affine-like."""
    if isinstance(expr, Var):
        return env.get(id(expr), TOP)
    if isinstance(expr, Const):
        value = expr.value
        return Interval.point(int(value)) if isinstance(value, int) else TOP
    if not (isinstance(expr, Apply) and expr.fn in INDEX_FUNCTIONS):
        return TOP
    args = [index_interval(a, env) for a in expr.args]
    if expr.fn == "add":
        return args[0] + args[1]
    if expr.fn == "sub":
        return args[0] - args[1]
    if expr.fn == "neg":
        return -args[0]
    if expr.fn == "mul":
        return args[0] * args[1]
    if expr.fn == "min":
        return args[0].minimum(args[1])
    if expr.fn == "max":
        return args[0].maximum(args[1])
    divisor = args[1].constant_value()
    if divisor is None or divisor <= 0:
        return TOP
    return args[0].floordiv(divisor) if expr.fn == "floordiv" else args[0].mod(divisor)


class _RegionCollector:
    """Hulls of every access per input, as the body is walked."""

    def __init__(self, n_inputs: int):
        self.hulls: list[list[Interval] | None] = [None] * n_inputs
        self.fills: list[float | None] = [None] * n_inputs

    def walk(self, expr: Expr, env: dict[int, Interval]) -> None:
        if isinstance(expr, Access):
            self._add(expr, [index_interval(ix, env) for ix in expr.indices])
            for ix in expr.indices:
                self.walk(ix, env)
        elif isinstance(expr, Apply):
            for arg in expr.args:
                self.walk(arg, env)
        elif isinstance(expr, Reduce):
            inner = dict(env)
            for v in expr.vars:
                inner.setdefault(id(v), Interval.range(0, v.extent - 1))
            self.walk(expr.body, inner)

    def _add(self, access: Access, intervals: list[Interval]) -> None:
        i = access.input_index
        if access.ref.fill is not None:
            self.fills[i] = access.ref.fill
        current = self.hulls[i]
        self.hulls[i] = intervals if current is None else [
            a.hull(b) for a, b in zip(current, intervals)]


def _full_env(compute: Compute) -> dict[int, Interval]:
    return {id(v): Interval.range(0, v.extent - 1) for v in compute.vars}


def top_reduce(expr: Expr) -> Reduce | None:
    """The reduction an output is linear in (through scaling and negation), if any."""
    if isinstance(expr, Reduce):
        return expr if expr.reducer in SPLITTABLE_REDUCERS else None
    if isinstance(expr, Apply):
        if expr.fn == "neg":
            inner = top_reduce(expr.args[0])
        elif expr.fn == "mul":
            inner = top_reduce(expr.args[0]) or top_reduce(expr.args[1])
        elif expr.fn == "div":
            inner = top_reduce(expr.args[0])
        else:
            inner = None
        if inner is not None and inner.reducer in ("sum", "mean"):
            return inner
    return None


def _candidates(sem: Semantics) -> list[tuple[str, str, int]]:
    """(kind, var name, extent) for every output variable and top-level reduction var."""
    extents: dict[tuple[str, str], set[int]] = {}
    for c in sem.computes:
        if c is None:
            continue
        for v in c.vars:
            extents.setdefault(("output", v.name), set()).add(v.extent)
        red = top_reduce(c.body)
        if red is not None:
            for v in red.vars:
                extents.setdefault(("reduce", v.name), set()).add(v.extent)
    # A name shared with different extents cannot be split jointly: skip it (sound).
    # A reduction name that is also an output name is covered by the output strategy.
    joint = {name for (kind, name), e in extents.items()
             if kind == "reduce" and extents.get(("output", name)) == e}
    return [(kind, name, next(iter(e))) for (kind, name), e in extents.items()
            if len(e) == 1 and not (kind == "reduce" and name in joint)]


def _strategy(sem: Semantics, kind: str, name: str, extent: int) -> Strategy:
    collector = _RegionCollector(len(sem.input_shapes))
    symbolic = Interval.symbolic(LO, HI)
    states: list[OutputState] = []
    for out, compute in enumerate(sem.computes):
        if compute is None:
            raise PartitionError("an output has no description.", node=sem.op_name,
                                 op_type=sem.op_type)
        env = _full_env(compute)
        state = REPLICATED
        if kind == "output" and name in compute.var_names:
            dim = compute.var_names.index(name)
            env[id(compute.vars[dim])] = symbolic
            state = Split(dim)
        else:
            red = top_reduce(compute.body)
            bound = [v for v in (red.vars if red else ())
                     if v.name == name and v.extent == extent]
            if bound:
                env[id(bound[0])] = symbolic
                state = Partial(red.reducer)
        collector.walk(compute.body, env)
        states.append(state)
    return Strategy(name, kind, extent, _regions(sem, collector), tuple(states),
                    sem.input_shapes)


def _regions(sem: Semantics, collector: _RegionCollector) -> tuple[InputRegion, ...]:
    regions = []
    for i, hull in enumerate(collector.hulls):
        if i in sem.meta_inputs:
            regions.append(InputRegion("meta"))
        elif hull is None:
            regions.append(InputRegion("unused"))
        else:
            regions.append(InputRegion("data", tuple(hull), collector.fills[i]))
    return tuple(regions)


def analyze(sem: Semantics) -> tuple[Strategy, ...]:
    """Every strategy of one op instance (none for an opaque op or one without outputs)."""
    if sem.is_opaque or not sem.computes or any(c is None for c in sem.computes):
        return ()
    return tuple(_strategy(sem, kind, name, extent)
                 for kind, name, extent in _candidates(sem)
                 if extent >= 2 and name not in sem.unsplittable)


def named_strategy(sem: Semantics, label: str) -> Strategy | None:
    """The strategy `label` names ('o:i', 'r:k'), also where its variable's extent is 1,
    which `analyze` leaves out: a deeper level of an uneven split, whose smaller parts
    hold fewer elements than the cut has parts (the parts past the extent are empty)."""
    if sem.is_opaque or not sem.computes or any(c is None for c in sem.computes):
        return None
    for kind, name, extent in _candidates(sem):
        if f"{kind[0]}:{name}" == label and extent >= 1 and name not in sem.unsplittable:
            return _strategy(sem, kind, name, extent)
    return None


def replicated_regions(sem: Semantics) -> tuple[InputRegion, ...]:
    """What an unsplit copy of the op reads: the regions with every variable whole
    (walked once per Semantics and kept in its __dict__, which renamed copies share)."""
    cached = sem.__dict__.get("_replicated_regions")
    if cached is None:
        collector = _RegionCollector(len(sem.input_shapes))
        for compute in sem.computes:
            if compute is not None:
                collector.walk(compute.body, _full_env(compute))
        cached = sem.__dict__["_replicated_regions"] = _regions(sem, collector)
    return cached


def strategies_by_var(strategies: Iterable[Strategy]) -> dict[tuple[str, str], Strategy]:
    return {(s.kind, s.var): s for s in strategies}
