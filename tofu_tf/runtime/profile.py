"""Where a step's time goes, from TensorFlow's own step stats.

    with Runner(optimized, values) as runner:
        stats = step_stats(runner.session, runner.optimized.fetches, feeds)
    profile = StepProfile.of(stats, wall_seconds, op_nodes=optimized.op_nodes)
    print(profile)        # per device: busy, kernel time by kind, idle

A v1 Session run with `RunOptions(trace_level=FULL_TRACE)` records, per device, every
node's start and end (`RunMetadata.step_stats`). Each node is one of:
- `op`: the local kernel of a planner op (the unpartitioned step is all ops);
- `rewrite`: what the rewrite adds around them: slices, concats, pads, fills, the sums of
  partial results, identities that receive a region, scales;
- `transfer`: TensorFlow's own Send/Recv between devices, and collectives;
- `source`: constants, variable handles and reads, no-ops.
Kernel time is a node's [op_start, op_end); the executor's time is what each node spends
in its [start, end] outside its kernel (scheduling, allocation, bookkeeping); a device's
busy time is the union of its nodes' [start, end]; idle is the step's wall time less
that. Kernels that run at once on one device (inter-op threads) overlap in busy time, so
busy can be less than kernel plus executor time. `write_chrome_trace` writes the same
stats as a trace that TensorBoard's trace viewer and chrome://tracing open, one row per
device.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

KINDS = ("op", "rewrite", "transfer", "source")
_TRANSFER_PREFIXES = ("_Send", "_Recv", "_HostSend", "_HostRecv", "Collective", "Nccl")
_SOURCE_TYPES = frozenset({"Const", "VarHandleOp", "ReadVariableOp", "NoOp", "Placeholder",
                           "_Arg", "_Retval", "HostConst"})


def node_kind(name: str, op_type: str, op_nodes: frozenset[str] | None) -> str:
    if op_type.startswith(_TRANSFER_PREFIXES):
        return "transfer"
    if op_type in _SOURCE_TYPES:
        return "source"
    if op_nodes is None or name in op_nodes:
        return "op"
    return "rewrite"


def device_rows(step_stats) -> list:
    """A traced step's rows of its devices (`dev_stats`), without a GPU's stream and copy
    rows, which repeat its nodes."""
    return [dev for dev in step_stats.dev_stats if "/device:" in dev.device
            and not dev.device.endswith(("stream:all", "/memcpy"))]


@dataclass(frozen=True)
class DeviceTime:
    device: str
    nodes: int
    busy_seconds: float                          # union of its nodes' intervals
    kernel_seconds: Mapping[str, float]          # per kind: summed kernel time
    executor_seconds: float                      # summed node time outside its kernel
    first_start: float                           # seconds from the step's first node
    last_end: float

    @property
    def kernel_total(self) -> float:
        return sum(self.kernel_seconds.values())


@dataclass(frozen=True)
class StepProfile:
    wall_seconds: float                          # of the traced step, first to last node
    devices: tuple[DeviceTime, ...]
    top_nodes: tuple[tuple[str, str, float], ...] = field(default=())  # (name, type, s)

    @staticmethod
    def of(step_stats, op_nodes: Iterable[str] | None = None, top: int = 10) -> "StepProfile":
        """The profile of a `RunMetadata.step_stats`; `op_nodes`: the emitted graph's
        nodes that run planner ops (None: every compute node is an op)."""
        op_nodes = frozenset(op_nodes) if op_nodes is not None else None
        records = []                              # (device, name, type, start, op_s, op_e, end)
        for dev in device_rows(step_stats):
            for ns in dev.node_stats:
                start = ns.all_start_micros
                records.append((_short(dev.device), ns.node_name, _type_of(ns), start,
                                start + ns.op_start_rel_micros, start + ns.op_end_rel_micros,
                                start + max(ns.all_end_rel_micros, ns.op_end_rel_micros)))
        if not records:
            return StepProfile(0.0, ())
        origin = min(r[3] for r in records)
        wall = (max(r[6] for r in records) - origin) * 1e-6
        by_device = defaultdict(list)
        for r in records:
            by_device[r[0]].append(r)
        devices = tuple(_device_time(name, rows, op_nodes, origin)
                        for name, rows in sorted(by_device.items(), key=lambda kv: _order(kv[0])))
        slowest = sorted(records, key=lambda r: r[4] - r[5])[:top]
        return StepProfile(wall, devices, tuple((r[1], r[2], (r[5] - r[4]) * 1e-6)
                                                for r in slowest))

    def totals(self) -> dict[str, float]:
        """Seconds summed over devices: kernel time per kind, busy, and idle (each device's
        wall time not busy)."""
        out = {kind: sum(d.kernel_seconds.get(kind, 0.0) for d in self.devices) for kind in KINDS}
        out["busy"] = sum(d.busy_seconds for d in self.devices)
        out["executor"] = sum(d.executor_seconds for d in self.devices)
        out["idle"] = len(self.devices) * self.wall_seconds - out["busy"]
        return out

    def __str__(self) -> str:
        lines = [f"step {1e3 * self.wall_seconds:.2f} ms over {len(self.devices)} device(s)"]
        for d in self.devices:
            kinds = ", ".join(f"{k} {1e3 * d.kernel_seconds.get(k, 0.0):.2f}" for k in KINDS)
            lines.append(f"  {d.device:>8s}: {d.nodes:5d} nodes, busy "
                         f"{1e3 * d.busy_seconds:.2f} ms ({kinds} ms kernel)")
        return "\n".join(lines)

    def bars(self, width: int = 60) -> list[str]:
        """A text bar per device: its span in the step, # where busy over the span."""
        lines = []
        for d in self.devices:
            lo = int(width * d.first_start / self.wall_seconds) if self.wall_seconds else 0
            hi = max(lo + 1, int(width * d.last_end / self.wall_seconds)) \
                if self.wall_seconds else 1
            fill = d.busy_seconds / max(d.last_end - d.first_start, 1e-12)
            bar = " " * lo + ("#" if fill >= 0.5 else "=") * (hi - lo)
            lines.append(f"{d.device:>8s} |{bar:<{width}s}| busy {100 * fill:.0f}%")
        return lines


def _device_time(name, rows, op_nodes, origin) -> DeviceTime:
    kernel: dict[str, float] = defaultdict(float)
    executor = 0
    for _, node, op_type, start, op_start, op_end, stop in rows:
        kernel[node_kind(node, op_type, op_nodes)] += (op_end - op_start) * 1e-6
        executor += (stop - start) - (op_end - op_start)
    busy, end = 0, None
    for _, _, _, start, _, _, stop in sorted(rows, key=lambda r: r[3]):
        if end is None or start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    return DeviceTime(name, len(rows), busy * 1e-6, dict(kernel), executor * 1e-6,
                      (min(r[3] for r in rows) - origin) * 1e-6,
                      (max(r[6] for r in rows) - origin) * 1e-6)


def _type_of(node_stats) -> str:
    """The op type from a node's timeline label ('name = Type(inputs)')."""
    label = node_stats.timeline_label
    if "= " in label:
        return label.split("= ", 1)[1].split("(", 1)[0].strip()
    return node_stats.node_name.split(":")[-1] if ":" in node_stats.node_name else ""


def _short(device: str) -> str:
    return device.rsplit("/device:", 1)[-1]


def _order(device: str):
    kind, _, index = device.rpartition(":")
    return (kind, int(index) if index.isdigit() else 0)


def step_stats(session, fetches, feeds):
    """One traced run: (its RunMetadata.step_stats, its wall seconds)."""
    import time
    start = time.perf_counter()
    run_args = traced()
    session.run(list(fetches), dict(feeds), **run_args)
    return run_args["run_metadata"].step_stats, time.perf_counter() - start


def traced() -> dict:
    """Session.run keywords for a traced step; its stats land in ["run_metadata"]."""
    from tensorflow.core.protobuf import config_pb2
    return {"options": config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE),
            "run_metadata": config_pb2.RunMetadata()}


def write_profile(directory: str | Path, run, step_stats_proto=None):
    """A TensorBoard profile in `directory`: `run()` runs a step under TensorFlow's
    profiler, which writes plugins/profile/<run>/<host>.xplane.pb (the profile plugin
    opens it); `step_stats_proto` (a traced step's stats: the profiler and a traced step
    exclude each other) goes beside it as <host>.trace.json.gz, one row per device (the
    trace viewer and chrome://tracing open it). Returns (that folder's xplane or trace
    path, run's value)."""
    import socket

    import tensorflow as tf
    directory = Path(directory)
    before = set((directory / "plugins" / "profile").glob("*"))
    tf.profiler.experimental.start(str(directory))
    try:
        value = run()
    finally:
        tf.profiler.experimental.stop()
    made = sorted(set((directory / "plugins" / "profile").glob("*")) - before)
    folder = made[-1] if made else directory / "plugins" / "profile" / "step"
    path = next(iter(sorted(folder.glob("*.xplane.pb"))), None)
    if step_stats_proto is not None:
        path = write_chrome_trace(step_stats_proto,
                                  folder / f"{socket.gethostname()}.trace.json.gz")
    return path or folder, value


def write_chrome_trace(step_stats_proto, path: str | Path) -> Path:
    """The step as a Chrome trace (gzipped JSON, one process row per device)."""
    from tensorflow.python.client import timeline
    trace = timeline.Timeline(step_stats_proto).generate_chrome_trace_format()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(trace)
    return path


def trace_devices(path: str | Path) -> dict[str, set[str]]:
    """Device -> the op names a written Chrome trace shows on it."""
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    out: dict[str, set[str]] = defaultdict(set)
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            out[processes.get(e["pid"], str(e["pid"]))].add(e.get("args", {}).get("name", ""))
    return dict(out)
