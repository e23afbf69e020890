"""The paper's evaluation, simulated: tofu against the alternatives on three 8-device boxes.

    python bench/paper.py                              # every config, the three profiles
    python bench/paper.py --only=wresnet-50-w4 --profiles=h100_8

For WResNet 50/101/152 x widen 4/6/8/10 and LSTM 4/6/8/10 layers x hidden 4096-10240
(batch 8, bench/common.py) on the paper-era 8-GPU PCIe box, on 8 x H100 and on 8 x H200
(search/simulate.py profiles; the H200's measured by bench/gpu_kernels.py and gpu_ops.py),
the predicted throughput (samples/s) of
- tofu: the least-communication plan whose estimated peak fits the device (a budget of
  the device's memory; none: out of memory);
- Ideal, SmallBatch, Swap, OpPlacement (search/simulate.py states each model).
Every figure is a prediction of tofu_tf's simulator, not a measurement; bench/simulate.py
reports that simulator's error where it can be measured (this CPU). Results go to
bench/results/paper.{json,md} and paper_<profile>.png.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).parent))
from common import (RESULTS, configurations, load, read_results,  # noqa: E402
                    write_results)

FLAGS = flags.FLAGS
flags.DEFINE_string("only", "", "comma-separated configuration names (default: all)")
flags.DEFINE_string("profiles", "paper_pcie_8gpu,h100_8,h200_8",
                    "comma-separated device profiles")
flags.DEFINE_bool("fresh", False, "start from empty results instead of merging")
flags.DEFINE_bool("plot_only", False, "redraw the plots and rewrite paper.md from the stored "
                  "results (error bands from the latest bench/results/simulate.json)")

SYSTEMS = ("tofu", "Ideal", "SmallBatch", "Swap", "OpPlacement")
PAPER_SPEEDUP = "25%-400%"


def run_config(graph, batch: int, profile) -> dict:
    from tofu_tf.errors import PlanInfeasibleError
    from tofu_tf.options import Options
    from tofu_tf.search.baselines import data_parallel
    from tofu_tf.search.memory import single_device_peak
    from tofu_tf.search.plan import search_within_budget
    from tofu_tf.search.simulate import (alternatives, op_placement, plan_step_time,
                                         single_step_time)
    from tofu_tf.search.topology import Topology
    topology = Topology.default(8)
    row: dict = {}
    start = time.perf_counter()
    try:
        tofu = search_within_budget(graph, topology, Options(
            memory_budget_bytes=profile.memory_bytes, step_profile=profile.name))
        step = plan_step_time(graph, tofu, profile)
        row["tofu"] = {"samples_per_second": batch / step.seconds,
                       "peak_bytes": tofu.memory.peak_bytes, "bytes_moved": tofu.total_bytes,
                       "compute_seconds": step.compute_seconds,
                       "communication_seconds": step.communication_seconds}
    except PlanInfeasibleError as error:
        row["tofu"] = {"samples_per_second": None, "peak_bytes": error.best_peak_bytes}
    row["tofu_search_seconds"] = time.perf_counter() - start
    single = single_step_time(graph, profile)
    peak = single_device_peak(graph)
    dp = data_parallel(graph, topology)
    placement = op_placement(graph, 8, peak.peak_bytes, peak.persistent_bytes)
    for alt in alternatives(batch=batch, num_devices=8, profile=profile, single=single,
                            dp=plan_step_time(graph, dp, profile),
                            dp_peak=dp.memory.peak_bytes,
                            dp_persistent=dp.memory.persistent_bytes, placement=placement):
        row[alt.name] = {"samples_per_second": alt.samples_per_second,
                         "peak_bytes": alt.peak_bytes, **alt.detail}
    row["single_peak_bytes"] = peak.peak_bytes
    tofu_rate = row["tofu"]["samples_per_second"]
    row["speedup"] = {name: (tofu_rate / row[name]["samples_per_second"] - 1)
                      for name in SYSTEMS[1:]
                      if tofu_rate and row[name]["samples_per_second"]}
    return row


def error_band(profile: str) -> tuple[float | None, str]:
    """(the plan simulator's median relative error, where it was measured): on `h200_8`,
    its kernel law against one H200's matrix products and convolutions on held-out configs
    (bench/gpu_ops.py); elsewhere, its error on partitioned steps on this CPU
    (bench/simulate.py); None where neither was measured."""
    import json
    if profile == "h200_8" and (RESULTS / "gpu_ops.json").exists():
        held = json.loads((RESULTS / "gpu_ops.json").read_text())["held_out"]
        return held["step_median"], ("bench/results/gpu_ops.md: the kernel law on one H200, "
                                     "held-out configs; transfers not measured")
    path = RESULTS / "simulate.json"
    if not path.exists():
        return None, ""
    plan = json.loads(path.read_text()).get("plan") or {}
    return ((plan.get("errors") or {}).get("partitioned", {}).get("median"),
            "bench/results/simulate.md: partitioned steps on this CPU; not measured on these "
            "GPUs")


def banded(ratio: float, error: float | None) -> str:
    """A speedup (ratio - 1) with the band both predictions' relative error allows."""
    text = f"{ratio - 1:+.0%}"
    if error is None or not 0 <= error < 1:
        return text
    low, high = ratio * (1 - error) / (1 + error), ratio * (1 + error) / (1 - error)
    return f"{text} ({low - 1:+.0%} to {high - 1:+.0%})"


def table(stored: dict) -> str:
    lines = ["# The paper's evaluation, simulated (8 devices, batch 8)", "",
             f"Command: `{stored.get('command', '')}`  ", f"Machine: {stored.get('machine')}",
             "", "Predicted samples/s; OOM: the system cannot run the config on that device "
             "(its estimated peak exceeds the device's memory). Speedup: tofu over the "
             "fastest alternative that runs; in brackets the band that the simulator's "
             "median error allows (each of the two predictions off by that much; each "
             "profile names where its error was measured).", ""]
    for profile, rows in sorted(stored.get("profiles", {}).items()):
        error, source = error_band(profile)
        lines += [f"## {profile}", "", "Error band: " + (f"{error:.0%} ({source})."
                                                         if error is not None else "none."), "",
                  "| config | " + " | ".join(SYSTEMS) +
                  " | tofu vs best runnable alternative |",
                  "|---|" + "---:|" * (len(SYSTEMS) + 1)]
        speedups, cannot = [], {name: 0 for name in SYSTEMS}
        for name, row in sorted(rows.items()):
            cells = []
            for system in SYSTEMS:
                rate = row[system]["samples_per_second"]
                cells.append("OOM" if rate is None else f"{rate:.2f}")
                cannot[system] += rate is None
            others = [row[s]["samples_per_second"] for s in SYSTEMS[1:]
                      if s != "Ideal" and row[s]["samples_per_second"]]
            tofu = row["tofu"]["samples_per_second"]
            if tofu and others:
                speedups.append(tofu / max(others) - 1)
                versus = banded(tofu / max(others), error)
            else:
                versus = "only tofu runs" if tofu else "—"
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {versus} |")
        lines += ["", "Configs each system cannot run: " + ", ".join(
            f"{s} {n}/{len(rows)}" for s, n in cannot.items()) + ".  "]
        if speedups:
            lines.append(f"tofu over the best runnable alternative (Ideal excluded: it "
                         f"assumes unlimited memory): {banded(1 + min(speedups), error)} "
                         f"to {banded(1 + max(speedups), error)} (the paper: "
                         f"{PAPER_SPEEDUP}).")
        lines.append("")
    return "\n".join(lines)


def plot(stored: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for profile, rows in stored.get("profiles", {}).items():
        names = sorted(rows)
        fig, ax = plt.subplots(figsize=(max(8, len(names) * 0.5), 4.5))
        width = 0.8 / len(SYSTEMS)
        rates_all = [rows[n][s]["samples_per_second"] for n in names for s in SYSTEMS]
        floor = min(r for r in rates_all if r) / 2          # where OOM marks go
        for i, system in enumerate(SYSTEMS):
            xs = [x + i * width for x in range(len(names))]
            rates = [rows[n][system]["samples_per_second"] for n in names]
            ax.bar([x for x, r in zip(xs, rates) if r], [r for r in rates if r], width,
                   label=system)
            ax.plot([x for x, r in zip(xs, rates) if not r],
                    [floor] * sum(not r for r in rates), "x", color="black", markersize=5)
        ax.set_yscale("log")
        ax.set_ylim(bottom=floor / 1.5)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))])
        ax.set_xticklabels(names, rotation=70, fontsize=7)
        ax.set_ylabel("samples / s (predicted); x = out of memory")
        ax.set_title(f"tofu and the alternatives on {profile}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(RESULTS / f"paper_{profile}.png", dpi=120)
        plt.close(fig)


def write(stored: dict) -> str:
    return write_results("paper", stored, table)


def main(argv) -> int:
    del argv
    if FLAGS.plot_only:
        stored = read_results("paper", fresh=False)
        (RESULTS / "paper.md").write_text(table(stored) + "\n")
        plot(stored)
        return 0
    from tofu_tf.search.simulate import PROFILES
    stored = read_results("paper", FLAGS.fresh)
    profiles = [PROFILES[p] for p in FLAGS.profiles.split(",") if p]
    wanted = [c for c in FLAGS.only.split(",") if c] or [
        c for c in configurations() if not c.startswith("gpt2")]
    for name in wanted:
        model, sizes = configurations()[name]
        graph, _ = load(model, sizes)
        for profile in profiles:
            row = run_config(graph, sizes["batch_size"], profile)
            stored.setdefault("profiles", {}).setdefault(profile.name, {})[name] = row
            rate = row["tofu"]["samples_per_second"]
            print(f"{name} on {profile.name}: tofu "
                  f"{'OOM' if rate is None else f'{rate:.2f} samples/s'}", flush=True)
            write(stored)
        del graph
    print(write(stored))
    plot(stored)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
