"""Step time on one host: the partitioned step against the unpartitioned one.

    python bench/overhead.py                        # tiny and medium configs at 2, 4, 8 devices
    python bench/overhead.py --configs=mlp,mlp-medium --devices=8 --steps=20
    python bench/overhead.py --sequential=false     # without the per-device control chain
    python bench/overhead.py --replicate_below=4096 # tensors under 4096 elements may be whole
    python bench/overhead.py --replicate_below=4096 --compute_once_below=4096

Each config (a reference model, graph-only, float32, SGD) runs `--steps` timed steps after
`--warmup` untimed ones (medium configs: `--medium_steps`), unpartitioned in a one-device
session and partitioned in a session with one logical CPU per device, the two timed in
alternating blocks of steps (`timing` paired: both see the same load); a row per config and
device count gives the medians, their ratio, the nodes per device, and where the time
goes in one more step traced with TensorFlow's step stats (`tofu_tf.runtime.profile`): kernel
time of the planner ops, of the rewrite's plumbing (slices, concats, sums of partial
results, identities) and of sources, the executor's time around the kernels, and the
devices' idle time (each device's wall time not busy), all summed over devices. Logical
CPUs share the host's cores and memory, so this measures the rewrite's cost (more, smaller
kernels and their plumbing), not a speedup: about 1x is the floor once compute dominates.
The tiny configs are the reference models' defaults (per-op overhead dominates); the
medium ones run a step in seconds. For tiny configs also the floor of any plan that runs
every op on every device: N whole copies of the unpartitioned step, one per device, in one
session (no transfers at all), timed paired against one copy (`--floor`). Also the step's
bytes three ways: the search's model,
the plan's prediction of the emitted step and the ledger's step total.
Results: bench/results/overhead.json and overhead.md (rows merged by config, devices,
sequential setting and the code measured, `--label` or the package's commit, so that two
versions can stand side by side; `--fresh` drops the stored ones).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("configs", "", "comma-separated configs (default: all of CONFIGS)")
flags.DEFINE_string("devices", "2,4,8", "comma-separated logical CPU device counts")
flags.DEFINE_integer("steps", 100, "timed steps of a tiny config")
flags.DEFINE_integer("medium_steps", 3, "timed steps of a medium config")
flags.DEFINE_integer("warmup", 3, "untimed steps first (medium: 1)")
flags.DEFINE_bool("sequential", True, "Options.sequential: chain each device's ops")
flags.DEFINE_integer("replicate_below", 0, "Options.replicate_below: tensors with fewer "
                     "elements may be stored replicated (0: every tensor 1/N)")
flags.DEFINE_integer("compute_once_below", 0, "Options.compute_once_below: ops every "
                     "device would run alike on smaller results run on device 0 only")
flags.DEFINE_float("flop_bytes", None, "Options.flop_bytes: bytes one flop of repeated "
                   "computation costs in the search (default: the step profile's rate)")
flags.DEFINE_float("transfer_bytes", 0.0, "Options.transfer_bytes: bytes one transfer's "
                   "latency costs in the search (default 0: ties only)")
flags.DEFINE_integer("pipeline_stages", 1, "Options.pipeline_stages: each op on one of this "
                     "many device groups (search/pipeline.py)")
flags.DEFINE_integer("micro_batches", 1, "the step accumulates gradients over this many "
                     "slices of its batch (models.build); the unpartitioned step too")
flags.DEFINE_bool("floor", True, "tiny configs: also time N whole copies of the step, one "
                  "per device (the floor of a plan that runs every op on every device)")
flags.DEFINE_bool("fresh", False, "drop the stored rows first")
flags.DEFINE_string("label", "", "the code measured, kept with each row (default: the "
                                 "commit of the tofu_tf package imported)")

sys.path.insert(0, str(Path(__file__).parent))
from common import (CONFIGS, commit_label, cpu, markdown_table, timed_kernels,  # noqa: E402
                    paired_medians, read_results, write_results)


def code_label() -> str:
    """--label, or the commit of the tofu_tf imported."""
    return FLAGS.label or commit_label()


def measure(config: str, device_counts: list[int]) -> list[dict]:
    from tofu_tf.api import optimize
    from tofu_tf.models import build
    from tofu_tf.options import Options
    from tofu_tf.runtime.profile import StepProfile, step_stats
    from tofu_tf.runtime.session import Runner, SingleDevice
    model, sizes, medium = CONFIGS[config]
    steps, warmup = (FLAGS.medium_steps, 1) if medium else (FLAGS.steps, FLAGS.warmup)
    step = build(model, optimizer="sgd", graph_only=True, micro_batches=FLAGS.micro_batches,
                 **sizes)
    feeds = dict(zip(step.feeds, step.sample_batch(0)))
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single_device:
        values = single_device.values()
        whole, rows = None, []
        for devices in device_counts:
            optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                                 num_devices=devices,
                                 options=Options(sequential=FLAGS.sequential,
                                                 replicate_below=FLAGS.replicate_below,
                                                 compute_once_below=FLAGS.compute_once_below,
                                                 flop_bytes=FLAGS.flop_bytes,
                                                 transfer_bytes=FLAGS.transfer_bytes,
                                                 pipeline_stages=FLAGS.pipeline_stages))
            with Runner(optimized, values) as runner:
                single, parted = paired_medians(lambda: single_device.run(feeds),
                                                lambda: runner.run(feeds), steps, warmup)
                stats, _ = step_stats(runner.session, optimized.fetches, feeds)
            floor = (copies_ratio(step, feeds, devices, steps, warmup)
                     if FLAGS.floor and not medium else None)
            if whole is None:          # traced warm, as the partitioned step is
                whole = StepProfile.of(step_stats(single_device.session, step.fetches,
                                                  feeds)[0])
            rows.append(_row(config, model, medium, devices, steps, step, optimized, whole,
                             StepProfile.of(stats, optimized.op_nodes), single, parted,
                             floor))
    return rows


def copies_ratio(step, feeds, devices: int, steps: int, warmup: int) -> float:
    """Median seconds of `devices` whole copies of the step (one per device, one session,
    nothing crossing devices) over those of one copy, timed paired."""
    import tensorflow as tf

    from tofu_tf.runtime.session import session_config
    runs = []
    for copies in (1, devices):
        graph = tf.Graph()
        with graph.as_default():
            for i in range(copies):
                with tf.device(f"/device:CPU:{i}"):
                    tf.graph_util.import_graph_def(step.graph_def, name=f"copy{i}")
        session = tf.compat.v1.Session(graph=graph, config=session_config(copies))
        session.run([f"copy{i}/{step.init_op}" for i in range(copies)])
        fetches = [f"copy{i}/{f}" for i in range(copies) for f in step.fetches]
        fed = {f"copy{i}/{k}": v for i in range(copies) for k, v in feeds.items()}
        runs.append((session, fetches, fed))
    one, many = paired_medians(*(functools.partial(s.run, f, d) for s, f, d in runs),
                               steps, warmup)
    for session, _, _ in runs:
        session.close()
    return many / one


def _row(config, model, medium, devices, steps, step, optimized, whole, profile, single,
         parted, floor) -> dict:
    from tofu_tf.rewrite.verify import cross_device_edges
    row = {
        "config": config, "model": model, "medium": medium, "devices": devices,
        "code": code_label(), "cpu": cpu(),
        "sequential": FLAGS.sequential, "replicate_below": FLAGS.replicate_below,
        "compute_once_below": FLAGS.compute_once_below,
        "flop_bytes": FLAGS.flop_bytes, "transfer_bytes": FLAGS.transfer_bytes,
        "pipeline_stages": FLAGS.pipeline_stages, "micro_batches": FLAGS.micro_batches,
        "steps": steps, "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1",
        "single_seconds": single, "partitioned_seconds": parted,
        "ratio": parted / single, "copies_ratio": floor,
        "nodes_single": len(step.graph_def.node),
        "nodes_partitioned": len(optimized.graph_def.node),
        "nodes_per_device": len(optimized.graph_def.node) / devices,
        # one Send/Recv pair each (bench/results/transfers.md: ten nodes' CPU on logical CPUs)
        "transfers": len(cross_device_edges(optimized.graph_def)),
        "profile": {"traced_seconds": profile.wall_seconds, **profile.totals()},
        "profile_single": {"traced_seconds": whole.wall_seconds, **whole.totals()},
        "bars": profile.bars(40),
        # the stage count the plan runs (Options.pipeline_stages = 0: the search's choice)
        "stages": max(optimized.plan.stages.values()) + 1 if optimized.plan.stages else 1,
        "peak_bytes": optimized.plan.peak_bytes,
        "plan_bytes": optimized.plan.total_bytes,
        "predicted_bytes": optimized.plan.predicted_bytes,
        "ledger_step_bytes": optimized.ledger.step_bytes, "timing": "paired"}
    print(f"{config} @{devices}: {1e3 * single:.2f} ms -> {1e3 * parted:.2f} ms "
          f"({parted / single:.2f}x), {len(optimized.graph_def.node)} nodes, "
          f"{row['transfers']} transfers"
          + (f", {devices} copies {floor:.2f}x" if floor else ""), flush=True)
    return row


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.2f}" if seconds < 10 else f"{1e3 * seconds:.0f}"


def setting(row: dict) -> str:
    """The options a row ran under: the per-device chain, and small tensors replicated."""
    below, once = row.get("replicate_below", 0), row.get("compute_once_below", 0)
    price = ""                   # rows from before Options.flop_bytes: the fewest bytes
    if "flop_bytes" in row:
        work, latency = row["flop_bytes"], row.get("transfer_bytes", 0.0)
        price = (", priced" if work is None and latency is None else
                 ", bytes only" if work == 0 and latency == 0 else
                 f", work {'priced' if work is None else f'{work:g}'}, transfers "
                 f"{'priced' if latency is None else f'{latency:g}'}")
    stages, micro = row.get("pipeline_stages", 1), row.get("micro_batches", 1)
    return (("seq" if row["sequential"] else "free")
            + (f", replicated < {below}" if below else "")
            + (f", once < {once}" if once else "") + price
            + (f", {stages} stages" if stages > 1 else "")
            + (f", stages searched ({row['stages']})" if stages == 0 else "")
            + (f", {micro} micro-batches" if micro > 1 else "")
            + (", oneDNN" if row.get("onednn") else ""))


def table(stored: dict) -> str:
    from tofu_tf.search.plan import human_bytes
    rows = sorted(stored["rows"].values(), key=lambda r: (
        r["medium"], list(CONFIGS).index(r["config"]) if r["config"] in CONFIGS else 99,
        r["devices"], r.get("replicate_below", 0), r.get("compute_once_below", 0),
        not r["sequential"], r.get("code", "")))
    machines = sorted({r["cpu"] for r in rows})
    timing = [[r["config"], r["devices"], setting(r), r.get("code", "?"),
               machines.index(r["cpu"]) + 1, r.get("timing", "blocks"),
               _ms(r["single_seconds"]), _ms(r["partitioned_seconds"]), f"{r['ratio']:.2f}",
               f"{r['copies_ratio']:.2f}" if r.get("copies_ratio") else "",
               r["nodes_single"], f"{r['nodes_per_device']:.0f}", r.get("transfers", ""),
               f"{r['plan_bytes']:.0f}",
               r["predicted_bytes"], r["ledger_step_bytes"],
               human_bytes(r["peak_bytes"]) if "peak_bytes" in r else ""] for r in rows]
    def executor(p: dict) -> str:
        if "executor" in p:
            return _ms(p["executor"])
        return _ms(p["busy_less_kernel"]) + "*"

    where = []
    for r in rows:
        p, s = r["profile"], r["profile_single"]
        where.append([r["config"], r["devices"], setting(r),
                      r.get("code", "?"),
                      _ms(s["traced_seconds"]), _ms(s["op"]), executor(s),
                      _ms(p["traced_seconds"]), _ms(p["op"]), _ms(p["rewrite"]),
                      _ms(p["source"] + p["transfer"]), executor(p), _ms(p["idle"])])
    machine = stored.get("machine", {})
    return "\n".join([
        "# Step time: partitioned against unpartitioned",
        "",
        f"`bench/overhead.py` (last: `{stored.get('command', '')}`), {machine.get('nproc')} "
        "cores; medians of the timed steps. Logical CPU devices share the cores: about 1x "
        "is the floor once compute dominates. Options: seq/free, `Options.sequential` on/off (a "
        "control chain through each device's ops); replicated < n, `Options.replicate_below`"
        " = n (smaller tensors may be stored whole on every device; default 0: every tensor "
        "1/N); once < n, `Options.compute_once_below` = n (an op every device would run "
        "alike on smaller results runs on device 0 only, its readers receive them); work "
        "priced: the search prices the computation replicated ops repeat "
        "(`Options.flop_bytes` at the profile's rate, the default since it exists; rows "
        "without a price moved the fewest bytes); transfers n: `Options.transfer_bytes` = n "
        "(0, the default: transfers only break ties); bytes only: both 0; S stages: "
        "`Options.pipeline_stages` = S (each op on one of S device groups); stages searched "
        "(S): `Options.pipeline_stages` = 0, the search kept the S predicted fastest; plan "
        "peak: the plan's estimated peak bytes per device (newer rows); M micro-batches: "
        "the step (and the unpartitioned one it is timed against) accumulates gradients over "
        "M slices of its batch; oneDNN: TensorFlow's oneDNN CPU kernels on "
        "(`TF_ENABLE_ONEDNN_OPTS=1`; other rows: its own kernels). N copies: N whole copies of the unpartitioned step, one per device, in one "
        "session, over one copy (tiny configs): the floor of any plan that runs every op on "
        "every device. Transfers: the emitted graph's cross-device edges, one Send/Recv "
        "pair each (newer rows). Machines (column cpu): "
        + "; ".join(f"{i + 1}: {m}" for i, m in enumerate(machines)) + ".",
        "",
        markdown_table(["config", "devices", "options", "code", "cpu", "timing",
                        "unpartitioned ms",
                        "partitioned ms", "ratio", "N copies", "nodes", "nodes per device",
                        "transfers", "search model B", "predicted B", "ledger B",
                        "plan peak per device"], timing),
        "",
        "## Where the time goes (one traced step, ms summed over devices)",
        "",
        "Kernel time of the planner ops, of the rewrite's plumbing, of sources and "
        "transfers; the executor's time: each node's time outside its kernel (* older rows: "
        "busy time less kernel time, negative where a device's kernels overlapped); idle: "
        "each device's wall time not busy. Tracing slows the step.",
        "",
        markdown_table(["config", "devices", "options", "code", "whole: traced",
                        "whole: ops",
                        "whole: executor", "traced", "ops", "plumbing", "sources",
                        "executor", "idle"], where)])


def main(argv) -> int:
    del argv
    stored = read_results("overhead", FLAGS.fresh)
    if "rows" not in stored or isinstance(stored["rows"], list):
        stored["rows"] = {}
    configs = [c for c in FLAGS.configs.split(",") if c] or list(CONFIGS)
    devices = [int(d) for d in FLAGS.devices.split(",")]
    for config in configs:
        for row in measure(config, devices):
            key = (f"{row['config']}@{row['devices']}:{'seq' if row['sequential'] else 'free'}"
                   + (f":rb{row['replicate_below']}" if row["replicate_below"] else "")
                   + (f":once{row['compute_once_below']}" if row["compute_once_below"] else "")
                   + (f":fb{row['flop_bytes']}:tb{row.get('transfer_bytes', 0.0)}"
                      if "flop_bytes" in row else "")
                   + (f":ps{row['pipeline_stages']}" if row["pipeline_stages"] != 1 else "")
                   + (f":mb{row['micro_batches']}" if row["micro_batches"] > 1 else "")
                   + (":onednn" if row["onednn"] else "") + f":{row['code']}")
            stored["rows"][key] = row
        write_results("overhead", stored, table)
    print(table(stored))
    return 0


if __name__ == "__main__":
    timed_kernels()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
