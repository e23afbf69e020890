"""The C++ cost op against the NumPy reference, its input checks, and the fallback path.

The op library is built once per test session (`cost_module`, ~4 s); tests that need it
are skipped, with the build error as the reason, where no C++ compiler is available.
"""

from __future__ import annotations

import numpy as np
import pytest

from tofu_tf.cc import build, cost_op
from tofu_tf.errors import TofuError
from tofu_tf.cc.reference import overlaps_numpy

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="session")
def cost_module():
    """The loaded op library, built at most once per session."""
    try:
        return cost_op.load_op()
    except cost_op.CustomOpBuildError as error:
        pytest.skip(f"C++ cost op unavailable: {error}")


@pytest.fixture
def fresh_state():
    """A fresh loader state for the test, restored afterwards."""
    saved = cost_op._STATE
    cost_op.reset()
    yield
    cost_op._STATE = saved


def random_case(rng: np.random.Generator, max_entries: int = 40):
    """Boxes clamped to [0, shape] as the search builds them, with empty and inverted ones."""
    entries = int(rng.integers(0, max_entries + 1))
    k = int(rng.integers(1, 9))
    dims = int(rng.integers(1, 6))
    shapes = rng.integers(1, 41, size=(entries, dims))
    limit = shapes[:, None, :]
    starts = rng.integers(-5, 46, size=(entries, k, dims))
    stops = rng.integers(-5, 46, size=(entries, k, dims))
    boxes = np.stack([np.clip(starts, 0, limit), np.clip(stops, 0, limit)], axis=-1)
    empty = rng.random((entries, k)) < 0.15                       # whole parts with no region
    boxes[empty] = 0
    return boxes.astype(np.int64), shapes.astype(np.int64), k


def brute_force(boxes: np.ndarray, shapes: np.ndarray, k: int) -> np.ndarray:
    """The definition, one part and one state at a time (cost.held_box)."""
    from tofu_tf.op_semantics.analysis import REPLICATED, Split
    from tofu_tf.search.cost import box_volume, held_box

    def overlap(box, held):
        return box_volume(tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(box, held)))

    entries, _, dims, _ = boxes.shape
    out = np.zeros((entries, dims + 1), dtype=np.int64)
    for m in range(entries):
        shape = tuple(int(n) for n in shapes[m])
        for column, state in enumerate([Split(d) for d in range(dims)] + [REPLICATED]):
            out[m, column] = sum(overlap(tuple(map(tuple, boxes[m, p])),
                                         held_box(shape, state, k, p)) for p in range(k))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_cpp_matches_numpy(cost_module, seed):
    boxes, shapes, k = random_case(np.random.default_rng(seed))
    expected = overlaps_numpy(boxes, shapes, k)
    np.testing.assert_array_equal(cost_op.overlaps(boxes, shapes, k, backend="c++"), expected)
    np.testing.assert_array_equal(cost_op.overlaps(boxes, shapes, k, backend="numpy"), expected)


@pytest.mark.parametrize("seed", range(5))
def test_both_match_the_definition(cost_module, seed):
    boxes, shapes, k = random_case(np.random.default_rng(100 + seed), max_entries=6)
    expected = brute_force(boxes, shapes, k)
    np.testing.assert_array_equal(cost_op.overlaps(boxes, shapes, k, backend="c++"), expected)
    np.testing.assert_array_equal(overlaps_numpy(boxes, shapes, k), expected)


def test_unclamped_inverted_and_zero_shapes(cost_module):
    """Raw boxes outside [0, shape], inverted boxes, zero-size dims, k > shape, D up to 8."""
    rng = np.random.default_rng(7)
    for dims in range(0, 9):
        k = int(rng.integers(1, 9))
        shapes = rng.integers(0, 12, size=(30, dims))
        boxes = rng.integers(-6, 18, size=(30, k, dims, 2))
        np.testing.assert_array_equal(cost_op.overlaps(boxes, shapes, k, backend="c++"),
                                      overlaps_numpy(boxes, shapes, k))


def test_large_batch_uses_all_shards(cost_module):
    rng = np.random.default_rng(4)
    shapes = rng.integers(1, 3000, size=(20000, 4))
    starts = rng.integers(0, 3000, size=(20000, 8, 4)) % shapes[:, None, :]
    stops = np.minimum(starts + rng.integers(0, 3000, size=starts.shape), shapes[:, None, :])
    boxes = np.stack([starts, stops], axis=-1)
    np.testing.assert_array_equal(cost_op.overlaps(boxes, shapes, 8, backend="c++"),
                                  overlaps_numpy(boxes, shapes, 8))


def test_overflowing_volume_is_an_error(cost_module):
    boxes = np.array([[[[0, 2**40], [0, 2**40]]]], dtype=np.int64)
    with pytest.raises(cost_op.OverlapsInputError, match="does not fit in int64"):
        cost_op.overlaps(boxes, np.array([[2**40, 2**40]]), 1, backend="c++")


def test_overflow_past_an_empty_dim_is_not_an_error(cost_module):
    boxes = np.array([[[[0, 0], [0, 2**40], [0, 2**40]]]], dtype=np.int64)
    shapes = np.array([[1, 2**40, 2**40]])
    np.testing.assert_array_equal(cost_op.overlaps(boxes, shapes, 1, backend="c++"),
                                  [[0, 0, 0, 0]])


BAD_INPUTS = {
    "boxes rank 3": (np.zeros((2, 4, 3)), np.ones((2, 3)), 4, "boxes must be"),
    "last dim not 2": (np.zeros((2, 4, 3, 3)), np.ones((2, 3)), 4, "boxes must be"),
    "shapes rank 1": (np.zeros((2, 4, 3, 2)), np.ones(3), 4, "shapes must be"),
    "k mismatch": (np.zeros((2, 4, 3, 2)), np.ones((2, 3)), 2, "4 parts per entry"),
    "M mismatch": (np.zeros((2, 4, 3, 2)), np.ones((5, 3)), 4, "disagree"),
    "D mismatch": (np.zeros((2, 4, 3, 2)), np.ones((2, 2)), 4, "disagree"),
    "negative shape": (np.zeros((2, 4, 3, 2)), -np.ones((2, 3)), 4, "non-negative"),
}


@pytest.mark.parametrize("backend", ["c++", "numpy"])
@pytest.mark.parametrize("case", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_raises_a_tofu_error(cost_module, backend, case):
    boxes, shapes, k, message = case
    with pytest.raises(cost_op.OverlapsInputError, match=message) as raised:
        cost_op.overlaps(boxes, shapes, k, backend=backend)
    assert isinstance(raised.value, TofuError) and "Fix:" in str(raised.value)


@pytest.mark.parametrize("case", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_kernel_checks_its_inputs_too(cost_module, case):
    boxes, shapes, k, _ = case
    with pytest.raises(tf.errors.InvalidArgumentError, match="TofuRegionOverlaps: "):
        cost_module.tofu_region_overlaps(boxes.astype(np.int64), shapes.astype(np.int64), k=k)


def traced_shape(module, boxes_shape, shapes_shape, k=4):
    """The op's static output shape when traced with partly unknown input shapes."""
    function = tf.function(lambda b, s: module.tofu_region_overlaps(b, s, k=k))
    return function.get_concrete_function(tf.TensorSpec(boxes_shape, tf.int64),
                                          tf.TensorSpec(shapes_shape, tf.int64)).output_shapes


def test_shape_function(cost_module):
    assert traced_shape(cost_module, [None, 4, 3, 2], [None, None]).as_list() == [None, 4]
    assert traced_shape(cost_module, [None, 4, None, 2], [7, 5]).as_list() == [7, 6]
    for boxes_shape, shapes_shape in [([None, 4, 3, 3], [None, 3]), ([None, 4, 3], [None, 3]),
                                      ([None, 2, 3, 2], [None, 3]), ([5, 4, 3, 2], [6, 3]),
                                      ([5, 4, 3, 2], [5])]:
        with pytest.raises(ValueError):
            traced_shape(cost_module, boxes_shape, shapes_shape)


def test_forced_numpy_backend(cost_module, fresh_state):
    cost_op.use_backend("numpy")
    assert cost_op.backend() == "numpy" == cost_op.Backend.NUMPY
    cost_op.use_backend(None)
    assert cost_op.backend() == "c++"


def test_fallback_is_reported_once_with_the_reason(fresh_state, monkeypatch, tmp_path):
    warnings = []
    monkeypatch.setattr(build, "COMPILER", "/nonexistent/tofu-g++")
    monkeypatch.setattr(build, "cache_dirs", lambda: [tmp_path])
    monkeypatch.setattr(cost_op.logging, "warning", lambda *args: warnings.append(args))
    boxes, shapes, k = random_case(np.random.default_rng(0))
    for _ in range(3):
        np.testing.assert_array_equal(cost_op.overlaps(boxes, shapes, k),
                                      overlaps_numpy(boxes, shapes, k))
    assert cost_op.backend() == "numpy"
    assert len(warnings) == 1
    assert "/nonexistent/tofu-g++" in str(warnings[0][1]) and "not found" in str(warnings[0][1])
    with pytest.raises(cost_op.CustomOpBuildError, match="not found"):
        cost_op.use_backend("c++")


def test_compile_error_is_a_short_tofu_error(monkeypatch, tmp_path):
    broken = tmp_path / "cost_op.cc"
    broken.write_text("this is not C++;\n")
    monkeypatch.setattr(build, "SOURCE", broken)
    with pytest.raises(build.CustomOpBuildError, match="compiling cost_op.cc failed") as raised:
        build.library_path(dirs=[tmp_path / "cache"])
    assert "Fix:" in str(raised.value) and len(str(raised.value).splitlines()) < 40
    assert not list((tmp_path / "cache").glob("*"))          # no partial library left behind


def test_cache_key_follows_source_and_tf_version(monkeypatch, tmp_path):
    name = build.library_name("g++")
    assert name.startswith(f"tofu_cost_op-tf{tf.__version__}-") and name.endswith(".so")
    edited = tmp_path / "cost_op.cc"
    edited.write_bytes(build.SOURCE.read_bytes() + b"\n// edited\n")
    monkeypatch.setattr(build, "SOURCE", edited)
    assert build.library_name("g++") != name
    monkeypatch.setattr(tf, "__version__", "0.0.0")
    assert "tf0.0.0-" in build.library_name("g++")


def test_importing_tofu_tf_does_not_load_the_op():
    import subprocess
    import sys
    code = ("import sys, tofu_tf, tofu_tf.cc, tofu_tf.search.cost\n"
            "assert 'tensorflow' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_int32_and_strided_inputs_are_converted(cost_module):
    boxes, shapes, k = random_case(np.random.default_rng(11))
    expected = overlaps_numpy(boxes, shapes, k)
    strided = np.asfortranarray(boxes.astype(np.int32))
    np.testing.assert_array_equal(cost_op.overlaps(strided, shapes.tolist(), k, backend="c++"),
                                  expected)


def test_aligned_empty_is_aligned_and_contiguous():
    array = cost_op.aligned_empty((5, 8, 4, 2))
    assert array.ctypes.data % cost_op.ALIGNMENT == 0
    assert array.flags.c_contiguous and array.dtype == np.int64 and array.shape == (5, 8, 4, 2)
