"""The region-overlap kernel of the cost model: C++ custom op if built, NumPy otherwise."""

from __future__ import annotations

import numpy as np


def overlaps(boxes: np.ndarray, shapes: np.ndarray, k: int) -> np.ndarray:
    from tofu_tf.search.cost import overlaps_numpy
    return overlaps_numpy(np.asarray(boxes, dtype=np.int64), np.asarray(shapes, dtype=np.int64), k)
