"""Symbolic intervals are sound: brute force over random index expressions."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tofu_tf.op_semantics.analysis import index_interval, part_range
from tofu_tf.op_semantics.intervals import TOP, Bound, Interval
from tofu_tf.op_semantics.tdl import Apply, Const, Var


def _expressions(vars_):
    """Random index expressions over vars_: + - *c //c %c, nested."""
    leaf = st.sampled_from(vars_) | st.integers(-4, 4).map(Const)

    def extend(children):
        const = st.integers(-3, 3).filter(lambda c: c != 0).map(Const)
        positive = st.integers(1, 4).map(Const)
        return st.one_of(
            st.tuples(children, children).map(lambda ab: Apply("add", ab)),
            st.tuples(children, children).map(lambda ab: Apply("sub", ab)),
            st.tuples(children, const).map(lambda ab: Apply("mul", ab)),
            st.tuples(children, positive).map(lambda ab: Apply("floordiv", ab)),
            st.tuples(children, positive).map(lambda ab: Apply("mod", ab)),
            children.map(lambda a: Apply("neg", (a,))),
        )
    return st.recursive(leaf, extend, max_leaves=6)


def _value(expr, env):
    if isinstance(expr, Var):
        return env[expr.name]
    if isinstance(expr, Const):
        return expr.value
    a = [_value(x, env) for x in expr.args]
    return {"add": lambda: a[0] + a[1], "sub": lambda: a[0] - a[1],
            "mul": lambda: a[0] * a[1], "floordiv": lambda: a[0] // a[1],
            "mod": lambda: a[0] % a[1], "neg": lambda: -a[0]}[expr.fn]()


H, KH = Var("h", 11, "output"), Var("kh", 3, "reduce")


@settings(max_examples=300, deadline=None)
@given(expr=_expressions([H, KH]), k=st.integers(2, 5), part=st.integers(0, 4))
def test_interval_contains_every_value(expr, k, part):
    part = part % k
    lo, hi = part_range(H.extent, k, part)
    env = {id(H): Interval.symbolic(), id(KH): Interval.range(0, KH.extent - 1)}
    interval = index_interval(expr, env)
    values = [_value(expr, {"h": h, "kh": kh})
              for h in range(lo, hi + 1) for kh in range(KH.extent)]
    if interval.is_top:
        return
    first, last = interval.evaluate({"lo": lo, "hi": hi})
    assert first <= min(values) and last >= max(values), (expr, first, last, values)


@pytest.mark.parametrize("stride,dilation,pad", [(1, 1, 1), (2, 1, 1), (1, 2, 2), (2, 2, 0)])
def test_convolution_access_is_exact(stride, dilation, pad):
    expr = H * stride + KH * dilation - pad
    env = {id(H): Interval.symbolic(), id(KH): Interval.range(0, KH.extent - 1)}
    interval = index_interval(expr, env)
    for k in (2, 3, 4):
        for p in range(k):
            lo, hi = part_range(11, k, p)
            values = [h * stride + kh * dilation - pad for h in range(lo, hi + 1)
                      for kh in range(3)]
            assert interval.evaluate({"lo": lo, "hi": hi}) == (min(values), max(values))


def test_part_range_is_the_uneven_split():
    for n, k in itertools.product(range(3, 20), range(2, 8)):
        if k > n:
            continue
        parts = [part_range(n, k, p) for p in range(k)]
        sizes = [b - a + 1 for a, b in parts]
        assert parts[0][0] == 0 and parts[-1][1] == n - 1
        assert all(parts[i][1] + 1 == parts[i + 1][0] for i in range(k - 1))
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_hull_of_incomparable_bounds_is_top():
    a = Interval.symbolic()
    b = Interval.range(3, 5)
    assert a.hull(b) is TOP or a.hull(b).is_top
    assert (a + Interval.point(1)).hull(a - Interval.point(1)) == Interval(
        Bound((("lo", 1),), -1), Bound((("hi", 1),), 1))


def test_floor_bounds_print_and_evaluate():
    b = Interval.symbolic().scale(3).floordiv(2)
    assert str(b.lo) == "floor((3*lo)/2)"
    assert b.evaluate({"lo": 3, "hi": 5}) == (4, 7)
    assert np.all([Interval.point(v).mod(4).constant_value() == v % 4 for v in range(-5, 9)])
