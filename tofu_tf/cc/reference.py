"""The NumPy reference of the cost op's kernel (cost_op.cc), and its fallback: the same
answers, used where the C++ op cannot be built or loaded."""

from __future__ import annotations

import numpy as np


def overlaps_numpy(boxes: np.ndarray, shapes: np.ndarray, k: int) -> np.ndarray:
    """For boxes [M, k, D, 2] (part p's box of entry m) and shapes [M, D]: the volume of
    box ∩ H_p(Split(d)) for d < D, and in column D the box volume itself (= ∩ H_p(R)).
    Dims past a tensor's rank have shape 1 and box (0, 1). Returns int64 [M, D + 1]."""
    m, _, d, _ = boxes.shape
    lengths = np.clip(boxes[..., 1] - boxes[..., 0], 0, None)             # [M, k, D]
    volume = np.prod(lengths, axis=2)                                    # [M, k]
    out = np.empty((m, d + 1), dtype=np.int64)
    out[:, d] = volume.sum(axis=1)
    parts = np.arange(k)
    for dim in range(d):
        base, extra = np.divmod(shapes[:, dim], k)                       # [M]
        lo = parts[None, :] * base[:, None] + np.minimum(parts[None, :], extra[:, None])
        hi = lo + base[:, None] + (parts[None, :] < extra[:, None])
        inter = np.clip(np.minimum(boxes[:, :, dim, 1], hi) -
                        np.maximum(boxes[:, :, dim, 0], lo), 0, None)    # [M, k]
        safe = np.where(lengths[:, :, dim] > 0, lengths[:, :, dim], 1)
        out[:, dim] = (volume // safe * inter).sum(axis=1)
    return out
