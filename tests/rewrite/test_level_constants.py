"""A deeper level's local op runs with the constants the levels above set
(rewrite/partition.device_op): its description read them, so its kernel must too."""

from __future__ import annotations

import itertools

import numpy as np
import tensorflow as tf

from tofu_tf.op_semantics.analysis import analyze
from tofu_tf.op_semantics.memo import SemanticsMemo
from tofu_tf.op_semantics.samples import Sample, arg
from tofu_tf.rewrite.partition import device_ops
from tofu_tf.tools import validate_levels
from tofu_tf.tools.kernels import OpInstance, expected_outputs


def test_a_tile_split_twice_keeps_the_multiples_of_its_first_level():
    """tf.tile(x[3, 4], (3, 1)) split by rows, then by columns: each row half crosses two
    tiles, so level 1 tiles by (2, 1); level 2 (columns, multiple 1) sets nothing itself.
    Every device's kernel runs with (2, 1) and holds its share exactly."""
    inst = OpInstance.from_sample(Sample("Tile", "rows then columns",
                                         lambda x: tf.tile(x, (3, 1)), (arg((3, 4)),)))
    coords = list(itertools.product(range(2), range(2)))
    pieces = device_ops(inst.sem, analyze(inst.sem), ("o:d0", "o:d1"), (2, 2), coords,
                        SemanticsMemo(), validate_levels._dtypes(inst),
                        validate_levels._result_shapes(inst))
    want = expected_outputs(inst)[0]
    for piece in pieces:
        assert piece.depth == 2
        assert list(piece.const_inputs[1]) == [2, 1]
        held = validate_levels._held(inst, piece)[0]
        np.testing.assert_array_equal(held, want[validate_levels._slices(piece.outputs[0].box)])
