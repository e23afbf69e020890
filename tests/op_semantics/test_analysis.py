"""Derived strategies and regions for hand-checked cases."""

import pytest

from tofu_tf.op_semantics.analysis import analyze, part_range, strategies_by_var
from tofu_tf.op_semantics.localize import localize
from tofu_tf.op_semantics.registry import OpContext, describe
from tofu_tf.op_semantics.tdl import Mean, Sum


def _sem(build, ins, outs):
    ctx = OpContext("n", "Test", {}, ins, ["float32"] * len(ins), outs, ["float32"] * len(outs))
    build(ctx)
    return ctx.semantics()


def test_matmul_strategies():
    sem = describe("mm", "MatMul", {"transpose_b": True}, [(6, 8), (5, 8)],
                   ["float32"] * 2, [(6, 5)], ["float32"])
    s = strategies_by_var(analyze(sem))
    assert str(s["output", "i"]) == "o:i in (S,*) (*,*) -> S(0)"
    assert str(s["output", "j"]) == "o:j in (*,*) (S,*) -> S(1)"
    assert str(s["reduce", "k"]) == "r:k in (*,S) (*,S) -> P(sum)"
    assert s["reduce", "k"].input_slices(1, 3, 2) == ((0, 5), (6, 8))


def test_stencil_needs_a_halo_clamped_at_the_edges():
    def build(ctx):
        x = ctx.inputs[0]
        ctx.compute(lambda i: x.padded(0)[i - 1] + x.padded(0)[i] + x.padded(0)[i + 2])
    (strategy,) = analyze(_sem(build, [(10,)], [(10,)]))
    assert str(strategy) == "o:i in (S-1+2) -> S(0)"
    assert strategy.input_slices(0, 3, 0) == ((0, 6),)
    assert strategy.input_slices(0, 3, 1) == ((3, 9),)
    assert strategy.input_slices(0, 3, 2) == ((6, 10),)
    local = localize(_sem(build, [(10,)], [(10,)]), strategy, 3, 0)
    assert local.input_pads[0] == ((1, 0),)


def test_strided_access_scales_the_region():
    def build(ctx):
        x = ctx.inputs[0]
        ctx.compute(lambda i: Sum(lambda k: x[i * 2 + k], extents=(3,)))
    s = strategies_by_var(analyze(_sem(build, [(11,)], [(5,)])))
    assert s["output", "i"].input_slices(0, 2, 0) == ((0, 7),)      # i in [0, 2]
    assert s["output", "i"].input_slices(0, 2, 1) == ((6, 11),)     # i in [3, 4]
    assert str(s["reduce", "k"].outputs[0]) == "P(sum)"


def test_unbounded_index_means_whole_dimension():
    def build(ctx):
        params, ids = ctx.inputs
        ctx.compute(lambda i, j: params[ids[i], j])
    s = strategies_by_var(analyze(_sem(build, [(7, 4), (5,)], [(5, 4)])))
    assert s["output", "i"].input_slices(0, 2, 0) == ((0, 7), (0, 4))
    assert s["output", "i"].input_slices(1, 2, 0) == ((0, 3),)
    assert s["output", "j"].input_slices(0, 2, 1) == ((0, 7), (2, 4))


def test_nonlinear_use_of_a_reduction_is_not_partial():
    def build(ctx):
        x = ctx.inputs[0]
        ctx.compute(lambda i: Sum(lambda k: x[i, k]) + 1.0)
    strategies = analyze(_sem(build, [(4, 6)], [(4,)]))
    assert [(s.kind, s.var) for s in strategies] == [("output", "i")]


def test_mean_partial_scales_each_part_by_its_share():
    def build(ctx):
        x = ctx.inputs[0]
        ctx.compute(lambda i: Mean(lambda k: x[i, k]))
    sem = _sem(build, [(4, 7)], [(4,)])
    s = strategies_by_var(analyze(sem))["reduce", "k"]
    scales = [localize(sem, s, 3, p).output_scales[0] for p in range(3)]
    assert scales == pytest.approx([3 / 7, 2 / 7, 2 / 7])


def test_output_without_the_split_variable_is_replicated():
    def build(ctx):
        x = ctx.inputs[0]
        ctx.compute(lambda i, j: x[i, j] * 2.0, output=0)
        ctx.compute(lambda i: Sum(lambda c: x[i, c]), output=1)
    s = strategies_by_var(analyze(_sem(build, [(4, 6)], [(4, 6), (4,)])))
    assert [str(o) for o in s["output", "j"].outputs] == ["S(1)", "R"]
    assert [str(o) for o in s["output", "i"].outputs] == ["S(0)", "S(0)"]


def test_uneven_extent_smaller_than_k_is_not_offered():
    sem = describe("a", "AddV2", {}, [(3, 1)], ["float32"], [(3, 1)], ["float32"])
    (s,) = analyze(sem)
    assert s.valid_for(3) and not s.valid_for(4)
    assert [part_range(3, 3, p) for p in range(3)] == [(0, 0), (1, 1), (2, 2)]
