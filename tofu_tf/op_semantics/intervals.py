"""Symbolic integer intervals for region analysis.

A `Bound` is `floor(N / den)` where N is an affine form over symbols (here the first and
last index `lo`, `hi` of one part of a split variable) and den >= 1. An `Interval` is a
pair of bounds, inclusive, or `TOP` (nothing is known: the whole range).

Every operation is sound: the result contains every value the operands can produce. Where
an exact result is not an affine floor-form, a looser one is taken:

    c * floor(A/d) >= floor(c*(A - d + 1) / d)      (c > 0, lower side)
    c * floor(A/d) <= floor(c*A / d)                 (c > 0, upper side)
    floor(A/d1) + floor(B/d2) in [floor((A*d2 + B*d1 - (d1-1)*d2 - (d2-1)*d1) / (d1*d2)),
                                  floor((A*d2 + B*d1) / (d1*d2))]
    floor(floor(A/d) / s) = floor(A / (d*s))         (exact)
    x mod m in [0, m-1]                              (exact when x's range does not wrap)

When two bounds cannot be ordered (the hull of `lo + 1` and `3`), the dimension becomes
TOP, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

Affine = tuple[tuple[tuple[str, int], ...], int]   # ((symbol, coefficient), ...), constant


def _affine(coefs: Mapping[str, int], const: int) -> Affine:
    return tuple(sorted((s, c) for s, c in coefs.items() if c != 0)), const


@dataclass(frozen=True)
class Bound:
    """floor((sum(coef * symbol) + const) / den), with den >= 1."""
    coefs: tuple[tuple[str, int], ...] = ()
    const: int = 0
    den: int = 1

    @staticmethod
    def of(value: int) -> "Bound":
        value = int(value)
        found = _CONSTANTS.get(value)
        if found is None:
            found = Bound((), value, 1)
            if len(_CONSTANTS) < _INTERNED:
                _CONSTANTS[value] = found
        return found

    @staticmethod
    def symbol(name: str) -> "Bound":
        return Bound(((name, 1),), 0, 1)

    @property
    def is_constant(self) -> bool:
        return not self.coefs

    def evaluate(self, env: Mapping[str, int]) -> int:
        total = self.const
        for symbol, coef in self.coefs:
            total += coef * env[symbol]
        return total // self.den

    def _numerator(self) -> dict[str, int]:
        return dict(self.coefs)

    def comparable(self, other: "Bound") -> bool:
        """True when self - other is a known constant for every symbol value."""
        return self.coefs == other.coefs and self.den == other.den

    def __str__(self) -> str:
        terms = [f"{'' if c == 1 else ('-' if c == -1 else str(c) + '*')}{s}"
                 for s, c in self.coefs]
        if self.const or not terms:
            terms.append(str(self.const))
        text = " + ".join(terms).replace("+ -", "- ")
        return text if self.den == 1 else f"floor(({text})/{self.den})"


# Constant bounds (tensor sizes, offsets) recur by the thousand in an analysis: each value
# is made once (bounds are immutable), up to this many values.
_INTERNED = 1 << 16
_CONSTANTS: dict[int, Bound] = {}


def _make(coefs: Mapping[str, int], const: int, den: int) -> Bound:
    coefs_t, const = _affine(coefs, const)
    if not coefs_t:
        return Bound.of(const // den)
    return Bound(coefs_t, const, den)


def _scaled(coefs: Mapping[str, int], factor: int) -> dict[str, int]:
    return {s: c * factor for s, c in coefs.items()}


def _sum(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for s, c in b.items():
        out[s] = out.get(s, 0) + c
    return out


def add_bounds(a: Bound, b: Bound, *, upper: bool) -> Bound:
    """A bound on a + b: exact when either denominator is 1, else the side's relaxation."""
    if a.den == 1 and b.den == 1 and not (a.coefs and b.coefs):   # the common cases
        coefs = a.coefs or b.coefs        # already sorted, without zeros
        return Bound(coefs, a.const + b.const, 1) if coefs else Bound.of(a.const + b.const)
    if b.den == 1:
        return _make(_sum(a._numerator(), _scaled(b._numerator(), a.den)),
                     a.const + b.const * a.den, a.den)
    if a.den == 1:
        return add_bounds(b, a, upper=upper)
    num = _sum(_scaled(a._numerator(), b.den), _scaled(b._numerator(), a.den))
    const = a.const * b.den + b.const * a.den
    if not upper:
        const -= (a.den - 1) * b.den + (b.den - 1) * a.den
    return _make(num, const, a.den * b.den)


def mul_bound(a: Bound, c: int, *, upper: bool) -> Bound:
    """A bound on c * a, for the lower (upper=False) or upper side of the product."""
    if a.den == 1:
        if not a.coefs:
            return Bound.of(a.const * c)
        return _make(_scaled(a._numerator(), c), a.const * c, 1)
    # c*floor(A/d) lies in [c*(A-d+1)/d, c*A/d] for c > 0, reversed for c < 0.
    loose = (c > 0) != upper
    const = a.const - (a.den - 1) if loose else a.const
    return _make(_scaled(a._numerator(), c), const * c, a.den)


def floordiv_bound(a: Bound, s: int) -> Bound:
    return _make(a._numerator(), a.const, a.den * s)


def min_bound(a: Bound, b: Bound) -> Bound | None:
    if a.is_constant and b.is_constant:
        return a if a.const <= b.const else b
    if a.comparable(b):
        return a if a.const <= b.const else b
    return None


def max_bound(a: Bound, b: Bound) -> Bound | None:
    if a.is_constant and b.is_constant:
        return a if a.const >= b.const else b
    if a.comparable(b):
        return a if a.const >= b.const else b
    return None


@dataclass(frozen=True)
class Interval:
    """The inclusive range [lo, hi] of an integer expression, or TOP when unknown."""
    lo: Bound | None
    hi: Bound | None

    @staticmethod
    def point(value: int) -> "Interval":
        return Interval.range(value, value)

    @staticmethod
    def range(first: int, last: int) -> "Interval":
        key = (first, last)
        found = _RANGES.get(key)
        if found is None:
            found = Interval(Bound.of(first), Bound.of(last))
            if len(_RANGES) < _INTERNED:
                _RANGES[key] = found
        return found

    @staticmethod
    def symbolic(lo: str = "lo", hi: str = "hi") -> "Interval":
        return Interval(Bound.symbol(lo), Bound.symbol(hi))

    @property
    def is_top(self) -> bool:
        return self.lo is None or self.hi is None

    @property
    def is_constant(self) -> bool:
        return not self.is_top and self.lo.is_constant and self.hi.is_constant

    def constant_value(self) -> int | None:
        if self.is_constant and self.lo.const == self.hi.const:
            return self.lo.const
        return None

    def __add__(self, other: "Interval") -> "Interval":
        if self.is_top or other.is_top:
            return TOP
        return Interval(add_bounds(self.lo, other.lo, upper=False),
                        add_bounds(self.hi, other.hi, upper=True))

    def scale(self, c: int) -> "Interval":
        if self.is_top:
            return TOP
        if c >= 0:
            return Interval(mul_bound(self.lo, c, upper=False), mul_bound(self.hi, c, upper=True))
        return Interval(mul_bound(self.hi, c, upper=False), mul_bound(self.lo, c, upper=True))

    def __neg__(self) -> "Interval":
        return self.scale(-1)

    def __sub__(self, other: "Interval") -> "Interval":
        return self + (-other)

    def __mul__(self, other: "Interval") -> "Interval":
        c = other.constant_value()
        if c is not None:
            return self.scale(c)
        c = self.constant_value()
        if c is not None:
            return other.scale(c)
        return TOP

    def floordiv(self, s: int) -> "Interval":
        if self.is_top or s <= 0:
            return TOP
        return Interval(floordiv_bound(self.lo, s), floordiv_bound(self.hi, s))

    def mod(self, m: int) -> "Interval":
        if m <= 0:
            return TOP
        if self.is_constant:
            lo, hi = self.lo.const, self.hi.const
            if lo // m == hi // m:
                return Interval.range(lo % m, hi % m)
        return Interval.range(0, m - 1)

    def hull(self, other: "Interval") -> "Interval":
        if self.is_top or other.is_top:
            return TOP
        lo, hi = min_bound(self.lo, other.lo), max_bound(self.hi, other.hi)
        if lo is None or hi is None:
            return TOP
        return Interval(lo, hi)

    def minimum(self, other: "Interval") -> "Interval":
        if self.is_top or other.is_top:
            return TOP
        lo, hi = min_bound(self.lo, other.lo), min_bound(self.hi, other.hi)
        return TOP if lo is None or hi is None else Interval(lo, hi)

    def maximum(self, other: "Interval") -> "Interval":
        if self.is_top or other.is_top:
            return TOP
        lo, hi = max_bound(self.lo, other.lo), max_bound(self.hi, other.hi)
        return TOP if lo is None or hi is None else Interval(lo, hi)

    def evaluate(self, env: Mapping[str, int]) -> tuple[int, int]:
        """Concrete [first, last] for given symbol values (raises on TOP)."""
        if self.is_top:
            raise ValueError("TOP has no concrete value")
        return self.lo.evaluate(env), self.hi.evaluate(env)

    def __str__(self) -> str:
        return "TOP" if self.is_top else f"[{self.lo}, {self.hi}]"


TOP = Interval(None, None)
_RANGES: dict[tuple[int, int], Interval] = {}      # constant intervals, made once each
