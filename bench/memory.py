"""Memory benchmark: per-device peaks of the paper configurations, and the largest models
that fit a per-device budget.

    python bench/memory.py                                   # both sections (~30 min)
    python bench/memory.py --sections=configs --only=wresnet-152-w10,lstm-10-8192
    python bench/memory.py --sections=largest
    python bench/memory.py --sections=plot                   # redraw from the results

Every figure is the estimate of tofu_tf's memory model (search/memory.py: liveness over
the step in its order; tests/memory holds it within 15% of TensorFlow's own allocation
records on the tiny models), in bytes per device:
- configs: at `--devices`, the unpartitioned step on one device, its ideal share
  (single / devices), data parallelism (the data_parallel baseline: weights, gradients and
  slots replicated), tofu's least-communication plan, the least-communication plan within a
  budget of `--budget_ratio` x the ideal share, and the smallest peak the search reaches.
- largest: the largest WResNet-152 widen factor and LSTM-10 hidden size whose peak fits
  12 GiB and 16 GiB per device on 1 device, with data parallelism on 8, with tofu on 8
  (the smallest peak its search reaches), and with tofu on 8 over the step rewritten to
  hold less (updates early, CHEAP recomputation), with the parameters at each size.
Results go to bench/results/memory.{json,md} and memory.png.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).parent))
from common import (RESULTS, configurations, load, read_results,  # noqa: E402
                    write_results)

FLAGS = flags.FLAGS
flags.DEFINE_string("sections", "configs,largest", "comma-separated sections to run")
flags.DEFINE_string("only", "", "comma-separated configuration names (default: all)")
flags.DEFINE_integer("devices", 8, "devices")
flags.DEFINE_float("budget_ratio", 1.15, "the budget, as a multiple of single / devices")
flags.DEFINE_bool("fresh", False, "start from empty results instead of merging")

GIB = 2 ** 30
MODES = ("single", "data_parallel", "tofu_min", "tofu_min_rewritten")
BUDGETS = {"12GiB": 12 * GIB, "16GiB": 16 * GIB}
# (model, sizes but the varied one, varied size, candidate values in increasing order)
LARGEST = {
    "wresnet-152": ("wresnet", dict(depth=152, base_width=64, image_size=224,
                                    num_classes=1000, batch_size=8),
                    "widen", list(range(1, 41))),
    "lstm-10": ("lstm", dict(layers=10, steps=20, embedding=512, vocab=512, num_classes=512,
                             batch_size=8),
                "hidden", list(range(512, 32768 + 1, 512))),
}


def peaks(graph, devices: int) -> dict:
    """Per-device peak bytes: one device; data parallelism; tofu's plan; its minimum; its
    minimum with the step rewritten to hold less (updates early, and also CHEAP
    recomputation: search/plan.step_graph); and the trainable parameters."""
    from tofu_tf.op_semantics.catalog import catalog
    from tofu_tf.options import Recompute
    from tofu_tf.search.recompute import candidates, recompute
    from tofu_tf.search.reorder import updates_early
    from tofu_tf.search.baselines import data_parallel
    from tofu_tf.search.memory import single_device_peak
    from tofu_tf.search.plan import MAX_MEMORY_WEIGHT
    from tofu_tf.search.recursive import search
    from tofu_tf.search.topology import Topology
    topology = Topology.default(devices)

    def smallest(g) -> int:
        return search(g, topology, memory_weight=MAX_MEMORY_WEIGHT).memory.peak_bytes
    early = updates_early(graph)
    return {"single": single_device_peak(graph).peak_bytes,
            "data_parallel": data_parallel(graph, topology).memory.peak_bytes,
            "tofu_min": smallest(graph),
            "tofu_min_rewritten": min(smallest(early), smallest(recompute(
                early, candidates(early, catalog(early), Recompute.CHEAP)))),
            "parameters": sum(math.prod(v.shape) for v in graph.variables.values()
                              if v.trainable and v.slot_of is None)}


def run_config(graph, devices: int, budget_ratio: float) -> dict:
    from tofu_tf.errors import PlanInfeasibleError
    from tofu_tf.options import Options
    from tofu_tf.search.plan import make_plan
    row = peaks(graph, devices)
    ideal = row["single"] / devices
    plan = make_plan(graph, num_devices=devices)
    row.update(ideal=ideal, tofu=plan.peak_bytes, tofu_bytes_moved=plan.total_bytes,
               tofu_storage=plan.variable_storage, budget=int(budget_ratio * ideal))
    start = time.perf_counter()
    try:
        within = make_plan(graph, num_devices=devices,
                           options=Options(memory_budget_bytes=row["budget"]))
        row.update(budgeted=within.peak_bytes, budgeted_bytes_moved=within.total_bytes,
                   budgeted_fits=within.peak_bytes <= row["budget"])
    except PlanInfeasibleError as error:
        row.update(budgeted=None, budgeted_fits=False, budgeted_error=str(error),
                   budgeted_smallest=error.best_peak_bytes)
    row["budgeted_search_seconds"] = time.perf_counter() - start
    return row


def largest(stored: dict, devices: int) -> dict:
    """Per model, budget and mode: the largest size that fits (0: none)."""
    out = {}
    for name, (model, sizes, varied, values) in LARGEST.items():
        cache = stored.setdefault("largest_peaks", {}).setdefault(name, {})

        def evaluate(value: int) -> dict:
            if not set(MODES + ("parameters",)) <= set(cache.get(str(value), ())):
                graph, _ = load(model, {**sizes, varied: value})
                cache[str(value)] = peaks(graph, devices)
                print(f"  {name} {varied}={value}: " + ", ".join(
                    f"{k} {v / GIB:.2f} GiB" if k in MODES else f"{k} {v / 1e6:.0f}M"
                    for k, v in cache[str(value)].items()), flush=True)
                write(stored)
            return cache[str(value)]

        for budget_name, budget in BUDGETS.items():
            for mode in MODES:
                best = _largest_fitting(values, lambda v: evaluate(v)[mode] <= budget)
                out.setdefault(name, {}).setdefault(budget_name, {})[mode] = best
                if best:
                    out[name][budget_name][mode + "_parameters"] = evaluate(best)["parameters"]
        out[name]["varied"] = varied
    return out


def _largest_fitting(values: list[int], fits) -> int:
    """The largest value with fits(value) (fits is monotone: true, then false); 0: none."""
    if not fits(values[0]):
        return 0
    low, high = 0, len(values)               # fits(values[low]); values[high:] do not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(values[middle]) else (low, middle)
    return values[low]


def table(stored: dict) -> str:
    lines = [f"# Memory per device (estimates, {stored.get('devices', 8)} devices)", "",
             f"Command: `{stored.get('command', '')}`  ", f"Machine: {stored.get('machine')}",
             "", "Peak bytes per device (GiB); x = ratio to the ideal share single / devices.",
             "", "| config | single | ideal | data parallel | tofu (least bytes) | "
             "tofu within budget | budget | tofu minimum |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, row in sorted(stored.get("configs", {}).items()):
        ideal = row["ideal"]

        def cell(value):
            return "—" if value is None else f"{value / GIB:.2f} ({value / ideal:.2f}x)"
        budgeted = cell(row["budgeted"]) if row.get("budgeted") is not None else \
            f"infeasible (min {row['budgeted_smallest'] / GIB:.2f})"
        lines.append(f"| {name} | {row['single'] / GIB:.2f} | {ideal / GIB:.2f} | "
                     f"{cell(row['data_parallel'])} | {cell(row['tofu'])} | {budgeted} | "
                     f"{row['budget'] / GIB:.2f} | {cell(row['tofu_min'])} |")
    if stored.get("largest"):
        lines += ["", "## Largest model that fits", "",
                  "tofu + rewrites: the step with its updates early (gradient sums running) "
                  "and CHEAP recomputation where that holds less (search/plan.step_graph). "
                  "Parameters: trainable, in millions.", "",
                  "| model | budget | 1 device | data parallel, 8 | tofu, 8 | tofu / DP | "
                  "tofu + rewrites, 8 | parameters, rewrites / tofu |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for name, per_budget in stored["largest"].items():
            varied = per_budget["varied"]
            for budget_name in BUDGETS:
                got = per_budget[budget_name]
                ratio = (f"{got['tofu_min'] / got['data_parallel']:.2f}x"
                         if got["data_parallel"] else "DP: none fits")
                rewritten = got.get("tofu_min_rewritten")
                more, alone = (got.get("tofu_min_rewritten_parameters"),
                               got.get("tofu_min_parameters"))
                params = (f"{more / 1e6:.0f}M / {alone / 1e6:.0f}M = {more / alone:.2f}x"
                          if more and alone else "—")
                lines.append(f"| {name} ({varied}) | {budget_name} | {got['single']} | "
                             f"{got['data_parallel']} | {got['tofu_min']} | {ratio} | "
                             f"{rewritten if rewritten is not None else '—'} | {params} |")
    return "\n".join(lines)


def plot(stored: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = sorted(stored.get("configs", {}).items())
    if not rows:
        return
    names = [name for name, _ in rows]
    series = {"data parallel": "data_parallel", "tofu (least bytes)": "tofu",
              "tofu within budget": "budgeted", "tofu minimum": "tofu_min"}
    fig, ax = plt.subplots(figsize=(max(8, len(names) * 0.45), 4.5))
    width = 0.8 / len(series)
    for i, (label, key) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(names))],
               [(row.get(key) or 0) / row["ideal"] for _, row in rows], width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(FLAGS.budget_ratio, color="grey", linewidth=0.8, linestyle="--",
               label=f"{FLAGS.budget_ratio}x ideal")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))])
    ax.set_xticklabels(names, rotation=70, fontsize=7)
    ax.set_ylabel("peak per device / (single / devices)")
    ax.set_title(f"Per-device peak memory at {stored.get('devices', 8)} devices")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "memory.png", dpi=120)
    plt.close(fig)


def write(stored: dict) -> str:
    return write_results("memory", stored, table)


def main(argv) -> int:
    del argv
    stored = read_results("memory", FLAGS.fresh)
    stored["devices"] = FLAGS.devices
    sections = set(FLAGS.sections.split(","))
    if "configs" in sections:
        wanted = [c for c in FLAGS.only.split(",") if c] or list(configurations())
        for name in wanted:
            graph, _ = load(*configurations()[name])
            row = run_config(graph, FLAGS.devices, FLAGS.budget_ratio)
            stored.setdefault("configs", {})[name] = row
            print(f"{name}: single {row['single'] / GIB:.2f} GiB, tofu "
                  f"{row['tofu'] / row['ideal']:.2f}x, data parallel "
                  f"{row['data_parallel'] / row['ideal']:.2f}x, within budget "
                  f"{'fits' if row['budgeted_fits'] else 'infeasible'}", flush=True)
            write(stored)
            del graph
    if "largest" in sections:
        stored["largest"] = largest(stored, FLAGS.devices)
    if sections & {"configs", "largest"}:
        print(write(stored))
    plot(stored)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
