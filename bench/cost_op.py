"""Micro-benchmark of the cost model's inner loop: `overlaps` in C++ against NumPy.

    python bench/cost_op.py [--entries 200000 --k 8 --dims 4 --repeats 5]

Both backends get the same seeded batch (boxes clamped to [0, shape], as the search builds
them, ~10% empty parts), are checked to agree, and are timed through the public
`tofu_tf.cc.cost_op.overlaps` (input checks and TF tensor conversion included) after one
warm-up call; the library build is not timed. "c++ aligned" passes the same batch in
64-byte aligned arrays (`cost_op.aligned_empty`), which TensorFlow reads without a copy. Writes the medians, the speedup and the
machine to bench/results/cost_op.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from tofu_tf.cc import build, cost_op

RESULTS = Path(__file__).resolve().parent / "results" / "cost_op.json"


def make_batch(entries: int, k: int, dims: int, seed: int = 0):
    """Seeded boxes [M, k, D, 2] inside their shapes [M, D], some parts empty."""
    rng = np.random.default_rng(seed)
    shapes = rng.integers(1, 4097, size=(entries, dims))
    limit = shapes[:, None, :]
    starts = rng.integers(0, 4097, size=(entries, k, dims)) % limit
    stops = np.minimum(starts + rng.integers(0, 4097, size=starts.shape), limit)
    boxes = np.stack([starts, stops], axis=-1)
    boxes[rng.random((entries, k)) < 0.1] = 0
    return boxes.astype(np.int64), shapes.astype(np.int64)


def aligned_copy(array: np.ndarray) -> np.ndarray:
    copy = cost_op.aligned_empty(array.shape)
    copy[...] = array
    return copy


def time_backend(backend: str, boxes, shapes, k: int, repeats: int) -> list[float]:
    """Seconds per call, `repeats` calls after one warm-up."""
    cost_op.overlaps(boxes, shapes, k, backend=backend)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        cost_op.overlaps(boxes, shapes, k, backend=backend)
        seconds.append(time.perf_counter() - start)
    return seconds


def machine() -> dict:
    import tensorflow as tf
    return {"nproc": os.cpu_count(), "cpu": _cpu_model(), "python": platform.python_version(),
            "tensorflow": tf.__version__, "numpy": np.__version__,
            "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "load_average_1min": os.getloadavg()[0],    # other work on the machine skews timings
            "compile_flags": " ".join(build.BASE_FLAGS)}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(entries: int, k: int, dims: int, repeats: int) -> dict:
    boxes, shapes = make_batch(entries, k, dims)
    np.testing.assert_array_equal(cost_op.overlaps(boxes, shapes, k, backend="c++"),
                                  cost_op.overlaps(boxes, shapes, k, backend="numpy"))
    times = {name: time_backend(name, boxes, shapes, k, repeats) for name in ("numpy", "c++")}
    times["c++ aligned"] = time_backend("c++", aligned_copy(boxes), aligned_copy(shapes), k,
                                        repeats)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"problem": {"M": entries, "k": k, "D": dims, "repeats": repeats,
                        "input_MB": round((boxes.nbytes + shapes.nbytes) / 2**20, 1)},
            "median_s": medians, "all_s": times,
            "speedup": medians["numpy"] / medians["c++"],
            "speedup_aligned": medians["numpy"] / medians["c++ aligned"], "machine": machine()}


def print_table(result: dict) -> None:
    problem = result["problem"]
    print(f"overlaps  M={problem['M']} k={problem['k']} D={problem['D']}  "
          f"(median of {problem['repeats']}, {result['machine']['nproc']} CPUs)")
    print(f"{'backend':<12} {'median ms':>10} {'min ms':>8} {'max ms':>8}")
    for name, values in result["all_s"].items():
        print(f"{name:<12} {1e3 * statistics.median(values):>10.1f} {1e3 * min(values):>8.1f} "
              f"{1e3 * max(values):>8.1f}")
    print(f"speedup (numpy / c++): {result['speedup']:.1f}x, "
          f"with aligned input {result['speedup_aligned']:.1f}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--dims", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    try:
        cost_op.load_op()
    except cost_op.CustomOpBuildError as error:
        sys.exit(f"the C++ cost op is unavailable, nothing to compare: {error}")
    result = run(args.entries, args.k, args.dims, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)


if __name__ == "__main__":
    main()
