"""The region-overlap kernel of the cost model: C++ custom op if built, NumPy otherwise.

    overlaps(boxes [M, k, D, 2], shapes [M, D], k) -> int64 [M, D + 1]
      column d < D: sum_p |box_p ∩ H_p(Split(d))|,  column D: sum_p |box_p|

The first call (or `backend()`) builds `cost_op.cc` through `tofu_tf.cc.build` (cached by
source hash and TF version) and loads it with `tf.load_op_library`, at most once per
process; importing tofu_tf loads nothing. If that fails — no TensorFlow, no compiler, a
compile error — every call uses `tofu_tf.cc.reference.overlaps_numpy`, which gives the same
answers, and the reason is logged once as an absl warning. `use_backend` (or the
`backend=` argument of `overlaps`) forces one path, for benchmarks and tests.

TensorFlow reads a NumPy input in place only if it is 64-byte aligned, and copies it
otherwise (~8 ms per 100 MB); `aligned_empty` gives such arrays, for callers that build
large batches, and any input that needs a dtype or layout conversion is converted straight
into one.

Inputs are checked here, the same way for both paths, and bad ones raise
`OverlapsInputError`; the C++ kernel checks them again with OP_REQUIRES.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from absl import logging

from tofu_tf.cc import build, reference
from tofu_tf.cc.build import CustomOpBuildError
from tofu_tf.errors import TofuError

__all__ = ["Backend", "CustomOpBuildError", "OverlapsInputError", "aligned_empty", "backend",
           "load_op", "overlaps", "use_backend"]

ALIGNMENT = 64      # bytes; EIGEN_MAX_ALIGN_BYTES of the TF build, below which TF copies input


class Backend(str, enum.Enum):
    """Which implementation computes `overlaps`; compares equal to its string value."""
    CPP = "c++"
    NUMPY = "numpy"


class OverlapsInputError(TofuError):
    """`overlaps` was given boxes and shapes that do not fit together."""


@dataclass
class _LoaderState:
    """What this process knows about the C++ op; `reset` replaces it with a fresh one."""
    module: ModuleType | None = None        # the loaded op library, once loaded
    failure: CustomOpBuildError | None = None   # why it cannot be loaded, once tried
    forced: Backend | None = None           # set by use_backend; None = C++ when possible


_STATE = _LoaderState()
_LOCK = threading.Lock()


def load_op() -> ModuleType:
    """The loaded op library (built on first use); raises CustomOpBuildError if unavailable."""
    if _STATE.module is None and _STATE.failure is None:
        with _LOCK:
            if _STATE.module is None and _STATE.failure is None:
                _try_load()
    if _STATE.failure is not None:
        raise _STATE.failure
    return _STATE.module


def _try_load() -> None:
    try:
        path = build.library_path()
        import tensorflow as tf
        try:
            _STATE.module = tf.load_op_library(str(path))
        except tf.errors.OpError as error:
            raise CustomOpBuildError(f"loading {path} failed: {error.message}",
                                     fix="delete that file to rebuild it.") from error
    except CustomOpBuildError as error:
        _STATE.failure = error
        logging.warning("tofu_tf: the C++ cost op is unavailable, using the NumPy path "
                        "(same answers, slower). Reason: %s", error)


def backend() -> Backend:
    """The implementation `overlaps` uses now (building the C++ op if not yet tried)."""
    return _current_backend()


def _current_backend() -> Backend:
    if _STATE.forced is not None:
        return _STATE.forced
    try:
        load_op()
    except CustomOpBuildError:
        return Backend.NUMPY
    return Backend.CPP


def use_backend(name: Backend | str | None) -> None:
    """Force "c++" or "numpy" for every later call; None restores the automatic choice.
    Forcing "c++" raises CustomOpBuildError at once if the op cannot be built."""
    chosen = None if name is None else Backend(name)
    if chosen is Backend.CPP:
        load_op()
    _STATE.forced = chosen


def reset() -> None:
    """Forget the loaded op, the failure and any forced backend (tests use a fresh state).
    A library already loaded stays registered in TensorFlow."""
    global _STATE
    _STATE = _LoaderState()


def overlaps(boxes: np.ndarray, shapes: np.ndarray, k: int, *,
             backend: Backend | str | None = None) -> np.ndarray:
    """int64 [M, D + 1] overlap volumes (see the module docstring) by the chosen backend."""
    boxes, shapes = _as_int64(boxes), _as_int64(shapes)
    check_inputs(boxes, shapes, k)
    chosen = _resolve(backend)
    if chosen is Backend.CPP:
        return _overlaps_cpp(boxes, shapes, k)
    return reference.overlaps_numpy(boxes, shapes, k)


def aligned_empty(shape: tuple[int, ...], dtype=np.int64) -> np.ndarray:
    """An uninitialised C-contiguous array at an ALIGNMENT-byte address (TF reads it in place)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = -raw.ctypes.data % ALIGNMENT
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def _as_int64(array) -> np.ndarray:
    """`array` itself if it is C-contiguous int64, else an aligned int64 copy."""
    array = np.asarray(array)
    if array.dtype == np.int64 and array.flags.c_contiguous:
        return array
    converted = aligned_empty(array.shape)
    converted[...] = array
    return converted


def _resolve(requested: Backend | str | None) -> Backend:
    if requested is None:
        return _current_backend()
    chosen = Backend(requested)
    if chosen is Backend.CPP:
        load_op()
    return chosen


def check_inputs(boxes: np.ndarray, shapes: np.ndarray, k: int) -> None:
    """Raise OverlapsInputError unless boxes is [M, k, D, 2] and shapes is [M, D], >= 0."""
    fix = "build boxes as [M, k, D, 2] half-open (start, stop) and shapes as [M, D]."
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise OverlapsInputError(f"k must be an integer >= 1, got {k!r}.", fix=fix)
    if boxes.ndim != 4 or boxes.shape[3] != 2:
        raise OverlapsInputError(f"boxes must be [M, k, D, 2], got shape {boxes.shape}.",
                                 fix=fix)
    if shapes.ndim != 2:
        raise OverlapsInputError(f"shapes must be [M, D], got shape {shapes.shape}.", fix=fix)
    if boxes.shape[1] != k:
        raise OverlapsInputError(f"boxes hold {boxes.shape[1]} parts per entry but k is {k}.",
                                 fix="pass the k the boxes were built for.")
    if (boxes.shape[0], boxes.shape[2]) != shapes.shape:
        raise OverlapsInputError(f"boxes {boxes.shape} and shapes {shapes.shape} disagree on "
                                 "M (dim 0) or D (boxes dim 2, shapes dim 1).", fix=fix)
    if shapes.size and shapes.min() < 0:
        raise OverlapsInputError(f"shapes must be non-negative, got {shapes.min()}.", fix=fix)


def _overlaps_cpp(boxes: np.ndarray, shapes: np.ndarray, k: int) -> np.ndarray:
    import tensorflow as tf
    try:
        with tf.device("/CPU:0"):
            return _STATE.module.tofu_region_overlaps(boxes, shapes, k=int(k)).numpy()
    except tf.errors.InvalidArgumentError as error:
        raise OverlapsInputError(error.message,
                                 fix="keep boxes inside their tensor's shape.") from error
