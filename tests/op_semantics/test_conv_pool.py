"""Derived regions and local ops of convolutions and pooling, checked by hand."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tofu_tf.op_semantics.analysis import analyze, strategies_by_var
from tofu_tf.op_semantics.localize import localize
from tofu_tf.op_semantics.registry import describe

F32 = "float32"


def _attrs(stride=1, padding="SAME", dilation=1, explicit=(), **extra):
    return dict(strides=(1, stride, stride, 1), padding=padding,
                dilations=(1, dilation, dilation, 1), explicit_paddings=tuple(explicit),
                data_format="NHWC", **extra)


def _pool_attrs(k, stride, padding):
    return dict(ksize=(1, k, k, 1), strides=(1, stride, stride, 1), padding=padding,
                data_format="NHWC")


def _describe(op_type, attrs, inputs, outputs, constants=None):
    dtypes = [("int32" if constants and i in constants else F32) for i in range(len(inputs))]
    return describe("op", op_type, attrs, inputs, dtypes, outputs, [F32] * len(outputs),
                    constants or {})


def _sizes(shape):
    return {0: np.asarray(shape, np.int32)}


def _rows(strategy, input_index, k, part, dim=1):
    """(requested, clamped) half-open rows of one input for one part."""
    shape = strategy.input_shapes[input_index]
    lo, hi = strategy.part(k, part)
    requested = strategy.inputs[input_index].requested(lo, hi, shape)[dim]
    return requested, strategy.input_slices(input_index, k, part)[dim]


# -- Conv2D ---------------------------------------------------------------------------------


def test_conv2d_same_stride1_halo_is_one_row_each_side():
    sem = _describe("Conv2D", _attrs(), [(2, 8, 8, 3), (3, 3, 3, 4)], [(2, 8, 8, 4)])
    s = strategies_by_var(analyze(sem))
    assert set(s) == {("output", v) for v in ("n", "oh", "ow", "co")} | {
        ("reduce", v) for v in ("kh", "kw", "ci")}
    oh = s["output", "oh"]
    assert _rows(oh, 0, 2, 0) == ((-1, 5), (0, 5))          # rows [-1, 4] -> [0, 5)
    assert _rows(oh, 0, 2, 1) == ((3, 9), (3, 8))
    assert oh.input_slices(1, 2, 0) == ((0, 3), (0, 3), (0, 3), (0, 4))   # filter whole
    local = localize(sem, oh, 2, 0)
    assert local.attrs["padding"] == "VALID" and local.attrs["explicit_paddings"] == ()
    assert local.input_pads[0] == ((0, 0), (1, 0), (1, 1), (0, 0))
    assert local.local_input_shape(0) == (2, 6, 10, 3)       # VALID 3x3 -> 4 x 8 rows


def test_conv2d_stride2_same_halo_and_partial_sums():
    # H = 9, out 5: total padding 2, top 1. Parts oh [0, 2] and [3, 4].
    sem = _describe("Conv2D", _attrs(2), [(2, 9, 9, 3), (3, 3, 3, 4)], [(2, 5, 5, 4)])
    s = strategies_by_var(analyze(sem))
    assert _rows(s["output", "oh"], 0, 2, 0) == ((-1, 6), (0, 6))
    assert _rows(s["output", "oh"], 0, 2, 1) == ((5, 10), (5, 9))
    kh = s["reduce", "kh"]
    assert [str(o) for o in kh.outputs] == ["P(sum)"]
    assert kh.input_slices(1, 3, 1)[0] == (1, 2)              # one filter row per part
    assert _rows(kh, 0, 3, 1) == ((0, 9), (0, 9))             # rows 2*oh + 1 - 1
    ci = s["reduce", "ci"]
    assert ci.input_slices(0, 3, 2)[3] == (2, 3) and ci.input_slices(1, 3, 2)[2] == (2, 3)
    assert [str(o) for o in s["output", "co"].outputs] == ["S(3)"]


def test_conv2d_dilation_and_explicit_padding_set_the_halo():
    dilated = _describe("Conv2D", _attrs(dilation=2), [(1, 11, 11, 2), (3, 3, 2, 2)],
                        [(1, 11, 11, 2)])
    oh = strategies_by_var(analyze(dilated))["output", "oh"]
    assert _rows(oh, 0, 2, 1) == ((4, 13), (4, 11))          # oh [6, 10]: +-(K-1)*d/2
    explicit = _describe("Conv2D", _attrs(2, "EXPLICIT", explicit=(0, 0, 1, 2, 2, 0, 0, 0)),
                         [(1, 9, 11, 2), (2, 4, 2, 2)], [(1, 6, 5, 2)])
    s = strategies_by_var(analyze(explicit))
    assert _rows(s["output", "oh"], 0, 2, 0) == ((-1, 5), (0, 5))    # top padding 1
    assert _rows(s["output", "ow"], 0, 2, 0, dim=2) == ((-2, 6), (0, 6))  # left padding 2
    local = localize(explicit, s["output", "oh"], 2, 1)
    assert local.input_pads[0][1] == (0, 2)                  # oh [3, 5]: rows [5, 10]
    assert local.attrs["padding"] == "VALID" and local.attrs["explicit_paddings"] == ()


def test_conv2d_nchw_splits_the_spatial_dims_in_place():
    attrs = dict(_attrs(2), strides=(1, 1, 2, 2), data_format="NCHW")
    sem = _describe("Conv2D", attrs, [(2, 3, 9, 9), (3, 3, 3, 4)], [(2, 4, 5, 5)])
    s = strategies_by_var(analyze(sem))
    assert [str(o) for o in s["output", "oh"].outputs] == ["S(2)"]
    assert [str(o) for o in s["output", "co"].outputs] == ["S(1)"]
    assert _rows(s["output", "oh"], 0, 2, 0, dim=2) == ((-1, 6), (0, 6))


def test_grouped_convolution_is_refused():
    with pytest.raises(Exception, match="grouped convolution"):
        _describe("Conv2D", _attrs(), [(1, 5, 5, 4), (3, 3, 2, 4)], [(1, 5, 5, 4)])


# -- gradients of Conv2D ------------------------------------------------------------------


def test_backprop_input_regions_local_size_and_crop():
    # dx 9 rows from dy 5 rows, 3x3 stride 2 SAME (top padding 1).
    sem = _describe("Conv2DBackpropInput", _attrs(2),
                    [(4,), (3, 3, 3, 4), (2, 5, 5, 4)], [(2, 9, 9, 3)], _sizes((2, 9, 9, 3)))
    s = strategies_by_var(analyze(sem))
    assert set(s) == {("output", v) for v in ("n", "h", "w", "ci")} | {
        ("reduce", v) for v in ("kh", "kw", "co")}
    h = s["output", "h"]
    assert h.inputs[0].kind == "meta"
    assert _rows(h, 2, 2, 0) == ((-1, 3), (0, 3))            # h [0, 4]: dy rows [-1, 2]
    assert _rows(h, 2, 2, 1) == ((2, 5), (2, 5))             # h [5, 8]: dy rows [2, 4]
    local = localize(sem, h, 2, 0)
    # VALID transposed conv over dy rows [-1, 2] covers dx rows from -1*2 - 1 = -3 on.
    assert local.attrs["padding"] == "VALID"
    assert local.const_inputs[0].tolist() == [2, 9, 13, 3]
    assert local.output_crops[0] == ((0, 2), (3, 8), (3, 12), (0, 3))
    co = s["reduce", "co"]
    assert [str(o) for o in co.outputs] == ["P(sum)"]
    assert co.input_slices(2, 2, 1)[3] == (2, 4) and co.input_slices(1, 2, 1)[3] == (2, 4)


def test_backprop_input_tap_split_offsets_the_local_rows():
    sem = _describe("Conv2DBackpropInput", _attrs(2),
                    [(4,), (3, 3, 3, 4), (2, 5, 5, 4)], [(2, 9, 9, 3)], _sizes((2, 9, 9, 3)))
    kh = strategies_by_var(analyze(sem))["reduce", "kh"]
    local = localize(sem, kh, 3, 2)                          # tap 2 only
    assert _rows(kh, 2, 3, 2) == ((-1, 4), (0, 4))           # (h + 1 - 2) / 2 for h in [0, 8]
    # dy row -1 with tap 2 lands on dx row -1: dx row h is local row h + 1.
    assert local.const_inputs[0][1] == 10 and local.output_crops[0][1] == (1, 10)


def test_backprop_filter_splits_taps_and_reduces_over_batch_and_positions():
    sem = _describe("Conv2DBackpropFilter", _attrs(2),
                    [(2, 9, 9, 3), (4,), (2, 5, 5, 4)], [(3, 3, 3, 4)], {1: np.int32([3, 3, 3, 4])})
    s = strategies_by_var(analyze(sem))
    assert set(s) == {("output", v) for v in ("kh", "kw", "ci", "co")} | {
        ("reduce", v) for v in ("n", "oh", "ow")}
    kh = s["output", "kh"]
    assert _rows(kh, 0, 3, 2) == ((1, 10), (1, 9))           # tap 2: rows 2*oh + 1
    local = localize(sem, kh, 3, 2)
    assert local.const_inputs[1].tolist() == [1, 3, 3, 4]
    oh = s["reduce", "oh"]
    assert [str(o) for o in oh.outputs] == ["P(sum)"]
    assert _rows(oh, 0, 2, 1) == ((5, 10), (5, 9)) and oh.input_slices(2, 2, 1)[1] == (3, 5)


def test_depthwise_channel_split_reads_whole_input_channels_and_crops():
    sem = _describe("DepthwiseConv2dNative", _attrs(2), [(1, 9, 9, 3), (3, 3, 3, 2)],
                    [(1, 5, 5, 6)])
    oc = strategies_by_var(analyze(sem))["output", "oc"]
    assert oc.input_slices(0, 2, 1)[3] == (1, 3)             # oc [3, 5]: c in [1, 2]
    local = localize(sem, oc, 2, 1)
    assert local.output_crops[0][3] == (1, 4)                # local channels 2..5 -> 3..5


def test_depthwise_gradients_keep_the_multiplier_whole_with_a_reason():
    sem = _describe("DepthwiseConv2dNativeBackpropFilter", _attrs(),
                    [(1, 9, 9, 3), (4,), (1, 9, 9, 6)], [(3, 3, 3, 2)],
                    {1: np.int32([3, 3, 3, 2])})
    assert "strided" in sem.unsplittable["m"]
    assert ("output", "m") not in strategies_by_var(analyze(sem))
    c = strategies_by_var(analyze(sem))["output", "c"]
    assert c.input_slices(2, 3, 1)[3] == (2, 4)              # c = 1: dy channels 2, 3


# -- pooling ----------------------------------------------------------------------------


def test_max_pool_taps_are_a_partial_max_with_a_smaller_window():
    sem = _describe("MaxPool", _pool_attrs(3, 2, "SAME"), [(1, 11, 9, 2)], [(1, 6, 5, 2)])
    s = strategies_by_var(analyze(sem))
    assert sem.computes[0].body.reducer == "max"
    assert _rows(s["output", "oh"], 0, 2, 0) == ((-1, 6), (0, 6))  # total padding 2, top 1
    kh = s["reduce", "kh"]
    assert [str(o) for o in kh.outputs] == ["P(max)"]
    local = localize(sem, kh, 2, 0)
    assert local.attrs["ksize"] == (1, 2, 3, 1) and local.attrs["padding"] == "VALID"
    assert local.input_fills[0] == -np.inf


def test_max_pool_grad_fetches_exactly_the_windows_of_its_dy_rows():
    sem = _describe("MaxPoolGrad", _pool_attrs(3, 2, "SAME"),
                    [(1, 9, 9, 2), (1, 5, 5, 2), (1, 5, 5, 2)], [(1, 9, 9, 2)])
    s = strategies_by_var(analyze(sem))
    assert set(sem.unsplittable) == {"kh", "kw"}
    h = s["output", "h"]
    assert _rows(h, 2, 2, 1) == ((2, 5), (2, 5))             # h [5, 8]: windows 2..4
    local = localize(sem, h, 2, 1)
    # Windows 2..4 read rows [3, 9], padded to 10 with -inf; dx rows 5..8 are local 2..5.
    assert local.input_slices[0][1] == (3, 9) and local.input_pads[0][1] == (0, 1)
    assert local.output_crops[0][1] == (2, 6)
    assert local.attrs["padding"] == "VALID"


def test_avg_pool_valid_taps_are_a_partial_mean():
    sem = _describe("AvgPool", _pool_attrs(3, 2, "VALID"), [(1, 11, 9, 2)], [(1, 5, 4, 2)])
    kh = strategies_by_var(analyze(sem))["reduce", "kh"]
    assert [str(o) for o in kh.outputs] == ["P(mean)"]
    local = localize(sem, kh, 3, 0)
    assert local.attrs["ksize"] == (1, 1, 3, 1) and local.output_scales == (1 / 3,)


def test_avg_pool_same_parts_run_same_on_stride_aligned_regions():
    sem = _describe("AvgPool", _pool_attrs(3, 2, "SAME"), [(1, 11, 9, 2)], [(1, 6, 5, 2)])
    s = strategies_by_var(analyze(sem))
    assert set(sem.unsplittable) == {"th", "tw"}
    assert ("reduce", "th") not in s
    oh = s["output", "oh"]
    local = localize(sem, oh, 3, 1)                          # oh [2, 3]
    # Windows read rows [3, 7]; the part fetches [2, 9): 2 = 0 (mod 2) and 9 = 11 (mod 2),
    # so the local SAME op pads 1 on top like the global one, and its output j is oh j + 1.
    assert local.attrs["padding"] == "SAME"
    assert local.input_slices[0][1] == (2, 9) and local.input_pads[0][1] == (0, 0)
    assert local.output_crops[0][1] == (1, 3)


@pytest.mark.parametrize("size,k,stride", [(9, 3, 2), (10, 2, 3), (11, 4, 2), (13, 5, 3),
                                           (9, 3, 1), (12, 7, 2)])
def test_avg_pool_grad_same_hook_stays_inside_the_derived_region(size, k, stride):
    out = -(-size // stride)
    sem = _describe("AvgPoolGrad", _pool_attrs(k, stride, "SAME"), [(4,), (1, out, out, 1)],
                    [(1, size, size, 1)], _sizes((1, size, size, 1)))
    h = strategies_by_var(analyze(sem))["output", "h"]
    for parts in range(2, min(size, 6) + 1):
        for part in range(parts):
            local = localize(sem, h, parts, part)           # raises if a hook widens
            start, stop = local.input_slices[1][1]
            before, after = local.input_pads[1][1] if local.input_pads[1] else (0, 0)
            assert before + stop - start + after == -(-local.const_inputs[0][1] // stride)


# -- every strategy against the real kernel on random geometries --------------------------


@settings(max_examples=12, deadline=None)
@given(op=st.sampled_from(["AvgPool", "AvgPoolGrad", "MaxPoolGrad", "Conv2DBackpropInput"]),
       size=st.integers(5, 12), k=st.integers(1, 4), stride=st.integers(1, 3),
       padding=st.sampled_from(["SAME", "VALID"]))
def test_random_geometries_validate(op, size, k, stride, padding):
    import tensorflow as tf
    from tofu_tf.op_semantics.samples import Sample, arg, const
    from tofu_tf.tools.validate import validate_sample
    if padding == "VALID" and size < k:
        return
    out = -(-size // stride) if padding == "SAME" else (size - k) // stride + 1
    x, y = (1, size, size + 1, 2), (1, out, -(-(size + 1) // stride) if padding == "SAME"
                                     else (size + 1 - k) // stride + 1, 2)
    attrs = _pool_attrs(k, stride, padding)
    R = tf.raw_ops
    build, args = {
        "AvgPool": (lambda a: R.AvgPool(value=a, **attrs), (arg(x),)),
        "AvgPoolGrad": (lambda n, g: R.AvgPoolGrad(orig_input_shape=n, grad=g, **attrs),
                        (const(x, "int32"), arg(y))),
        "MaxPoolGrad": (lambda a, g: R.MaxPoolGrad(orig_input=a, orig_output=R.MaxPool(
            input=a, **attrs), grad=g, **attrs), (arg(x), arg(y))),
        "Conv2DBackpropInput": (lambda n, w, g: R.Conv2DBackpropInput(
            input_sizes=n, filter=w, out_backprop=g, **_attrs(stride, padding)),
            (const(x, "int32"), arg((k, k, 2, 2)), arg(y))),
    }[op]
    report = validate_sample(Sample(op, "random", build, args))
    assert report.strategies > 0
    assert not report.failures, [str(f) for f in report.failures]
