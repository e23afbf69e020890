"""Memory against step time: partitioning alone, with early updates, with recomputation,
with pipeline stages.

    python bench/frontier.py                          # both configs, every budget (~15 min)
    python bench/frontier.py --configs=lstm-10-8192 --budgets=8,16

For WResNet-152 widen 10 and LSTM-10 hidden 8192 (batch 8, bench/common.py) at 8 devices,
and the largest of each that partitioning alone fits in 16 GiB (bench/results/memory.md),
each mix of step rewrites (search/plan.step_graph): partitioning alone; updates early
(reorder.updates_early: each update as soon as its gradient is complete, gradient sums as
running sums); and those with recomputation (recompute.py: CHEAP, SEGMENTS); and early
updates with 2 or 4 pipeline stages (search/pipeline.py) over a step of as many
micro-batches (models.build micro_batches; a micro-batch's batch statistics are its own, so
WResNet's pipelined step is GPipe's, not the whole batch's). Per mix: the
smallest estimated peak per device the search reaches, and per budget (GiB per device) the
fastest plan that fits among those the search gives at a range of memory weights, its
step time predicted on the `--profile` (search/simulate.py; h200_8: measured on one H200).
Per budget, the chosen mix is the fastest that fits. Every figure is an estimate or a
prediction of tofu_tf's models, not a measurement. Results: bench/results/frontier.{json,
md,png}.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).parent))
from common import (RESULTS, load, markdown_table, paper_config,  # noqa: E402
                    read_results, write_results)

FLAGS = flags.FLAGS
flags.DEFINE_list("configs", ["wresnet-152-w10", "lstm-10-8192", "wresnet-152-w16",
                                "lstm-10-9216"],
                  "paper-shaped configs (bench/common.paper_config): the frontier's two, and "
                  "the largest that partitioning alone fits in 16 GiB per device")
flags.DEFINE_list("budgets", ["4", "8", "12", "16"], "GiB per device")
flags.DEFINE_integer("devices", 8, "devices")
flags.DEFINE_string("profile", "h200_8", "search/simulate.py profile for the step time")
flags.DEFINE_list("mixes", None, "the mixes to (re)evaluate (default: all)")
flags.DEFINE_bool("plot_only", False, "redraw the plot and the table from the results")

GIB = 2 ** 30
# Memory weights (bytes moved per byte stored) the search runs at: search/plan.py's range.
WEIGHTS = [0.0] + [2.0 ** k for k in range(-6, 17, 2)]
# mix -> (updates early, recomputation policy, pipeline stages = micro-batches)
MIXES = {"partition": (False, "none", 1), "early updates": (True, "none", 1),
         "early + cheap": (True, "cheap", 1), "early + segments": (True, "segments", 1),
         "early + 2 stages": (True, "none", 2), "early + 4 stages": (True, "none", 4)}


def evaluate(graph, early: bool, policy: str, stages: int, devices: int, profile) -> dict:
    """The mix's plans at every memory weight of WEIGHTS: (peak, bytes, predicted step)."""
    from tofu_tf.op_semantics.catalog import catalog
    from tofu_tf.options import Options, Recompute
    from tofu_tf.search.pipeline import assign_stages, split_topology
    from tofu_tf.search.recompute import candidates, recompute
    from tofu_tf.search.reorder import updates_early
    from tofu_tf.search.problem import SearchCache
    from tofu_tf.search.recursive import search
    from tofu_tf.search.simulate import plan_step_time
    from tofu_tf.search.topology import Topology
    topology, options, stage_of = Topology.default(devices), Options(), None
    g = updates_early(graph) if early else graph
    ops = candidates(g, catalog(g), Recompute(policy))
    g = recompute(g, ops)
    if stages > 1:
        topology = split_topology(topology, stages)[1]
        options, stage_of = Options(pipeline_stages=stages), assign_stages(g, stages)
    start, cache, points = time.perf_counter(), SearchCache(), []
    for weight in WEIGHTS:
        result = search(g, topology, memory_weight=weight, cache=cache, options=options)
        step = plan_step_time(g, result, profile, stages=stage_of)
        points.append({"weight": weight, "peak": result.memory.peak_bytes,
                       "bytes_moved": result.total_bytes, "seconds": step.seconds,
                       "compute_seconds": step.compute_seconds})
    return {"recomputed_ops": len(ops), "points": points,
            "smallest_peak": min(p["peak"] for p in points),
            "search_seconds": time.perf_counter() - start}


def fastest(row: dict, budget: int) -> dict | None:
    """The mix's fastest plan whose peak fits `budget` (None: none does)."""
    fits = [p for p in row["points"] if p["peak"] <= budget]
    return min(fits, key=lambda p: p["seconds"]) if fits else None


def table(stored: dict) -> str:
    lines = ["# Memory against step time: partitioning, early updates, recomputation, "
             "pipeline stages", "",
             f"Command: `{stored.get('command', '')}`  ", f"Machine: {stored.get('machine')}",
             "", f"{stored.get('devices', 8)} devices; step time predicted on the "
             f"`{stored.get('profile')}` profile (search/simulate.py); peaks estimated "
             "(search/memory.py). Each mix is searched at memory weights 0 and 2^-6..2^16 "
             "(bytes moved per byte stored); per budget, its fastest plan that fits. Chosen: "
             "the fastest over the mixes, against partitioning alone's. Pipeline mixes: "
             "the step accumulates gradients over as many micro-batches as stages (batch 8: "
             "micro-batches of 4 or 2), stages balanced by what each holds "
             "(search/pipeline.py), the step time list-scheduled over the stages "
             "(simulate.pipelined_step_time).", ""]
    for name, mixes in stored.get("configs", {}).items():
        lines += [f"## {name}", "", markdown_table(
            ["mix", "recomputed ops", "smallest peak GiB"] +
            [f"{b} GiB: step ms" for b in stored["budgets_gib"]],
            [[mix, row["recomputed_ops"], f"{row['smallest_peak'] / GIB:.2f}"] +
             [f"{cell['seconds'] * 1e3:.1f}" if cell else "does not fit"
              for cell in (fastest(row, b * GIB) for b in stored["budgets_gib"])]
             for mix, row in ((m, mixes[m]) for m in MIXES if m in mixes)]), ""]
        chosen = []
        for b in stored["budgets_gib"]:
            fits = [(fastest(row, b * GIB)["seconds"], mix, fastest(row, b * GIB))
                    for mix, row in mixes.items() if fastest(row, b * GIB)]
            alone = fastest(mixes["partition"], b * GIB)
            if not fits:
                smallest = min(row["smallest_peak"] for row in mixes.values())
                chosen.append([f"{b}", "none fits", "-", "-",
                               f"smallest reachable peak {smallest / GIB:.2f} GiB"])
                continue
            seconds, mix, cell = min(fits, key=lambda f: f[0])
            chosen.append([f"{b}", mix, f"{cell['peak'] / GIB:.2f}", f"{seconds * 1e3:.1f}",
                           f"{seconds / alone['seconds']:.2f}x" if alone else
                           "partitioning alone does not fit"])
        lines += ["Chosen per budget:", "", markdown_table(
            ["budget GiB", "mix", "peak GiB", "step ms", "vs partitioning alone"], chosen), ""]
    return "\n".join(lines)


def plot(stored: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    configs = stored.get("configs", {})
    fig, axes = plt.subplots(1, len(configs), figsize=(6 * len(configs), 4.5), squeeze=False)
    colors = dict(zip(MIXES, ("tab:red", "tab:green", "tab:blue", "tab:orange",
                              "tab:purple", "tab:brown")))
    for ax, (name, mixes) in zip(axes[0], configs.items()):
        for mix in (m for m in MIXES if m in mixes):
            points = sorted((p["peak"] / GIB, p["seconds"] * 1e3) for p in mixes[mix]["points"])
            ax.plot(*zip(*points), marker="o", label=mix, color=colors[mix])
        ax.set_title(f"{name}, {stored.get('devices', 8)} devices")
        ax.set_xlabel("estimated peak per device (GiB)")
        ax.set_ylabel(f"predicted step (ms, {stored.get('profile')})")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "frontier.png", dpi=100)
    plt.close(fig)


def main(argv) -> int:
    del argv
    if FLAGS.plot_only:
        stored = read_results("frontier", fresh=False)
        (RESULTS / "frontier.md").write_text(table(stored) + "\n")
        plot(stored)
        return 0
    from tofu_tf.search.simulate import PROFILES
    stored = read_results("frontier", fresh=False)
    budgets_gib = [int(b) for b in FLAGS.budgets]
    stored.update(devices=FLAGS.devices, profile=FLAGS.profile, budgets_gib=budgets_gib)
    for name in FLAGS.configs:
        model, sizes = paper_config(name)
        graphs = {}
        for mix, (early, policy, stages) in MIXES.items():
            if FLAGS.mixes and mix not in FLAGS.mixes:
                continue
            if stages not in graphs:
                graphs[stages] = load(model, {**sizes, "micro_batches": stages})[0]
            row = evaluate(graphs[stages], early, policy, stages, FLAGS.devices,
                           PROFILES[FLAGS.profile])
            stored.setdefault("configs", {}).setdefault(name, {})[mix] = row
            print(f"{name} {mix}: smallest {row['smallest_peak'] / GIB:.2f} GiB, "
                  f"{row['search_seconds']:.0f} s", flush=True)
            write_results("frontier", stored, table)
    print(write_results("frontier", stored, table))
    plot(stored)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
