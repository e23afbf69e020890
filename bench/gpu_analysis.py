"""Fit the per-op-family laws of bench/gpu_kernels.py's raw figures (see its docstring)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

import numpy as np
from scipy.optimize import nnls

from common import RESULTS, markdown_table

COMPUTE = ("matmul", "conv2d")             # work = FLOPs; the other families: bytes moved


def _key(row: dict) -> tuple[str, str, str]:
    return row["family"], row.get("op", "mm"), row.get("dtype", "")


def _seconds(row: dict) -> float | None:
    """The device's own time per kernel (graph replay), else the eager one (host copies)."""
    return row.get("graph", row.get("eager"))


def fit_law(rows: list[dict]) -> dict:
    """time = fixed + work / rate, by NNLS on relative error (each row divided by its time)."""
    work = np.array([r["flops"] if r["family"] in COMPUTE else r["bytes"] for r in rows], float)
    t = np.array([_seconds(r) for r in rows])
    coef, _ = nnls(np.stack([1 / t, work / t], axis=1), np.ones(len(rows)))
    fixed, per_work = coef
    err = np.abs(fixed + per_work * work - t) / t
    return {"fixed_s": float(fixed), "rate": float(1 / per_work) if per_work else float("inf"),
            "median_error": float(np.median(err)), "worst_error": float(err.max()),
            "rows": len(rows)}


def derive_profile(raw: dict, laws: dict) -> dict:
    """The plan simulator's DeviceProfile figures (its per-op law: fixed + flops / (peak x
    efficiency), or bytes / bandwidth) from the TF32 compute laws and the largest copies."""
    rows = raw["rows"]
    peak = _best_rates(rows)["tf32"]
    compute = [law for k, law in laws.items() if k.split("/")[0] in COMPUTE and k.endswith("tf32")]
    largest = max((r for r in rows if _key(r) == ("elementwise", "add", "float32")),
                  key=lambda r: r["bytes"])
    launch = {r["op"]: r for r in rows if r["family"] == "launch"}
    host = [r["bytes"] / r["eager"] for r in rows if r.get("op") == "host_to_device"]
    return {
        "peak_flops": peak,
        "efficiency": statistics.median(law["rate"] / peak for law in compute),
        "op_overhead": statistics.median(law["fixed_s"] for law in compute),
        "memory_bandwidth": largest["bytes"] / largest["graph"],
        "host_bandwidth": max(host),
        "eager_launch": launch["one_element_add"]["eager"],
        "kernel_fixed": launch["one_element_add"]["graph"],
        "launch_and_synchronize": launch["launch_and_synchronize"]["host"],
    }


def _best_rates(rows: list[dict], families=COMPUTE) -> dict[str, float]:
    """Per dtype, the highest FLOP/s any kernel of `families` reached."""
    best = defaultdict(float)
    for r in rows:
        if r["family"] in families and "graph" in r:
            best[r["dtype"]] = max(best[r["dtype"]], r["flops"] / r["graph"])
    return best


def _efficiency_rows(rows: list[dict]) -> list[list]:
    """Conv passes at the WResNet shapes: achieved fraction of the dtype's best rate,
    median over the shapes, whole and split 8 ways."""
    best = _best_rates(rows)
    cells = defaultdict(list)
    for r in rows:
        if r["family"] == "conv2d" and "graph" in r:
            rate = r["flops"] / r["graph"] / best[r["dtype"]]
            cells[(r["dtype"], r["op"], r["split"])].append(rate)
    out = []
    for dtype in ("tf32", "bfloat16"):
        for op in ("forward", "input_grad", "filter_grad"):
            out.append([dtype, op] + [f"{statistics.median(cells[(dtype, op, s)]):.0%}"
                                      if cells[(dtype, op, s)] else "-"
                                      for s in ("whole", "batch/8", "channels/8")])
    return out


def _matmul_rows(rows: list[dict]) -> list[list]:
    best = _best_rates(rows, ("matmul",))
    table = defaultdict(dict)
    for r in rows:
        if r["family"] == "matmul" and "graph" in r:
            table[tuple(r["shape"])][r["dtype"]] = r
    out = []
    for shape, by in table.items():
        out.append(["x".join(map(str, shape))] + [
            f"{by[d]['graph'] * 1e6:.1f} ({by[d]['flops'] / by[d]['graph'] / 1e12:.0f}, "
            f"{by[d]['flops'] / by[d]['graph'] / best[d]:.0%})" if d in by else "-"
            for d in ("float32", "tf32", "bfloat16")])
    return out


def analyze(raw: dict) -> str:
    groups = defaultdict(list)
    for r in raw["rows"]:
        if r["family"] != "launch" and _seconds(r):
            groups["/".join(_key(r))].append(r)
    laws = {k: fit_law(v) for k, v in sorted(groups.items())}
    profile = derive_profile(raw, laws)
    stored = {"gpu": {k: v for k, v in raw.items() if k != "rows"}, "laws": laws,
              "profile": profile}
    (RESULTS / "gpu_kernels.json").write_text(json.dumps(stored, indent=1, sort_keys=True))

    def law_cell(k, law):
        unit = "TFLOP/s" if k.split("/")[0] in COMPUTE else "GB/s"
        scale = 1e12 if unit == "TFLOP/s" else 1e9
        return [k, f"{law['fixed_s'] * 1e6:.2f}", f"{law['rate'] / scale:.0f} {unit}",
                f"{law['median_error']:.0%}", f"{law['worst_error']:.0%}", law["rows"]]

    g = raw
    md = "\n\n".join([
        "# Kernel figures of one GPU (bench/gpu_kernels.py)",
        f"Device: {g['device']}, {g['multiprocessors']} SMs, "
        f"{g['memory_bytes'] / 2 ** 30:.0f} GiB; torch {g['torch']}, CUDA {g['cuda']}, cuDNN "
        f"{g['cudnn']}. {len(g['rows'])} kernels measured in {g['seconds']:.0f} s "
        f"(median of {g['reps']} samples each; times are the device's own, replayed from a "
        "CUDA graph, except host copies). TensorFlow itself could not run there (its GPU "
        "wheel and CUDA 12 libraries exceed what travels to the machine), so these are the "
        "kernels TensorFlow calls (cuBLAS, cuDNN, element-wise), timed through PyTorch.",
        "## Laws per family: time = fixed + work / rate (NNLS on relative error)",
        markdown_table(["family/op/dtype", "fixed us", "rate", "median err", "worst err", "n"],
                       [law_cell(k, law) for k, law in laws.items()]),
        "One law per family misses small shapes (the rate a kernel reaches grows with its "
        "size); the tables below give each shape's own rate.",
        "## Matrix products: us per kernel (TFLOP/s, fraction of the dtype's best)",
        markdown_table(["m x k x n", "float32", "tf32", "bfloat16"], _matmul_rows(g["rows"])),
        "## Convolutions at WResNet-50 widen 2 shapes (64x64, batch 32): median fraction of "
        "the dtype's best matmul rate, whole and split 8 ways",
        markdown_table(["dtype", "pass", "whole", "batch/8", "channels/8"],
                       _efficiency_rows(g["rows"])),
        "## A first profile from these figures alone",
        "bench/gpu_ops.py refits efficiency, per-kernel overhead and bandwidth on the paper "
        "configs' own kernels (results/gpu_ops.md): that fit is the profile `h200_8`.",
        markdown_table(["figure", "measured", "h100_8 assumed"], [
            ["peak FLOP/s (best TF32 matmul)", f"{profile['peak_flops'] / 1e12:.0f} T", "495 T"],
            ["efficiency (median over the TF32 matmul and conv laws: rate / peak)",
             f"{profile['efficiency']:.2f}", "0.60"],
            ["per-kernel overhead (median fixed cost of those laws)",
             f"{profile['op_overhead'] * 1e6:.1f} us", "3.0 us"],
            ["memory bandwidth (fp32 add, 1 GiB per operand)",
             f"{profile['memory_bandwidth'] / 1e9:.0f} GB/s", "3350 GB/s"],
            ["host link (pinned host to device)", f"{profile['host_bandwidth'] / 1e9:.0f} GB/s",
             "50 GB/s"],
            ["eager launch of a 1-element kernel", f"{profile['eager_launch'] * 1e6:.1f} us", "-"],
            ["its device time from a graph", f"{profile['kernel_fixed'] * 1e6:.1f} us", "-"],
            ["launch + synchronise round trip", f"{profile['launch_and_synchronize'] * 1e6:.1f} us",
             "-"],
        ]),
        "Not measured (one GPU): the link between GPUs (NVLink 4: 450 GB/s per direction, the "
        "datasheet's) and collectives; TensorFlow's own executor overhead per op (PyTorch's "
        "eager launch stands for it).",
    ])
    (RESULTS / "gpu_kernels.md").write_text(md + "\n")
    print(md)
    return md
