"""Derived strategies of reductions, normalisation, losses, optimizer updates, random ops."""

import numpy as np
import pytest

from tofu_tf.op_semantics.analysis import analyze, strategies_by_var
from tofu_tf.op_semantics.localize import localize
from tofu_tf.op_semantics.registry import describe

F32 = "float32"


def _describe(op_type, inputs, outputs, attrs=None, constants=None, dtypes=None):
    """inputs/outputs: shapes; inputs' dtypes float32 unless `dtypes` names them."""
    dtypes = dtypes or [F32] * len(inputs)
    return describe("op", op_type, attrs or {}, inputs, dtypes, outputs,
                    [F32] * len(outputs), constants or {})


def _strategies(*args, **kwargs):
    return strategies_by_var(analyze(_describe(*args, **kwargs)))


def _states(strategy):
    return [str(o) for o in strategy.outputs]


# -- reductions ------------------------------------------------------------------------


def test_sum_over_a_split_axis_is_a_partial_sum():
    s = _strategies("Sum", [(4, 6), ()], [(4,)], constants={1: np.int32(1)},
                    dtypes=[F32, "int32"])
    assert set(s) == {("output", "d0"), ("reduce", "r1")}
    reduce = s["reduce", "r1"]
    assert _states(reduce) == ["P(sum)"]
    assert reduce.input_slices(0, 2, 0) == ((0, 4), (0, 3))
    assert reduce.input_slices(0, 2, 1) == ((0, 4), (3, 6))
    assert reduce.inputs[1].kind == "meta"
    assert s["output", "d0"].input_slices(0, 3, 2) == ((3, 4), (0, 6))   # uneven: 2, 1, 1


def test_keep_dims_negative_and_several_axes():
    s = _strategies("Max", [(2, 3, 5), (2,)], [(1, 3, 1)], {"keep_dims": True},
                    {1: np.array([-1, 0])}, [F32, "int32"])
    assert set(s) == {("output", "d1"), ("reduce", "r0"), ("reduce", "r2")}
    assert _states(s["output", "d1"]) == ["S(1)"]
    assert s["output", "d1"].input_slices(0, 3, 1) == ((0, 2), (1, 2), (0, 5))
    assert _states(s["reduce", "r2"]) == ["P(max)"]
    assert s["reduce", "r2"].input_slices(0, 3, 0) == ((0, 2), (0, 3), (0, 2))


def test_reduce_to_a_scalar_splits_every_input_dim_as_a_partial():
    s = _strategies("Prod", [(4, 6), (2,)], [()], constants={1: np.array([0, 1])},
                    dtypes=[F32, "int32"])
    assert set(s) == {("reduce", "r0"), ("reduce", "r1")}
    assert _states(s["reduce", "r0"]) == ["P(prod)"]


@pytest.mark.parametrize("op_type, reducer", [("All", "P(min)"), ("Any", "P(max)")])
def test_boolean_reductions_combine_as_min_and_max(op_type, reducer):
    s = _strategies(op_type, [(4, 6), ()], [(4,)], constants={1: np.int32(1)},
                    dtypes=["bool", "int32"])
    assert _states(s["reduce", "r1"]) == [reducer]


def test_mean_parts_are_weighted_by_their_share():
    x = np.random.default_rng(0).normal(size=(4, 7))
    sem = _describe("Mean", [(4, 7), ()], [(4,)], constants={1: np.int32(-1)},
                    dtypes=[F32, "int32"])
    strategy = strategies_by_var(analyze(sem))["reduce", "r1"]
    assert _states(strategy) == ["P(mean)"]
    locals_ = [localize(sem, strategy, 3, part) for part in range(3)]
    assert [local.output_scales[0] for local in locals_] == pytest.approx([3 / 7, 2 / 7, 2 / 7])
    combined = sum(x[:, slice(*local.input_slices[0][1])].mean(axis=1) * local.output_scales[0]
                   for local in locals_)
    np.testing.assert_allclose(combined, x.mean(axis=1))


def test_integer_mean_keeps_the_reduced_axis_whole():
    sem = _describe("Mean", [(4, 6), ()], [(4,)], constants={1: np.int32(1)},
                    dtypes=["int32", "int32"])
    assert [(s.kind, s.var) for s in analyze(sem)] == [("output", "d0")]
    assert "truncates" in sem.unsplittable["r1"]


def test_euclidean_norm_splits_only_kept_dims():
    s = _strategies("EuclideanNorm", [(4, 6), ()], [(4,)], constants={1: np.int32(1)},
                    dtypes=[F32, "int32"])
    assert set(s) == {("output", "d0")}


def test_argmax_keeps_the_searched_axis_whole():
    s = _strategies("ArgMax", [(4, 6, 5), ()], [(4, 5)], constants={1: np.int32(1)},
                    dtypes=[F32, "int32"])
    assert set(s) == {("output", "d0"), ("output", "d1")}
    assert s["output", "d1"].input_slices(0, 2, 1) == ((0, 4), (0, 6), (3, 5))


def test_bias_add_grad_nchw_sums_over_all_but_channels():
    s = _strategies("BiasAddGrad", [(2, 5, 3, 4)], [(5,)], {"data_format": "NCHW"})
    assert str(s["output", "c"]) == "o:c in (*,S,*,*) -> S(0)"
    assert str(s["reduce", "r0"]) == "r:r0 in (S,*,*,*) -> P(sum)"
    assert ("reduce", "r1") not in s


def test_l2_loss_is_a_partial_sum_on_every_dim():
    s = _strategies("L2Loss", [(4, 6)], [()])
    assert [str(st) for st in s.values()] == ["r:r0 in (S,*) -> P(sum)",
                                              "r:r1 in (*,S) -> P(sum)"]


# -- normalisation -----------------------------------------------------------------------


def test_softmax_splits_all_but_the_normalised_axis():
    sem = _describe("Softmax", [(4, 3, 6)], [(4, 3, 6)])
    assert [str(s) for s in analyze(sem)] == ["o:d0 in (S,*,*) -> S(0)",
                                              "o:d1 in (*,S,*) -> S(1)"]
    assert "last axis" in sem.unsplittable["d2"]


BN_IN = [(2, 4, 3, 5), (5,), (5,), (5,), (5,)]
BN_OUT = [(2, 4, 3, 5), (5,), (5,), (5,), (5,), (0,)]


def test_training_batch_norm_splits_channels_only():
    sem = _describe("FusedBatchNormV3", BN_IN, BN_OUT, {"is_training": True})
    s = strategies_by_var(analyze(sem))
    assert set(s) == {("output", "c")}
    assert _states(s["output", "c"]) == ["S(3)", "S(0)", "S(0)", "S(0)", "S(0)", "R"]
    assert s["output", "c"].input_slices(0, 2, 1) == ((0, 2), (0, 4), (0, 3), (3, 5))
    assert set(sem.unsplittable) >= {"n", "h", "w"}
    assert "whole batch" in sem.unsplittable["n"]


def test_inference_batch_norm_splits_every_dim():
    s = _strategies("FusedBatchNormV3", BN_IN, BN_OUT, {"is_training": False})
    assert set(s) == {("output", v) for v in "nhwc"}
    assert _states(s["output", "n"]) == ["S(0)", "R", "R", "R", "R", "R"]
    assert s["output", "n"].input_slices(0, 2, 1) == ((1, 2), (0, 4), (0, 3), (0, 5))


def test_inference_batch_norm_grad_splits_batch_jointly_with_partial_sums():
    ins = [(2, 4, 3, 5), (2, 4, 3, 5), (5,), (5,), (5,), (0,)]
    outs = [(2, 4, 3, 5), (5,), (5,), (0,), (0,)]
    s = _strategies("FusedBatchNormGradV3", ins, outs, {"is_training": False})
    assert set(s) == {("output", v) for v in "nhwc"}      # no separate reduce strategies
    assert _states(s["output", "h"]) == ["S(1)", "P(sum)", "P(sum)", "R", "R"]
    assert s["output", "h"].input_slices(1, 4, 3) == ((0, 2), (3, 4), (0, 3), (0, 5))
    trained = _strategies("FusedBatchNormGradV3", ins, outs, {"is_training": True})
    assert set(trained) == {("output", "c")}


def test_lrn_channel_split_has_a_zero_padded_halo_and_crops_it():
    sem = _describe("LRN", [(2, 3, 4, 9)], [(2, 3, 4, 9)], {"depth_radius": 2})
    strategy = strategies_by_var(analyze(sem))["output", "d3"]
    assert str(strategy) == "o:d3 in (*,*,*,S-2+2) -> S(3)"
    local = localize(sem, strategy, 3, 0)                  # channels [0, 3)
    assert local.input_slices[0][3] == (0, 5) and local.input_pads[0][3] == (2, 0)
    assert local.output_crops[0][3] == (2, 5)


# -- losses ------------------------------------------------------------------------------


def test_softmax_cross_entropy_splits_the_batch_only():
    sem = _describe("SoftmaxCrossEntropyWithLogits", [(6, 5), (1, 5)], [(6,), (6, 5)])
    assert [str(s) for s in analyze(sem)] == ["o:i in (S,*) (*,*) -> S(0) S(0)"]
    assert "class dim" in sem.unsplittable["j"]


def test_sparse_softmax_cross_entropy_splits_labels_with_rows():
    sem = _describe("SparseSoftmaxCrossEntropyWithLogits", [(6, 5), (6,)], [(6,), (6, 5)],
                    dtypes=[F32, "int32"])
    (strategy,) = analyze(sem)
    assert strategy.input_slices(1, 3, 2) == ((4, 6),)
    assert _states(strategy) == ["S(0)", "S(0)"]


# -- optimizer updates -------------------------------------------------------------------


def test_adam_splits_var_slots_and_gradient_alike_and_keeps_scalars_whole():
    ins = [(4, 6)] * 3 + [()] * 6 + [(4, 6)]
    sem = _describe("ResourceApplyAdam", ins, [], {"use_nesterov": True})
    assert [u.alias for u in sem.updates] == [0, 1, 2]
    s = strategies_by_var(analyze(sem))
    assert set(s) == {("output", "d0"), ("output", "d1")}
    strategy = s["output", "d1"]
    assert _states(strategy) == ["S(1)", "S(1)", "S(1)"]
    for i in (0, 1, 2, 9):
        assert strategy.input_slices(i, 3, 1) == ((0, 4), (2, 4))
    for i in range(3, 9):
        assert strategy.inputs[i].kind == "data" and strategy.input_slices(i, 3, 1) == ()


def test_momentum_reads_the_learning_rate_whole():
    s = _strategies("ResourceApplyMomentum", [(7,), (7,), (), (7,), ()], [])
    assert str(s["output", "d0"]) == "o:d0 in (S) (S) () (S) () -> S(0) S(0)"


def test_scatter_keeps_rows_whole_and_splits_trailing_dims():
    sem = _describe("ResourceScatterAdd", [(6, 4), (3,), (3, 4)], [],
                    dtypes=[F32, "int32", F32])
    assert "indices" in sem.unsplittable["d0"]
    (strategy,) = analyze(sem)
    assert str(strategy) == "o:d1 in (*,S) (*) (*,S) -> S(1)"


def test_sparse_apply_reads_gradient_rows_whole():
    ins = [(6, 4), (6, 4), (), (3, 4), (3,)]
    (strategy,) = analyze(_describe("ResourceSparseApplyAdagrad", ins, [],
                                    dtypes=[F32] * 4 + ["int32"]))
    assert str(strategy) == "o:d1 in (*,S) (*,S) () (*,S) (*) -> S(1) S(1)"


# -- opaque ------------------------------------------------------------------------------


@pytest.mark.parametrize("op_type, words", [
    ("RandomUniform", "split"), ("StatelessRandomUniformV2", "position in the whole shape"),
    ("StatelessRandomGetKeyCounter", "seed"), ("RandomShuffle", "permutation"),
    ("ApplyAdam", "ref variables")])
def test_opaque_ops_say_why(op_type, words):
    sem = _describe(op_type, [(2,)], [(4, 6)])
    assert sem.is_opaque and words in sem.opaque_reason
    assert analyze(sem) == ()
