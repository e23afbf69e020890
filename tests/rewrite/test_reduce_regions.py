"""partition.reduce_regions: a partial result reduced inside groups whose op produced past
its group's part (an op split on columns above, its result stored on rows at both levels)
is reduced one outer range at a time, so that each device's reduced share is what it
stores."""

from __future__ import annotations

import itertools

from tofu_tf.op_semantics.analysis import REPLICATED, Split
from tofu_tf.rewrite.partition import (contains, nonempty, reduce_regions, reduce_target,
                                      stored_box)
from tofu_tf.search.cost import box_volume
from tofu_tf.search.topology import coordinates

SHAPE, WAYS = (8, 10), (2, 4)


def produced_boxes():
    """Each group produced all rows of its column half (partial inside the group)."""
    return [((0, 8), (5 * coordinates(d, WAYS)[0], 5 * coordinates(d, WAYS)[0] + 5))
            for d in range(8)]


def test_rows_stored_at_both_levels_are_reduced_per_outer_range():
    states = [Split(0), Split(0)]
    regions = reduce_regions(produced_boxes(), (1,), states, WAYS, SHAPE)
    assert len(regions) == 2
    for d in range(8):
        coords = coordinates(d, WAYS)
        stored = stored_box(SHAPE, states, WAYS, coords)
        counterparts = [stored_box(SHAPE, states, WAYS, (g, coords[1])) for g in range(2)]
        shares = [reduce_target(boxes[d], (1,), states, coords, WAYS, SHAPE)
                  for boxes in regions]
        shares = [s for s in shares if s is not None and nonempty(s)]
        # each share is what one device at the same inner coordinate stores (its own, or
        # its counterpart's in the other group: one send, nothing moved inside a group),
        # and the shares in its own rows are all it stores of its group's columns
        assert all(any(contains(c, s) for c in counterparts) for s in shares)
        mine = [s for s in shares if contains(stored, s)]
        assert sum(map(box_volume, mine)) == box_volume(
            ((stored[0][0], stored[0][1]), produced_boxes()[d][1]))
    # the regions tile each device's produced box
    for d in range(8):
        assert sum(box_volume(boxes[d]) for boxes in regions) == box_volume(
            produced_boxes()[d])


def test_one_reduction_where_the_stored_slabs_are_one_range_each():
    for states in ([Split(1), Split(0)], [REPLICATED, Split(0)], [Split(0), REPLICATED]):
        assert reduce_regions(produced_boxes(), (1,), states, WAYS, SHAPE) == \
            [produced_boxes()]


def test_every_region_keeps_the_boxes_of_one_reduction_group_equal():
    states = [Split(0), Split(0)]
    for boxes in reduce_regions(produced_boxes(), (1,), states, WAYS, SHAPE):
        for group in (range(4), range(4, 8)):
            assert len({boxes[d] for d in group}) == 1
        assert all(box is None or nonempty(box) for box in boxes)
        assert any(itertools.chain(boxes))
