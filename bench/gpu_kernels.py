"""Per-op-family kernel figures of one GPU, for the plan simulator's GPU profiles.

    python3 bench/gpu_kernels.py --out=gpu_kernels_raw.json        # on a GPU machine
    python bench/gpu_kernels.py --analyze=gpu_kernels_raw.json     # here: fit, write results
    python3 bench/gpu_kernels.py --ops=gpu_ops.json --out=raw.json  # bench/gpu_ops.py's kernels

Measuring needs only PyTorch and a CUDA GPU (no TensorFlow, no tofu_tf): the kernels are
the ones TensorFlow calls on a GPU too (cuBLAS matrix products, cuDNN convolutions, plain
element-wise and reduction kernels), at the shapes the reference models and their shards
have (bench/common.py's medium configs, whole and split 8 ways). Each figure is the median
of `--reps` samples; one sample times `inner` launches back to back, inner chosen so that a
sample lasts about a millisecond. Every kernel is timed twice: replayed from a CUDA graph
(the device's own time per kernel, no host in the way) and launched eagerly (the device
waiting on the host's dispatch when the kernel is tiny). Families:

- matmul: float32 (TF32 off and on: TensorFlow turns TF32 on by default) and bfloat16.
- conv2d (NHWC, as TensorFlow lays out): forward, input gradient and filter gradient.
- element-wise (add, relu), reductions (sum over the last and the first axis), softmax.
- copies: device to device, host to device and back (pinned).
- launch: a one-element kernel, eager and from a graph; a host synchronisation.

Analysis (`--analyze`, numpy and scipy, runs anywhere): per family, time = fixed + work /
rate fitted by non-negative least squares (work: FLOPs for matmul and conv, bytes moved
for the rest), each kernel's achieved fraction of the family's best rate, and a first
profile for the plan simulator (its peak and host link go into tofu_tf/search/simulate.py's
`h200_8`; bench/gpu_ops.py fits the rest on the paper configs' kernels). Results:
bench/results/gpu_kernels.{json,md}; the raw figures: gpu_kernels_raw.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

# -- measuring (PyTorch only) -------------------------------------------------------------


def _sample_seconds(torch, fn, reps: int, graph: bool) -> tuple[float, int]:
    """Median seconds per launch of `fn` and the launches per sample."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end) / 1e3, 1e-7)
    inner = int(max(1, min(200, 1e-3 / once)))
    if graph:
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()                                   # warm the side stream (cuBLAS workspace)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(inner):
                fn()
        run = g.replay
        run()
    else:
        def run():
            for _ in range(inner):
                fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(samples), inner


def _time(torch, fn, reps: int) -> dict:
    row = {}
    for mode in ("graph", "eager"):
        try:
            row[mode], row[mode + "_inner"] = _sample_seconds(torch, fn, reps, mode == "graph")
        except Exception as e:                     # noqa: BLE001 - record and go on
            row[mode + "_error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def _matmul_rows(torch, reps):
    shapes = [(n, n, n) for n in (256, 512, 1024, 2048, 4096, 8192)]
    shapes += [                                      # (m, k, n) of the medium configs
        (256, 4096, 4096), (32, 4096, 4096), (256, 512, 4096), (256, 4096, 512),   # MLP
        (2048, 512, 2048), (2048, 2048, 512), (2048, 512, 512), (256, 512, 2048),  # Transf.
        (64, 2048, 4096), (8, 2048, 4096), (64, 2048, 512),                        # LSTM
    ]
    for label, dtype, tf32 in (("float32", torch.float32, False),
                               ("tf32", torch.float32, True),
                               ("bfloat16", torch.bfloat16, True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for m, k, n in shapes:
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            out = torch.empty(m, n, device="cuda", dtype=dtype)
            row = _time(torch, lambda: torch.mm(a, b, out=out), reps)
            size = a.element_size()
            yield dict(family="matmul", dtype=label, shape=[m, k, n], flops=2.0 * m * k * n,
                       bytes=size * (m * k + k * n + m * n), **row)
    torch.backends.cuda.matmul.allow_tf32 = True


# (N, H, W, Cin, Cout, kernel, stride): WResNet-50 widen 2 at 64x64, batch 32 (the stem,
# one 3x3 and one 1x1 conv per stage), whole and split 8 ways by batch or by channels.
_CONVS = [(32, 64, 64, 3, 64, 7, 2), (32, 16, 16, 128, 128, 3, 1), (32, 16, 16, 128, 512, 1, 1),
          (32, 8, 8, 256, 256, 3, 1), (32, 4, 4, 512, 512, 3, 1), (32, 2, 2, 1024, 1024, 3, 1),
          (32, 2, 2, 1024, 4096, 1, 1)]


def _conv_shapes():
    for n, h, w, cin, cout, k, s in _CONVS:
        yield "whole", (n, h, w, cin, cout, k, s)
        yield "batch/8", (n // 8, h, w, cin, cout, k, s)
        if cin >= 64:
            yield "channels/8", (n, h, w, cin, cout // 8, k, s)


def _conv_rows(torch, reps):
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    conv_bw = torch.ops.aten.convolution_backward
    for label, dtype in (("tf32", torch.float32), ("bfloat16", torch.bfloat16)):
        for split, (n, h, w, cin, cout, k, s) in _conv_shapes():
            x = torch.randn(n, cin, h, w, device="cuda", dtype=dtype).to(
                memory_format=torch.channels_last)
            f = torch.randn(cout, cin, k, k, device="cuda", dtype=dtype).to(
                memory_format=torch.channels_last)
            pad = k // 2
            y = torch.nn.functional.conv2d(x, f, stride=s, padding=pad)
            dy = torch.randn_like(y)
            ho, wo = y.shape[2], y.shape[3]
            flops = 2.0 * n * ho * wo * cout * cin * k * k
            size = x.element_size()
            common = dict(family="conv2d", dtype=label, split=split,
                          shape=[n, h, w, cin, cout, k, s], flops=flops)
            passes = (
                ("forward", lambda: torch.nn.functional.conv2d(x, f, stride=s, padding=pad),
                 x.numel() + f.numel() + y.numel()),
                ("input_grad", lambda: conv_bw(dy, x, f, None, [s, s], [pad, pad], [1, 1],
                                               False, [0, 0], 1, [True, False, False]),
                 dy.numel() + f.numel() + x.numel()),
                ("filter_grad", lambda: conv_bw(dy, x, f, None, [s, s], [pad, pad], [1, 1],
                                                False, [0, 0], 1, [False, True, False]),
                 dy.numel() + x.numel() + f.numel()),
            )
            for name, fn, elements in passes:
                yield dict(common, op=name, bytes=size * elements, **_time(torch, fn, reps))


def _memory_rows(torch, reps):
    sizes = [2 ** e for e in range(10, 29, 2)]
    for label, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        for elements in sizes:
            a = torch.randn(elements, device="cuda", dtype=dtype)
            b = torch.randn(elements, device="cuda", dtype=dtype)
            out = torch.empty_like(a)
            size = a.element_size()
            yield dict(family="elementwise", op="add", dtype=label, elements=elements,
                       bytes=3 * size * elements,
                       **_time(torch, lambda: torch.add(a, b, out=out), reps))
            yield dict(family="elementwise", op="relu", dtype=label, elements=elements,
                       bytes=2 * size * elements,
                       **_time(torch, lambda: torch.clamp_min(a, 0, out=out), reps))
            cols = 1024 if elements >= 1024 else elements
            m = a.view(elements // cols, cols)
            yield dict(family="reduction", op="sum_last", dtype=label, elements=elements,
                       bytes=size * (elements + elements // cols),
                       **_time(torch, lambda: m.sum(dim=1), reps))
            yield dict(family="reduction", op="sum_first", dtype=label, elements=elements,
                       bytes=size * (elements + cols),
                       **_time(torch, lambda: m.sum(dim=0), reps))
            rows = a.view(-1, 256) if elements >= 256 else a.view(1, -1)
            yield dict(family="softmax", op="softmax_last", dtype=label, elements=elements,
                       bytes=2 * size * elements,
                       **_time(torch, lambda: torch.softmax(rows, dim=-1), reps))
            yield dict(family="copy", op="device_to_device", dtype=label, elements=elements,
                       bytes=2 * size * elements, **_time(torch, lambda: out.copy_(a), reps))
    for nbytes in [2 ** e for e in range(12, 31, 3)]:
        host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        for op, fn in (("host_to_device", lambda: dev.copy_(host, non_blocking=True)),
                       ("device_to_host", lambda: host.copy_(dev, non_blocking=True))):
            row = {}
            try:
                row["eager"], row["eager_inner"] = _sample_seconds(torch, fn, reps, False)
            except Exception as e:                 # noqa: BLE001
                row["eager_error"] = f"{type(e).__name__}: {e}"[:300]
            yield dict(family="copy", op=op, dtype="uint8", elements=nbytes, bytes=nbytes, **row)


def _launch_rows(torch, reps):
    a = torch.ones(1, device="cuda")
    out = torch.empty_like(a)
    yield dict(family="launch", op="one_element_add", bytes=12, **_time(
        torch, lambda: torch.add(a, a, out=out), reps))
    samples = []
    for _ in range(200):
        t = time.perf_counter()
        torch.add(a, a, out=out)
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - t)
    yield dict(family="launch", op="launch_and_synchronize", bytes=12,
               host=statistics.median(samples))


def _op_kernel(torch, k: dict):
    """A closure running bench/gpu_ops.py's kernel `k` in float32 (TF32 on, as TensorFlow)."""
    def rand(shape):
        return torch.randn(*shape, device="cuda")
    if k["kind"] == "matmul":
        a, b = rand(k["a"]), rand(k["b"])
        a = a.transpose(-1, -2) if k["ta"] else a
        b = b.transpose(-1, -2) if k["tb"] else b
        return lambda: torch.matmul(a, b)
    (n, h, w, cin), (kh, kw, _, cout), (_, ho, wo, _) = k["x"], k["filter"], k["y"]
    sh, sw = k["stride"]
    pad = [max(0, -(-max((ho - 1) * sh + kh - h, 0) // 2)),
           max(0, -(-max((wo - 1) * sw + kw - w, 0) // 2))]
    x = rand((n, cin, h, w)).to(memory_format=torch.channels_last)
    f = rand((cout, cin, kh, kw)).to(memory_format=torch.channels_last)
    if k["kind"] == "Conv2D":
        return lambda: torch.nn.functional.conv2d(x, f, stride=(sh, sw), padding=pad)
    dy = torch.nn.functional.conv2d(x, f, stride=(sh, sw), padding=pad)
    dy = torch.randn_like(dy)
    mask = [True, False, False] if k["kind"] == "Conv2DBackpropInput" else [False, True, False]
    return lambda: torch.ops.aten.convolution_backward(
        dy, x, f, None, [sh, sw], pad, [1, 1], False, [0, 0], 1, mask)


def measure_ops(ops: Path, out: Path, reps: int) -> None:
    """Time every kernel of a bench/gpu_ops.py export; write it back with the times."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    spec = json.loads(ops.read_text())
    spec["gpu"] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    begun = time.perf_counter()
    for i, k in enumerate(spec["kernels"]):
        try:
            k["graph"], _ = _sample_seconds(torch, _op_kernel(torch, k), reps, True)
        except Exception as e:                     # noqa: BLE001 - record and go on
            k["error"] = f"{type(e).__name__}: {e}"[:300]
        print(i, k.get("graph"), k.get("predicted"), k.get("error", ""), flush=True)
        torch.cuda.empty_cache()
        spec["gpu"]["seconds"] = time.perf_counter() - begun
        if i % 20 == 0 or i == len(spec["kernels"]) - 1:
            out.write_text(json.dumps(spec, indent=1))


def measure(out: Path, reps: int) -> None:
    import torch
    props = torch.cuda.get_device_properties(0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
              "multiprocessors": props.multi_processor_count,
              "memory_bytes": props.total_memory, "reps": reps, "rows": [], "errors": []}
    begun = time.perf_counter()
    for section in (_launch_rows, _memory_rows, _matmul_rows, _conv_rows):
        try:
            for row in section(torch, reps):
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
        except Exception as e:                     # noqa: BLE001 - keep what was measured
            result["errors"].append(f"{section.__name__}: {type(e).__name__}: {e}"[:500])
            print("ERROR", result["errors"][-1], flush=True)
        result["seconds"] = time.perf_counter() - begun
        out.write_text(json.dumps(result, indent=1))
        torch.cuda.empty_cache()
    print(f"{len(result['rows'])} rows in {result['seconds']:.0f} s -> {out}", flush=True)


# -- analysis (numpy, scipy) --------------------------------------------------------------

def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="measure on this machine's GPU into this file")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--ops", type=Path, help="time a bench/gpu_ops.py export instead")
    parser.add_argument("--analyze", type=Path, help="fit a raw file, write bench/results")
    args = parser.parse_args(argv)
    if args.out and args.ops:
        measure_ops(args.ops, args.out, args.reps)
    elif args.out:
        measure(args.out, args.reps)
    if args.analyze:
        sys.path.insert(0, str(Path(__file__).parent))
        from gpu_analysis import analyze
        analyze(json.loads(args.analyze.read_text()))


if __name__ == "__main__":
    main()
