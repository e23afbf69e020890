"""Derived regions and local ops of the shape-like, gather and source families.

Hand-checked regions for each op kind, the hooks' local constants, pads and crops, and
NumPy property checks of the two hooks with index arithmetic of their own (Reshape,
MirrorPad): cutting, padding, running the op locally and cropping gives the part's share.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tofu_tf.op_semantics.analysis import analyze, strategies_by_var
from tofu_tf.op_semantics.localize import localize
from tofu_tf.op_semantics.ops.shape import reshape_groups
from tofu_tf.op_semantics.ops.slicing import mirror_window, strided_spec
from tofu_tf.op_semantics.registry import describe

I32 = "int32"


def _describe(op_type, ins, outs, constants=None, attrs=None, dtypes=None):
    return describe("n", op_type, attrs or {}, ins, dtypes or ["float32"] * len(ins), outs,
                    ["float32"] * len(outs), constants or {})


def _by_var(sem):
    return strategies_by_var(analyze(sem))


def _consts(local):
    return {i: np.asarray(v).tolist() for i, v in local.const_inputs.items()}


# -- Reshape ------------------------------------------------------------------------------


def _reshape(x_shape, y_shape):
    return _describe("Reshape", [x_shape, (len(y_shape),)], [y_shape],
                     {1: np.array(y_shape)}, dtypes=["float32", I32])


def test_reshape_groups_pair_equal_products():
    assert reshape_groups((6, 4), (2, 3, 4)) == [((0,), (0, 1)), ((1,), (2,))]
    assert reshape_groups((2, 3, 4), (6, 4)) == [((0, 1), (0,)), ((2,), (1,))]
    assert reshape_groups((6, 4), (4, 6)) == [((0, 1), (0, 1))]
    assert reshape_groups((5, 1, 6), (1, 30)) == [((0, 2), (1,))]


def test_reshape_split_of_a_merged_leading_dim_keeps_rows():
    sem = _reshape((6, 4), (2, 3, 4))
    s = _by_var(sem)["output", "d0"]
    assert s.input_slices(0, 2, 0) == ((0, 3), (0, 4))
    assert s.input_slices(0, 2, 1) == ((3, 6), (0, 4))
    local = localize(sem, s, 2, 1)
    assert _consts(local) == {1: [1, 3, 4]}
    assert local.input_pads[0] == ((0, 0), (0, 0)) and local.output_crops == (None,)


def test_reshape_merge_keeps_the_leading_dim_split():
    sem = _reshape((2, 3, 4), (6, 4))
    s = _by_var(sem)["output", "d0"]
    assert str(s.outputs[0]) == "S(0)"
    # rows [2, 4) of y are x[0, 2] and x[1, 0]: x rows [0, 2), computed as [6, 4], cropped
    assert s.input_slices(0, 3, 1) == ((0, 2), (0, 3), (0, 4))
    local = localize(sem, s, 3, 1)
    assert _consts(local) == {1: [6, 4]} and local.output_crops == (((2, 4), (0, 4)),)
    # k=2 is aligned: x rows [0, 1) give y rows [0, 3) exactly
    assert localize(sem, s, 2, 0).output_crops == (None,)


def test_reshape_unaligned_rows_are_padded_to_a_whole_local_shape():
    sem = _reshape((6, 4), (4, 6))
    s = _by_var(sem)["output", "d0"]
    assert s.input_slices(0, 3, 1) == ((3, 5), (0, 4))      # y row 2 = x flat [12, 18)
    local = localize(sem, s, 3, 1)
    assert local.input_pads[0] == ((0, 1), (0, 0))          # x rows [3, 6): 12 elements
    assert _consts(local) == {1: [2, 6]}
    assert local.output_crops == (((0, 1), (0, 6)),)


def test_reshape_split_of_an_inner_dim_widens_soundly():
    sem = _reshape((24,), (4, 6))
    by_var = _by_var(sem)
    assert by_var["output", "d0"].input_slices(0, 2, 1) == ((12, 24),)
    inner = by_var["output", "d1"]
    assert inner.input_slices(0, 3, 1) == ((2, 22),)        # columns 2..3 of every row
    local = localize(sem, inner, 3, 1)
    assert local.input_pads[0] == ((2, 2),)
    assert _consts(local) == {1: [4, 6]} and local.output_crops == (((0, 4), (2, 4)),)


def _run_reshape_locally(x, y_shape, k, part):
    sem = _reshape(x.shape, y_shape)
    results = []
    for strategy in analyze(sem):
        if not strategy.valid_for(k):
            continue
        local = localize(sem, strategy, k, min(part, k - 1))
        cut = x[tuple(slice(a, b) for a, b in local.input_slices[0])]
        value = np.pad(cut, local.input_pads[0]).reshape(local.const_inputs[1])
        if local.output_crops[0] is not None:
            value = value[tuple(slice(a, b) for a, b in local.output_crops[0])]
        want = x.reshape(y_shape)[tuple(slice(a, b) for a, b in local.output_slices[0])]
        results.append((value, want))
    return results


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([(6, 4), (2, 3, 4), (4, 6), (24,), (3, 8), (2, 2, 6), (12, 2),
                        (1, 24), (4, 1, 6)]),
       st.sampled_from([(4, 6), (6, 4), (2, 12), (24,), (2, 3, 4), (3, 2, 2, 2), (8, 3),
                        (4, 3, 2)]),
       st.integers(2, 6), st.integers(0, 5))
def test_reshape_local_ops_reproduce_every_share(x_shape, y_shape, k, part):
    x = np.arange(24).reshape(x_shape)
    for got, want in _run_reshape_locally(x, y_shape, k, part):
        np.testing.assert_array_equal(got, want)


# -- permutations, concat, split, pack ----------------------------------------------------


def test_transpose_splits_the_permuted_input_dim():
    sem = _describe("Transpose", [(4, 5, 6), (3,)], [(6, 4, 5)], {1: np.array([2, 0, 1])},
                    dtypes=["float32", I32])
    s = _by_var(sem)
    assert str(s["output", "d0"]) == "o:d0 in (*,*,S) meta -> S(0)"
    assert str(s["output", "d2"]) == "o:d2 in (*,S,*) meta -> S(2)"


def test_concat_part_reads_only_the_pieces_it_overlaps():
    sem = _describe("ConcatV2", [(4, 2), (4, 1), (4, 3), ()], [(4, 6)], {3: np.array(1)},
                    dtypes=["float32"] * 3 + [I32])
    s = _by_var(sem)["output", "d1"]
    # part 1 of 3 is columns [2, 4): all of piece 1, column 0 of piece 2, none of piece 0
    assert [s.input_slices(i, 3, 1)[1] for i in range(3)] == [(2, 2), (0, 1), (0, 1)]
    assert s.input_slices(0, 3, 0)[1] == (0, 2)


def test_split_of_the_axis_takes_the_same_share_of_every_piece():
    sem = _describe("Split", [(), (4, 9)], [(4, 3)] * 3, {0: np.array(1)},
                    dtypes=[I32, "float32"], attrs={"num_split": 3})
    s = _by_var(sem)["output", "d1"]
    assert [str(o) for o in s.outputs] == ["S(1)"] * 3
    local = localize(sem, s, 2, 1)                         # columns [2, 3) of each piece
    assert local.input_slices[1] == ((0, 4), (2, 9))
    assert local.input_pads[1] == ((0, 0), (0, 2))          # 7 -> 9 columns: 3 pieces of 3
    assert local.output_crops == (((0, 4), (0, 1)),) * 3


def test_unequal_split_pieces_split_one_at_a_time():
    sem = _describe("SplitV", [(4, 6), (3,), ()], [(4, 1), (4, 2), (4, 3)],
                    {1: np.array([1, 2, 3]), 2: np.array(1)}, dtypes=["float32", I32, I32])
    s = _by_var(sem)
    assert str(s["output", "o2_d1"]) == "o:o2_d1 in (*,*) meta meta -> R R S(1)"
    local = localize(sem, s["output", "o2_d1"], 3, 2)
    assert local.output_crops[2] == ((0, 4), (2, 3)) and local.output_crops[0] is None


def test_pack_splits_the_stacking_axis_by_cropping():
    sem = _describe("Pack", [(4, 5)] * 3, [(3, 4, 5)], attrs={"axis": 0, "N": 3})
    s = _by_var(sem)
    assert str(s["output", "d1"]) == "o:d1 in (S,*) (S,*) (S,*) -> S(1)"
    local = localize(sem, s["output", "d0"], 3, 1)
    assert local.output_crops == (((1, 2), (0, 4), (0, 5)),)


# -- slices -------------------------------------------------------------------------------


def test_strided_spec_follows_tensorflow_masks():
    # x[tf.newaxis, 1:, ..., tf.newaxis, ::2] on [4, 3, 5]
    spec = strided_spec((4, 3, 5), [0, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 2],
                        {"begin_mask": 16, "end_mask": 18, "ellipsis_mask": 4,
                         "new_axis_mask": 9})
    assert spec == [("new",), ("range", 0, 1, 1, 3), ("range", 1, 0, 1, 3), ("new",),
                    ("range", 2, 0, 2, 3)]
    # x[-2::-3, 5:1:-1] on [7, 6]; x[:, -2] shrinks dim 1 to index 4
    assert strided_spec((7, 6), [-2, 5], [0, 1], [-3, -1], {"end_mask": 1}) == [
        ("range", 0, 5, -3, 2), ("range", 1, 5, -1, 4)]
    assert strided_spec((7, 6), [0, -2], [0, -1], [1, 1],
                        {"begin_mask": 1, "end_mask": 1, "shrink_axis_mask": 2}) == [
        ("range", 0, 0, 1, 7), ("shrink", 1, 4)]


def _strided_slice():
    # x[1:6:2, ::-1] on [7, 6]
    return _describe("StridedSlice", [(7, 6), (2,), (2,), (2,)], [(3, 6)],
                     {1: np.array([1, 0]), 2: np.array([6, 0]), 3: np.array([2, -1])},
                     {"begin_mask": 2, "end_mask": 2}, ["float32"] + [I32] * 3)


def test_strided_slice_regions_scale_and_mirror():
    s = _by_var(_strided_slice())
    assert s["output", "d0"].input_slices(0, 3, 1) == ((3, 4), (0, 6))
    assert s["output", "d1"].input_slices(0, 3, 0) == ((1, 6), (4, 6))


def test_strided_slice_local_spec_is_relative_to_the_fetched_region():
    sem = _strided_slice()
    local = localize(sem, _by_var(sem)["output", "d1"], 3, 0)
    assert _consts(local) == {1: [0, 1], 2: [5, 0], 3: [2, -1]}
    assert local.attrs["end_mask"] == 2 and local.attrs["begin_mask"] == 0
    whole = localize(sem, None, 1, 0)            # an unsplit copy reads rows [1, 6) only
    assert whole.input_slices[0] == ((1, 6), (0, 6))
    assert _consts(whole) == {1: [0, 5], 2: [5, 0], 3: [2, -1]}


def test_slice_local_begin_is_zero_in_the_fetched_region():
    sem = _describe("Slice", [(6, 7), (2,), (2,)], [(4, 5)],
                    {1: np.array([1, 2]), 2: np.array([4, -1])}, dtypes=["float32", I32, I32])
    s = _by_var(sem)["output", "d0"]
    assert s.input_slices(0, 2, 1) == ((3, 5), (2, 7))
    assert _consts(localize(sem, s, 2, 1)) == {1: [0, 0], 2: [2, 5]}


def _slice_grad():
    # dx of x[2, 1:7:2] on [6, 7]: dy has 3 elements, at x[2, 1], x[2, 3], x[2, 5]
    return _describe("StridedSliceGrad", [(2,)] * 4 + [(3,)], [(6, 7)],
                     {0: np.array([6, 7]), 1: np.array([2, 1]), 2: np.array([3, 7]),
                      3: np.array([1, 2])}, {"shrink_axis_mask": 1}, [I32] * 4 + ["float32"])


def test_strided_slice_grad_reads_the_grid_points_of_its_part():
    s = _by_var(_slice_grad())["output", "d1"]
    # columns [3, 5) hold grid point t = 1 (x column 3); the floor region starts at t = 1
    assert s.input_slices(4, 3, 1) == ((1, 2),)
    local = localize(_slice_grad(), s, 3, 1)
    assert _consts(local) == {0: [6, 2], 1: [2, 0], 2: [3, 1], 3: [1, 2]}


def test_strided_slice_grad_shrunk_index_outside_the_part_goes_to_a_dropped_slot():
    sem = _slice_grad()
    s = _by_var(sem)["output", "d0"]
    outside, inside = localize(sem, s, 3, 0), localize(sem, s, 3, 1)
    assert _consts(outside)[0] == [3, 7] and _consts(outside)[1][0] == 2
    assert outside.output_crops == (((0, 2), (0, 7)),)
    assert _consts(inside)[0] == [2, 7] and _consts(inside)[1][0] == 0
    assert inside.output_crops == (None,)


# -- padding ------------------------------------------------------------------------------


def test_pad_local_paddings_follow_the_edges_a_part_touches():
    sem = _describe("Pad", [(5, 4), (2, 2)], [(10, 5)], {1: np.array([[2, 3], [0, 1]])},
                    dtypes=["float32", I32])
    s = _by_var(sem)["output", "d0"]
    assert str(s) == "o:d0 in (S-2-2,*) meta -> S(0)"
    first, last = localize(sem, s, 3, 0), localize(sem, s, 3, 2)   # rows [0,4), [7,10)
    assert first.input_slices[0] == ((0, 2), (0, 4))
    assert _consts(first) == {1: [[2, 0], [0, 1]]}
    assert last.input_slices[0] == ((5, 5), (0, 4))                 # all padding
    assert _consts(last) == {1: [[3, 0], [0, 1]]}


def test_mirror_pad_hook_fetches_only_the_reflected_rows():
    sem = _describe("MirrorPad", [(5, 4), (2, 2)], [(10, 5)], {1: np.array([[3, 2], [1, 0]])},
                    {"mode": "REFLECT"}, ["float32", I32])
    s = _by_var(sem)["output", "d0"]
    # rows [0, 3) of y reflect x rows 3, 2, 1; rows [7, 10) are x rows 4, 3, 2
    first, last = localize(sem, s, 3, 0), localize(sem, s, 3, 2)
    assert first.input_slices[0] == ((0, 4), (0, 4))
    assert _consts(first) == {1: [[3, 0], [1, 0]]}
    assert first.output_crops == (((0, 4), (0, 5)),)
    assert last.input_slices[0] == ((2, 5), (0, 4))
    assert _consts(last) == {1: [[0, 2], [1, 0]]}


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 7), st.integers(0, 7), st.integers(0, 7), st.booleans(),
       st.integers(2, 6), st.integers(0, 5))
def test_mirror_window_reproduces_numpy_padding(size, before, after, symmetric, k, part):
    limit = size if symmetric else size - 1
    before, after = min(before, limit), min(after, limit)
    x = np.arange(size) * 10
    mode = "symmetric" if symmetric else "reflect"
    y = np.pad(x, (before, after), mode=mode)
    k = min(k, len(y))
    start = len(y) * min(part, k - 1) // k
    stop = len(y) * (min(part, k - 1) + 1) // k
    (a, b), (lead, trail), (c0, c1) = mirror_window(start, stop, before, size, symmetric)
    assert lead <= (b - a if symmetric else b - a - 1)
    assert trail <= (b - a if symmetric else b - a - 1)
    local = np.pad(x[a:b], (lead, trail), mode=mode)
    np.testing.assert_array_equal(local[c0:c1], y[start:stop])


# -- tiles, one-hot, cumsum, range, shape queries --------------------------------------------


def _tile():
    return _describe("Tile", [(3, 4), (2,)], [(9, 4)], {1: np.array([3, 1])},
                     dtypes=["float32", I32])


def test_tile_part_inside_one_tile_reads_its_slice():
    sem = _tile()
    s = _by_var(sem)["output", "d0"]
    inside = localize(sem, s, 4, 1)                        # y rows [3, 5): tile 1, rows 0-1
    assert inside.input_slices[0] == ((0, 2), (0, 4)) and _consts(inside) == {1: [1, 1]}
    across = localize(sem, s, 2, 0)                        # y rows [0, 5): tiles 0 and 1
    assert across.input_slices[0] == ((0, 3), (0, 4)) and _consts(across) == {1: [2, 1]}
    assert across.output_crops == (((0, 5), (0, 4)),)


def test_one_hot_split_of_classes_computes_up_to_the_last_class():
    sem = _describe("OneHot", [(4,), (), (), ()], [(4, 7)], {1: np.array(7)},
                    {"axis": -1}, [I32, I32, "float32", "float32"])
    s = _by_var(sem)["output", "d1"]
    assert s.input_slices(0, 2, 1) == ((0, 4),)
    local = localize(sem, s, 2, 1)                         # classes [4, 7)
    assert _consts(local) == {1: 7} and local.output_crops == (((0, 4), (4, 7)),)


def test_cumsum_part_reads_its_prefix():
    sem = _describe("Cumsum", [(3, 7), ()], [(3, 7)], {1: np.array(1)},
                    {"exclusive": True, "reverse": False}, ["float32", I32])
    s = _by_var(sem)
    assert ("reduce", "r") not in s
    local = localize(sem, s["output", "d1"], 3, 1)        # columns [3, 5) read x[:, :4]
    assert local.input_slices[0] == ((0, 3), (0, 4))
    assert local.input_pads[0] == ((0, 0), (0, 1))
    assert local.output_crops == (((0, 3), (3, 5)),)


def test_range_part_starts_at_its_first_element():
    sem = _describe("Range", [(), (), ()], [(10,)], {0: np.array(2), 1: np.array(32),
                                                     2: np.array(3)}, dtypes=[I32] * 3)
    local = localize(sem, _by_var(sem)["output", "i"], 3, 1)   # elements [4, 7)
    assert _consts(local) == {0: 14, 1: 23, 2: 3}


def test_shape_queries_never_read_their_input():
    sem = _describe("Shape", [(4, 5, 6)], [(3,)])
    (strategy,) = analyze(sem)
    assert strategy.inputs[0].kind == "unused"
    assert localize(sem, strategy, 2, 1).output_crops == (((2, 3),),)
    assert localize(sem, None, 1, 0).input_slices == (None,)
    assert analyze(_describe("Size", [(4, 5)], [()])) == ()


# -- gathers and segment reductions -------------------------------------------------------


def test_gather_splits_indices_or_the_other_params_dims():
    sem = _describe("GatherV2", [(3, 7, 5), (2, 4), ()], [(3, 2, 4, 5)], {2: np.array(1)},
                    dtypes=["float32", I32, I32])
    s = _by_var(sem)
    assert str(s["output", "d0"]) == "o:d0 in (S,*,*) (*,*) meta -> S(0)"
    assert str(s["output", "d1"]) == "o:d1 in (*,*,*) (S,*) meta -> S(1)"
    assert str(s["output", "d3"]) == "o:d3 in (*,*,S) (*,*) meta -> S(3)"


def test_resource_gather_reads_the_variable_rows_whole():
    sem = _describe("ResourceGather", [(9, 5), (4,)], [(4, 5)], dtypes=["float32", I32])
    s = _by_var(sem)
    assert s["output", "d0"].input_slices(0, 2, 1) == ((0, 9), (0, 5))
    assert s["output", "d1"].input_slices(0, 2, 1) == ((0, 9), (3, 5))


def test_gather_nd_splits_on_indices_rows_and_trailing_dims():
    sem = _describe("GatherNd", [(7, 6, 5), (4, 2)], [(4, 5)], dtypes=["float32", I32])
    s = _by_var(sem)
    assert str(s["output", "d0"]) == "o:d0 in (*,*,*) (S,*) -> S(0)"
    assert str(s["output", "d1"]) == "o:d1 in (*,*,S) (*,*) -> S(1)"


def test_segment_sum_splits_rows_partially_and_segments_by_cropping():
    sem = _describe("UnsortedSegmentSum", [(7, 3), (7,), ()], [(5, 3)], {2: np.array(5)},
                    dtypes=["float32", I32, I32])
    s = _by_var(sem)
    assert str(s["reduce", "r0"]) == "r:r0 in (S,*) (S) meta -> P(sum)"
    assert str(s["output", "d0"]) == "o:d0 in (*,*) (*) meta -> S(0)"
    assert localize(sem, s["output", "d0"], 2, 1).output_crops == (((3, 5), (0, 3)),)
    assert localize(sem, s["output", "d1"], 2, 1).output_crops == (None,)


# -- sources and variables ----------------------------------------------------------------


def test_const_part_holds_its_slice_of_the_value():
    value = np.arange(12.0).reshape(4, 3)
    sem = _describe("Const", [], [(4, 3)], attrs={"value": value, "dtype": "float32"})
    local = localize(sem, _by_var(sem)["output", "d0"], 2, 1)
    np.testing.assert_array_equal(local.attrs["value"], value[2:])


def test_placeholder_and_variable_handle_declare_the_part_shape():
    for op_type in ("Placeholder", "VarHandleOp"):
        sem = _describe(op_type, [], [(6, 4)], attrs={"shape": (6, 4)})
        local = localize(sem, _by_var(sem)["output", "d1"], 3, 0)
        assert local.attrs["shape"] == (6, 2)


def test_assignments_update_the_variable_shard():
    assign = _describe("AssignVariableOp", [(4, 5), (4, 5)], [])
    s = _by_var(assign)["output", "d0"]
    assert s.inputs[0].kind == "unused" and str(s.outputs[0]) == "S(0)"
    assert localize(assign, s, 2, 1).input_slices[0] == ((2, 4), (0, 5))
    add = _describe("AssignAddVariableOp", [(4, 5), (4, 5)], [])
    assert str(_by_var(add)["output", "d1"]) == "o:d1 in (*,S) (*,S) -> S(1)"


@pytest.mark.parametrize("op_type", ["Where", "InvertPermutation", "BroadcastGradientArgs"])
def test_value_dependent_shape_ops_are_opaque_with_a_reason(op_type):
    sem = _describe(op_type, [(4,)], [(4,)])
    assert sem.is_opaque and sem.opaque_reason


def test_reshape_of_a_different_size_is_a_description_error():
    import numpy as np
    from tofu_tf.errors import DescriptionError
    from tofu_tf.op_semantics.registry import describe
    with pytest.raises(DescriptionError, match="640 elements"):
        describe("r", "Reshape", {}, [(20, 32), (3,)], ["float32", "int32"], [(4, 3, 32)],
                 ["float32"], {1: np.array([4, 5, 32])})
