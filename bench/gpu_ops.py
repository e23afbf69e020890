"""The plan simulator's per-kernel predictions on a GPU profile against one GPU's kernels.

    python bench/gpu_ops.py --export=gpu_ops.json                  # here: the kernels
    python3 bench/gpu_kernels.py --ops=gpu_ops.json --out=raw.json  # on the GPU machine
    python bench/gpu_ops.py --compare=raw.json                     # here: the error
    python bench/gpu_ops.py --export=new.json --compare=raw.json   # re-predict, same times
    python bench/gpu_ops.py --compare=bench/results/gpu_ops_raw.json \
        --repeat=bench/results/gpu_ops_raw_repeat.json             # the stored runs

For each config (bench/common.py; default: the two paper configs of the frontier), the
matrix products and convolutions (forward, input and filter gradients) that one device runs
unpartitioned and under tofu's plan at 8 devices (the plan bench/paper.py predicts: the
least-communication plan within the device's memory), each with the shapes that device's
op has (search/recursive.device_problem). These carry nearly all of the step's FLOPs. The
export holds each distinct kernel once with its count and the simulator's prediction
(search/simulate.op_seconds on `--profile`); bench/gpu_kernels.py times each (PyTorch,
replayed from a CUDA graph); the comparison gives per kernel and per step (summed over the
kernels, counts included) predicted vs measured. Results: bench/results/gpu_ops.{json,md}.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np
from absl import app, flags

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, configurations, load, markdown_table  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("export", None, "write the kernels of --configs to this file")
flags.DEFINE_string("compare", None, "bench/gpu_kernels.py --ops output to compare with")
flags.DEFINE_list("configs", ["wresnet-152-w10", "lstm-10-8192"], "bench/common.py configs")
flags.DEFINE_string("profile", "h200_8", "search/simulate.py profile")
flags.DEFINE_string("repeat", None, "with --compare: a second timing of the same kernels")

CONVS = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")
CALIBRATION = ("wresnet-101-w8", "lstm-8-6144")     # the rest of --configs is held out
MATMULS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")


def kernel_of(op_type: str, attrs, sem) -> dict | None:
    """The kernel an op runs, by shapes: conv (x, filter, dy NHWC/HWIO, stride) or matmul
    (a, b as stored, transposes)."""
    ins, outs = list(sem.input_shapes), list(sem.output_shapes)
    if op_type in CONVS:
        if op_type == "Conv2D":
            x, f, y = ins[0], ins[1], outs[0]
        elif op_type == "Conv2DBackpropInput":
            x, f, y = outs[0], ins[1], ins[2]
        else:
            x, f, y = ins[0], outs[0], ins[2]
        strides = attrs.get("strides", [1, 1, 1, 1])
        return {"kind": op_type, "x": list(x), "filter": list(f), "y": list(y),
                "stride": [int(strides[1]), int(strides[2])]}
    if op_type in MATMULS:
        ta = bool(attrs.get("transpose_a", attrs.get("adj_x", False)))
        tb = bool(attrs.get("transpose_b", attrs.get("adj_y", False)))
        return {"kind": "matmul", "a": list(ins[0]), "b": list(ins[1]), "ta": ta, "tb": tb}
    return None


def export(path: str) -> None:
    from tofu_tf.op_semantics.catalog import catalog
    from tofu_tf.options import Options
    from tofu_tf.search.plan import search_within_budget
    from tofu_tf.search.recursive import device_problem
    from tofu_tf.search.simulate import PROFILES, op_bytes, op_flops
    from tofu_tf.search.topology import Topology
    profile = PROFILES[FLAGS.profile]
    kernels: list[dict] = []
    index: dict[str, int] = {}
    configs = {}
    for name in FLAGS.configs:
        model, sizes = configurations()[name]
        graph, _ = load(model, sizes)
        entries = catalog(graph)
        whole = [(op.type, op.attrs, entries[op.name].semantics,
                  [graph.tensors[t].dtype for t in op.outputs]) for op in graph
                 if entries[op.name].semantics is not None]
        result = search_within_budget(graph, Topology.default(8),
                                      Options(memory_budget_bytes=profile.memory_bytes))
        model_, last = result.last
        device = device_problem(model_, last)
        local = [(graph.op(op.name).type, graph.op(op.name).attrs, op.sem,
                  [device.tensors[t].dtype for t in op.outputs]) for op in device.ops]
        configs[name] = {}
        for system, ops in (("single", whole), ("tofu_8", local)):
            counts: dict[int, int] = {}
            for op_type, attrs, sem, dtypes in ops:
                kernel = kernel_of(op_type, attrs, sem)
                if kernel is None:
                    continue
                work = {"flops": op_flops(sem), "bytes": op_bytes(sem, dtypes or ["float32"])}
                key = json.dumps(kernel, sort_keys=True)
                if key not in index:
                    index[key] = len(kernels)
                    kernels.append(dict(kernel, **work))
                counts[index[key]] = counts.get(index[key], 0) + 1
            configs[name][system] = {"counts": counts}
        print(f"{name}: {len(kernels)} distinct kernels so far", flush=True)
        del graph
    Path(path).write_text(json.dumps({"profile": FLAGS.profile, "kernels": kernels,
                                      "configs": configs}, indent=1))


MEASURED = ("flops", "bytes", "predicted", "graph", "error")   # not part of a kernel's key


def _key(kernel: dict) -> str:
    return json.dumps({k: v for k, v in kernel.items() if k not in MEASURED}, sort_keys=True)


def law(kernel: dict, peak: float, bandwidth: float, efficiency: float, overhead: float):
    """search/simulate.op_seconds on the kernel's FLOPs and bytes."""
    return max(kernel["flops"] / (peak * efficiency), kernel["bytes"] / bandwidth) + overhead


def fit(kernels: list[dict], peak: float, bandwidth: float) -> tuple[float, float, float]:
    """(efficiency, overhead, bandwidth) minimising the median |log(predicted / measured)|
    on a grid; the bandwidth a fraction (0.5-1) of the copies' `bandwidth`: matrix products
    stream their operands slower than an element-wise add."""
    t = np.array([k["graph"] for k in kernels])
    flops = np.array([k["flops"] for k in kernels])
    moved = np.array([k["bytes"] for k in kernels])
    best = None
    for share in np.arange(0.5, 1.001, 0.05):
        memory = moved / (bandwidth * share)
        for efficiency in np.arange(0.05, 1.001, 0.01):
            compute = np.maximum(flops / (peak * efficiency), memory)
            for overhead in np.arange(0.0, 20.01e-6, 0.25e-6):
                score = float(np.median(np.abs(np.log((compute + overhead) / t))))
                if best is None or score < best[0]:
                    best = (score, float(efficiency), float(overhead), float(bandwidth * share))
    return best[1:]


def _repeat(path: str, kernels: list[dict], predicted: list[float], raw: dict,
            calibration: set[int]) -> dict:
    """A second timing of the same kernels (another machine start): how far its times are
    from the first's, and the held-out step error of the first's fit on them."""
    times = {_key(k): k["graph"] for k in json.loads(Path(path).read_text())["kernels"]
             if k.get("graph")}
    again = [times.get(_key(k)) for k in kernels]
    spread = sorted(abs(t / k["graph"] - 1) for k, t in zip(kernels, again)
                    if t and k.get("graph"))
    steps = []
    for name, systems in raw["configs"].items():
        if name in CALIBRATION:
            continue
        for entry in systems.values():
            counts = {int(i): c for i, c in entry["counts"].items() if again[int(i)]}
            measured = sum(again[i] * c for i, c in counts.items())
            steps.append(abs(sum(predicted[i] * c for i, c in counts.items()) / measured - 1))
    steps.sort()
    return {"spread_median": statistics.median(spread),
            "spread_p90": spread[int(0.9 * len(spread))], "spread_worst": spread[-1],
            "step_median": statistics.median(steps), "step_worst": steps[-1]}


def compare(path: str, fresh: str | None = None, repeat: str | None = None) -> str:
    """The timed kernels of `path`; with `fresh` (an export written since), its kernels and
    counts with the times of `path` (the simulator changed, the kernels did not). The
    profile's efficiency and per-kernel overhead are fitted on the CALIBRATION configs'
    kernels (peak and bandwidth: bench/results/gpu_kernels.json); the others are held out."""
    raw = json.loads(Path(path).read_text())
    if fresh:
        timed = {_key(k): k for k in raw["kernels"]}
        new = json.loads(Path(fresh).read_text())
        for k in new["kernels"]:
            k.update({f: timed[_key(k)][f] for f in ("graph", "error")
                      if f in timed.get(_key(k), {})})
        raw = dict(new, gpu=raw.get("gpu", {}))
    kernels = raw["kernels"]
    measured_profile = json.loads((RESULTS / "gpu_kernels.json").read_text())["profile"]
    peak, bandwidth = measured_profile["peak_flops"], measured_profile["memory_bandwidth"]
    used = {name: {int(i) for entry in systems.values() for i in entry["counts"]}
            for name, systems in raw["configs"].items()}
    calibration = set().union(*(used[c] for c in CALIBRATION if c in used))
    efficiency, overhead, bandwidth = fit([kernels[i] for i in sorted(calibration)
                                           if kernels[i].get("graph")], peak, bandwidth)
    predicted = [law(k, peak, bandwidth, efficiency, overhead) for k in kernels]
    stored = {"gpu": raw.get("gpu", {}), "calibration": list(CALIBRATION),
              "profile": {"peak_flops": peak, "memory_bandwidth": bandwidth,
                          "efficiency": efficiency, "op_overhead": overhead}, "configs": {}}
    rows = []
    for name, systems in raw["configs"].items():
        for system, entry in systems.items():
            counts = {int(i): c for i, c in entry["counts"].items()
                      if kernels[int(i)].get("graph")}
            measured = sum(kernels[i]["graph"] * c for i, c in counts.items())
            guess = sum(predicted[i] * c for i, c in counts.items())
            own = [abs(predicted[i] / kernels[i]["graph"] - 1) for i in counts]
            stored["configs"].setdefault(name, {})[system] = {
                "measured_s": measured, "predicted_s": guess, "error": guess / measured - 1,
                "kernels": len(counts), "untimed": len(entry["counts"]) - len(counts)}
            rows.append([name + ("" if name in CALIBRATION else " (held out)"), system,
                         len(counts), f"{measured * 1e3:.2f}", f"{guess * 1e3:.2f}",
                         f"{guess / measured - 1:+.0%}", f"{statistics.median(own):.0%}"])
    held = [i for i in range(len(kernels)) if i not in calibration and kernels[i].get("graph")]
    errors = sorted(abs(predicted[i] / kernels[i]["graph"] - 1) for i in held)
    steps = sorted(abs(v["error"]) for name, systems in stored["configs"].items()
                   if name not in CALIBRATION for v in systems.values())
    stored["held_out"] = {"kernel_median": statistics.median(errors), "kernel_worst": errors[-1],
                          "kernels": len(errors), "step_median": statistics.median(steps),
                          "step_worst": steps[-1]}
    if repeat:
        stored["repeat"] = _repeat(repeat, kernels, predicted, raw, calibration)
    (RESULTS / "gpu_ops.json").write_text(json.dumps(stored, indent=1, sort_keys=True))
    gpu, h = raw.get("gpu", {}), stored["held_out"]
    r = stored.get("repeat")
    md = "\n\n".join([
        "# The plan simulator's kernel law against one GPU (bench/gpu_ops.py)",
        f"{gpu.get('device', '?')} (torch {gpu.get('torch', '?')}, cuDNN "
        f"{gpu.get('cudnn', '?')}): each distinct matrix product and convolution of one "
        "device's step, unpartitioned (single) and under tofu's plan at 8 devices (tofu_8), "
        "timed from a CUDA graph. Law (search/simulate.op_seconds): max(FLOPs / (peak x "
        "efficiency), bytes / bandwidth) + overhead, with the peak (TF32 matmul) that "
        "bench/gpu_kernels.py measured, efficiency, overhead and bandwidth fitted on the "
        f"kernels of {', '.join(CALIBRATION)} (efficiency {efficiency:.2f}, overhead "
        f"{overhead * 1e6:.2f} us, bandwidth {bandwidth / 1e9:.0f} GB/s: profile `h200_8`). "
        "Step: the sum over the kernels, counts "
        "included; error: predicted / measured - 1.",
        markdown_table(["config", "step", "distinct kernels", "measured ms", "predicted ms",
                        "error", "median kernel error"], rows),
        f"Held out: per step median |error| {h['step_median']:.0%}, worst "
        f"{h['step_worst']:.0%}; per kernel ({h['kernels']} distinct kernels that no "
        f"calibration config runs) median {h['kernel_median']:.0%}, worst "
        f"{h['kernel_worst']:.0%}. Element-wise ops, transfers and collectives are not in "
        "these figures (bench/results/gpu_kernels.md has their laws).",
    ] + ([f"A second timing of the same kernels on a freshly started machine "
          f"(gpu_ops_raw_repeat.json): times {r['spread_median']:.1%} apart in the median "
          f"(p90 {r['spread_p90']:.0%}, worst {r['spread_worst']:.0%}); the fit above "
          f"predicts its held-out steps within a median {r['step_median']:.0%}, worst "
          f"{r['step_worst']:.0%}."] if r else []))
    (RESULTS / "gpu_ops.md").write_text(md + "\n")
    print(md)
    return md


def main(argv) -> int:
    del argv
    if FLAGS.export:
        export(FLAGS.export)
    if FLAGS.compare:
        compare(FLAGS.compare, FLAGS.export, FLAGS.repeat)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
