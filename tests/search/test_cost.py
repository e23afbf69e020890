"""Byte formulas of the cost model, against hand-counted cases."""

import numpy as np
import pytest

from tofu_tf.op_semantics.analysis import REPLICATED, Partial, Split
from tofu_tf.cc.reference import overlaps_numpy
from tofu_tf.search.cost import CostModel, tensor_states, union_volume
from tofu_tf.search.problem import fetch_extra


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


def test_union_volume_against_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(200):
        boxes = []
        for _ in range(int(rng.integers(1, 7))):
            boxes.append(tuple(tuple(sorted(int(v) for v in rng.integers(-2, 7, 2)))
                               for _ in range(3)))
        covered = set()
        for box in boxes:
            covered |= {(i, j, k) for i in range(*box[0]) for j in range(*box[1])
                        for k in range(*box[2])}
        assert union_volume(boxes) == len(covered)


def test_fetch_extra_counts_each_copy_past_the_delivered_one():
    """The parts' reads from outside the stored part (shape), beyond the one copy of them
    an outer level delivered: the window's outside where the reads cover the window; the
    reads' own outside where a strided read leaves gaps (never below 0)."""
    window = ((0, 10),)
    assert fetch_extra([((0, 6),), ((4, 10),)], window, (6,)) == 0       # halo inside
    assert fetch_extra([((0, 8),), ((6, 10),)], window, (5,)) == 2       # 6, 7 twice
    assert fetch_extra([((0, 2),), ((8, 10),)], window, (5,)) == 0       # gaps: 2-7 unread
    assert fetch_extra([((0, 2),), ((8, 10),), ((7, 9),)], window, (5,)) == 1   # 8 twice


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


def test_partners_against_brute_force():
    """Transfers per state: the (p, q != p) pairs where part q's slice of the dim meets
    part p's nonempty box, and (k - 1) per nonempty box for R."""
    from tofu_tf.search.cost import part_bounds, partners
    rng = np.random.default_rng(1)
    for _ in range(200):
        k, rank = int(rng.integers(2, 9)), int(rng.integers(1, 4))
        shape = rng.integers(k, 3 * k + 3, rank)
        boxes = np.zeros((1, k, rank, 2), dtype=np.int64)
        for p in range(k):
            for d in range(rank):
                boxes[0, p, d] = sorted(rng.integers(0, shape[d] + 1, 2))
        got = partners(boxes, shape[None, :].astype(np.int64), k)[0]
        nonempty = [bool(np.all(boxes[0, p, :, 1] > boxes[0, p, :, 0])) for p in range(k)]
        assert got[rank] == (k - 1) * sum(nonempty)
        for d in range(rank):
            bounds = part_bounds(int(shape[d]), k)
            a, b = boxes[0, :, d, 0], boxes[0, :, d, 1]
            want = sum(1 for p in range(k) if nonempty[p] for q in range(k)
                       if q != p and bounds[q, 0] < b[p] and a[p] < bounds[q, 1])
            assert got[d] == want


@pytest.mark.parametrize("k", [2, 4])
def test_a_relayout_counts_an_all_to_all(k):
    """A [8, 6] tensor stored Split(0) read as Split(1) (column blocks): every part needs
    a piece of every other part's rows, k (k - 1) messages; stored R, none."""
    from tofu_tf.search.cost import partners
    from tofu_tf.op_semantics.analysis import part_range
    boxes = np.array([[[(0, 8), (a, b + 1)] for a, b in (part_range(6, k, p)
                                                         for p in range(k))]])
    counts = partners(boxes, np.array([[8, 6]]), k)[0]
    assert counts[0] == k * (k - 1)         # stored Split(0): all-to-all
    assert counts[1] == 0                   # stored Split(1): already there
