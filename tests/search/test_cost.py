"""Byte formulas of the cost model, against hand-counted cases."""

import numpy as np
import pytest

from tofu_tf.op_semantics.analysis import REPLICATED, Partial, Split
from tofu_tf.cc.reference import overlaps_numpy
from tofu_tf.search.cost import CostModel, tensor_states


def _rows(k, n=8, cols=6):
    from tofu_tf.op_semantics.analysis import part_range
    return [((a, b + 1), (0, cols)) for a, b in (part_range(n, k, p) for p in range(k))]


@pytest.mark.parametrize("k", [2, 3, 4])
def test_fetch_formulas(k):
    shape, n = (8, 6), 48
    model = CostModel(k)
    states = tensor_states(shape, k, None)
    assert states == (Split(0), Split(1), REPLICATED)
    aligned = model.fetch_bytes(shape, 4, _rows(k))
    whole = model.fetch_bytes(shape, 4, [((0, 8), (0, 6))] * k)
    assert aligned[0] == 0 and aligned[2] == 0                       # already held
    assert list(whole) == [4 * (k - 1) * n, 4 * (k - 1) * n, 0]      # all-gather
    # rows wanted, columns held: part p misses the other parts' columns of its rows
    cols = [c[0] for c in _rows(k, 6, 8)]
    missing = sum((r[0][1] - r[0][0]) * (6 - (c[1] - c[0])) for r, c in zip(_rows(k), cols))
    assert aligned[1] == 4 * missing


@pytest.mark.parametrize("k", [2, 3, 5])
def test_partial_and_split_conversions(k):
    shape, n = (10, 4), 40
    model = CostModel(k)
    partial = model.convert_bytes(shape, 2, Partial("sum"), None)
    splits = len(tensor_states(shape, k, None)) - 1
    assert list(partial) == [2 * (k - 1) * n] * splits + [2 * 2 * (k - 1) * n]  # RS..., AR
    produced = _rows(k, 10, 4)
    split = model.convert_bytes(shape, 2, Split(0), produced)
    assert split[0] == 0 and split[-1] == 2 * (k - 1) * n


def test_states_keep_large_tensors_partitioned():
    assert tensor_states((8, 6), 4) == (Split(0), Split(1))
    assert tensor_states((3, 2), 4) == (REPLICATED,)
    assert tensor_states((8, 6), 4, 100) == (Split(0), Split(1), REPLICATED)


def test_overlaps_against_brute_force():
    rng = np.random.default_rng(0)
    shapes = rng.integers(1, 9, (30, 3))
    k = 3
    boxes = np.zeros((30, k, 3, 2), dtype=np.int64)
    for m in range(30):
        for p in range(k):
            for d in range(3):
                a, b = sorted(rng.integers(0, shapes[m, d] + 1, 2))
                boxes[m, p, d] = (a, b)
    got = overlaps_numpy(boxes, shapes, k)
    from tofu_tf.op_semantics.analysis import part_range
    for m in range(30):
        for d in range(3):
            want = 0
            for p in range(k):
                lo, hi = part_range(int(shapes[m, d]), k, p) if shapes[m, d] >= k else (0, -1)
                box = boxes[m, p].copy()
                if shapes[m, d] >= k:
                    box[d] = (max(box[d, 0], lo), min(box[d, 1], hi + 1))
                else:
                    base, extra = divmod(int(shapes[m, d]), k)
                    first = p * base + min(p, extra)
                    last = first + base + (p < extra)
                    box[d] = (max(box[d, 0], first), min(box[d, 1], last))
                want += int(np.prod(np.clip(box[:, 1] - box[:, 0], 0, None)))
            assert got[m, d] == want
