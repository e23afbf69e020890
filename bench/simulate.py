"""Calibrate the step-time simulators on this CPU and report their error.

    python bench/simulate.py                       # both sections below
    python bench/simulate.py --sections=graph --configs=mlp,lstm --device_counts=1,8

Section `graph` (tofu_tf/runtime/stepmodel.py, the model of the emitted graph's nodes):
each config of common.CONFIGS (tiny and medium) at 1 (unpartitioned), 2, 4 and 8 logical
CPU devices is timed (median of `--steps`, medium `--medium_steps`; a tiny config: the
least median of 5 rounds, its device counts taking turns) and traced once
(TensorFlow's step stats: every node's kernel time). The configs split in two halves,
each model once in each: the calibration half fits the kernel coefficients per op family
(on its traced kernels' shares of the step) and then the executor's constants (on its
step times at every device count); the held-out half (`HELD_OUT`) is predicted with
them, and its error is the figure. A second evaluation (`--timed_above`, results under
graph_timed) gives the kernels the laws put at 5 us or more, in either half, their time
run alone instead (one op on constant inputs, per shape and attributes: what a kernel
costs measured where it can be, as FlexFlow's simulator does, not fitted), and the cores
each keeps busy (its time with one copy per core at once); its held-out figure then
measures the schedule, the executor's constants and the laws of the smallest kernels.
Section `plan` (tofu_tf/search/simulate.py, the plan-level model the paper comparison
uses):

1. Peak FLOP/s (a 2048x2048 float32 MatMul) and memory bandwidth (a 64 Mi-element AddV2)
   of this machine, measured through TensorFlow (median of 5).
2. Each tiny reference model (sgd, float32, batch 8) is timed unpartitioned on one device
   and partitioned over 8 logical devices (median of `--steps` after a warm-up).
3. Three constants are fitted by non-negative least squares (scipy's NNLS) on what the
   roofline leaves unexplained: the per-kernel and per-step overheads from the one-device
   runs, then the per-transfer latency from the partitioned runs. The error of every prediction is then reported (median and
   worst): the model cannot see the slices, concats and sends the rewrite adds, only the
   plan's transfers, so its error on partitioned tiny models is large; it is reported,
   not hidden.
Results: bench/results/simulate.{json,md}.

`--device=gpu` needs TensorFlow with a GPU. Where a GPU machine has no TensorFlow,
bench/gpu_kernels.py (per-family kernel laws) and bench/gpu_ops.py (the plan simulator's
kernel law against the paper configs' own kernels, held out) measure the GPU through
PyTorch: the same cuBLAS and cuDNN kernels.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).parent))
from common import (CONFIGS, markdown_table, median_seconds, read_results,  # noqa: E402
                    timed_kernels, write_results)

FLAGS = flags.FLAGS
flags.DEFINE_list("sections", ["plan", "graph"], "which simulators to calibrate")
flags.DEFINE_string("models", "mlp,wresnet,lstm,transformer", "plan: comma-separated tiny models")
flags.DEFINE_integer("devices", 8, "plan: logical CPU devices")
flags.DEFINE_integer("steps", 30, "timed steps (graph: of a tiny config)")
flags.DEFINE_string("configs", "", "graph: configs (default: all of common.CONFIGS)")
flags.DEFINE_list("device_counts", ["1", "2", "4", "8"], "graph: logical CPU devices")
flags.DEFINE_integer("medium_steps", 3, "graph: timed steps of a medium config")
flags.DEFINE_enum("device", "cpu", ["cpu", "gpu"], "graph: cpu (logical CPU devices at "
                  "--device_counts) or gpu (unpartitioned steps on GPU:0 only, one GPU: the "
                  "kernel laws and the executor there, results under graph_gpu)")
flags.DEFINE_enum("kernel_time", "share", ["share", "wall"], "graph: the kernel time the "
                  "laws are fitted to: share (each moment of a kernel's run, at most a "
                  "core's worth while more kernels than cores ran, stepmodel.kernel_shares, "
                  "scaled to the untraced step) or "
                  "wall (its traced wall time)")
flags.DEFINE_float("timed_above", 5e-6, "graph: also evaluate the model with the kernels "
                   "the laws put at this many seconds or more timed alone "
                   "(stepmodel.time_kernels, per shape and attributes) in place of their "
                   "laws (results under graph_timed); 0: the laws alone")
flags.DEFINE_string("runs_cache", None, "graph: keep the measured runs in this pickle and "
                    "reuse them when it exists (refit the model without measuring again)")

# The graph section's held-out configs: each model once here, once in the calibration half.
HELD_OUT = ("wresnet", "lstm", "mlp-medium", "transformer-6-512")



def machine_peaks() -> tuple[float, float]:
    import tensorflow as tf
    from tofu_tf.runtime.session import session_config
    graph = tf.Graph()
    with graph.as_default():
        a = tf.random.normal([2048, 2048])
        b = tf.random.normal([2048, 2048])
        product = tf.reduce_sum(tf.matmul(a, b))
        x = tf.Variable(tf.zeros([64 * 2 ** 20]))
        y = tf.Variable(tf.ones([64 * 2 ** 20]))
        added = tf.reduce_sum(x + y)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph, config=session_config(1)) as session:
        session.run(init)
        matmul = median_seconds(lambda: session.run(product), 5)
        add = median_seconds(lambda: session.run(added), 5)
    flops = 2 * 2048 ** 3 / matmul
    bandwidth = 3 * 4 * 64 * 2 ** 20 / add          # two reads, one write
    return flops, bandwidth


def measure(model: str) -> dict:
    from tofu_tf.api import optimize
    from tofu_tf.models import build
    from tofu_tf.runtime.session import Runner, SingleDevice
    step = build(model, optimizer="sgd", graph_only=True, batch_size=8)
    feeds = dict(zip(step.feeds, step.sample_batch(0)))
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        values = single.values()
        one = median_seconds(lambda: single.run(feeds), FLAGS.steps)
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                         num_devices=FLAGS.devices)
    with Runner(optimized, values) as runner:
        many = median_seconds(lambda: runner.run(feeds), FLAGS.steps)
    return {"model": model, "single_seconds": one, "partitioned_seconds": many,
            "graph": optimized.graph}


def predict(graph, profile, devices: int):
    from tofu_tf.search.recursive import search
    from tofu_tf.search.simulate import plan_step_time, single_step_time
    from tofu_tf.search.topology import Topology
    result = search(graph, Topology.default(devices))
    return single_step_time(graph, profile), plan_step_time(graph, result, profile), result


def plan_section() -> dict:
    from tofu_tf.search.simulate import PROFILES
    flops, bandwidth = machine_peaks()
    base = replace(PROFILES["this_cpu"], peak_flops=flops, memory_bandwidth=bandwidth,
                   op_overhead=0.0, link_latency=0.0)
    rows = [measure(m) for m in FLAGS.models.split(",") if m]
    for row in rows:
        single, parted, result = predict(row["graph"], base, FLAGS.devices)
        row.update(single_base=single.seconds, single_ops=single.ops,
                   parted_base=parted.seconds, parted_ops=parted.ops,
                   transfers=sum(len(level.breakdown) * m for level, m in
                                 zip(result.levels, result.multipliers)))
    import numpy as np
    from scipy.optimize import nnls
    # Rows scaled by 1 / measured: the fit minimises relative errors.
    (overhead, per_step), _ = nnls(
        np.array([[r["single_ops"] / r["single_seconds"], 1.0 / r["single_seconds"]]
                  for r in rows]),
        np.array([1.0 - r["single_base"] / r["single_seconds"] for r in rows]))
    share = FLAGS.devices / (base.cores or FLAGS.devices)    # devices per core
    (latency,), _ = nnls(
        np.array([[r["transfers"] / FLAGS.devices / r["partitioned_seconds"]] for r in rows]),
        np.array([(r["partitioned_seconds"] - per_step
                   - (r["parted_base"] + overhead * r["parted_ops"]) * share)
                  / r["partitioned_seconds"] for r in rows]))
    profile = replace(base, op_overhead=overhead, step_overhead=per_step,
                      link_latency=latency)
    table = ["| model | 1 device measured ms | predicted | error | "
             f"{FLAGS.devices} devices measured ms | predicted | error |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    errors = {"single": [], "partitioned": []}
    for row in rows:
        single, parted, _ = predict(row.pop("graph"), profile, FLAGS.devices)
        row.update(single_predicted=single.seconds, partitioned_predicted=parted.seconds)
        e1 = single.seconds / row["single_seconds"] - 1
        e8 = parted.seconds / row["partitioned_seconds"] - 1
        errors["single"].append(abs(e1))
        errors["partitioned"].append(abs(e8))
        table.append(f"| {row['model']} | {1e3 * row['single_seconds']:.2f} | "
                     f"{1e3 * single.seconds:.2f} | {e1:+.0%} | "
                     f"{1e3 * row['partitioned_seconds']:.2f} | {1e3 * parted.seconds:.2f} | "
                     f"{e8:+.0%} |")
    summary = {k: {"median": statistics.median(v), "worst": max(v)} for k, v in errors.items()}
    table += ["", f"Calibrated: peak {flops / 1e9:.1f} GFLOP/s, memory "
              f"{bandwidth / 1e9:.1f} GB/s, per-kernel overhead {overhead * 1e6:.1f} us, "
              f"per-step overhead {per_step * 1e6:.0f} us, per-transfer latency "
              f"{latency * 1e6:.1f} us.",
              f"Error |predicted / measured - 1|: one device median "
              f"{summary['single']['median']:.0%}, worst {summary['single']['worst']:.0%}; "
              f"{FLAGS.devices} devices median {summary['partitioned']['median']:.0%}, "
              f"worst {summary['partitioned']['worst']:.0%}."]
    return {"rows": rows, "profile": asdict(profile), "errors": summary, "table": table}


def graph_runs(configs: list[str], counts: list[int]) -> list[dict]:
    """Per config and device count: measured step seconds, the model's graph, and each
    node's measured kernel seconds (one traced step)."""
    from tofu_tf.api import optimize_imported
    from tofu_tf.importer.graphdef_io import import_graph_def
    from tofu_tf.models import build
    from tofu_tf.runtime import stepmodel
    from tofu_tf.runtime.profile import step_stats
    from tofu_tf.runtime.session import ImportedStep, Runner, SingleDevice
    from tofu_tf.search.topology import Topology
    runs = []
    for config in configs:
        model, sizes, medium = CONFIGS[config]
        steps, warmup = (FLAGS.medium_steps, 1) if medium else (FLAGS.steps, 3)
        step = build(model, optimizer="sgd", graph_only=True, **sizes)
        feeds = dict(zip(step.feeds, step.sample_batch(0)))
        with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
            values = single.values()
        imported = import_graph_def(step.graph_def, list(step.fetches), feeds=list(step.feeds))
        sessions = []             # (devices, runner, graph_def, fetches, run)
        for n in counts:
            if n == 1:         # the graph the planner partitions (inlined), run whole
                runner = ImportedStep(imported)
                runner.load(values)
                fetches = list(imported.graph.fetches)
                sessions.append((n, runner, imported.graph_def, fetches,
                                 functools.partial(runner.run, feeds, fetches)))
            else:
                optimized = optimize_imported(imported, Topology.default(n),
                                              feeds=list(step.feeds))
                runner = Runner(optimized, values)
                sessions.append((n, runner, optimized.graph_def, optimized.fetches,
                                 functools.partial(runner.run, feeds)))
        # Tiny steps: the least of `rounds` medians, the device counts taking turns, so
        # that a slow spell of this shared machine does not decide a figure.
        rounds = 1 if medium else 5
        best = {n: float("inf") for n, *_ in sessions}
        for _ in range(rounds):
            for n, _, _, _, run in sessions:
                best[n] = min(best[n], median_seconds(run, steps, warmup))
        for n, runner, graph_def, fetches, _ in sessions:
            stats, _ = step_stats(runner.session, fetches, feeds)
            runner.close()
            graph = stepmodel.step_graph(graph_def, fetches)
            runs.append({"config": config, "devices": n, "medium": medium,
                         "measured": best[n], "step": graph,
                         "step_stats": stats.SerializeToString(),
                         "graph_def": graph_def.SerializeToString()})
            print(f"{config} @{n}: {1e3 * best[n]:.2f} ms, {len(graph.nodes)} nodes, "
                  f"{graph.edges} cross-device edges", flush=True)
    return runs


def graph_section() -> dict[str, dict]:
    """{"graph": the model with the laws alone, "graph_timed": with the kernels the laws put
    at `--timed_above` or more timed alone} (GPU: {"graph_gpu": ...}), on the same runs."""
    import pickle

    configs = [c for c in FLAGS.configs.split(",") if c] or list(CONFIGS)
    cache = Path(FLAGS.runs_cache) if FLAGS.runs_cache else None
    if cache is not None and cache.exists():
        runs = pickle.loads(cache.read_bytes())
    else:
        counts = [1] if FLAGS.device == "gpu" else [int(n) for n in FLAGS.device_counts]
        runs = graph_runs(configs, counts)
        if cache is not None:
            cache.write_bytes(pickle.dumps(runs))
    for r in runs:
        r["samples"] = kernel_samples(r)
    if FLAGS.device == "gpu":
        return {"graph_gpu": evaluate(runs, False)}
    out = {"graph": evaluate(runs, False)}
    if FLAGS.timed_above > 0:
        out["graph_timed"] = evaluate(runs, True, cache)
    return out


def evaluate(runs: list[dict], timed: bool, cache: Path | None = None) -> dict:
    """The model fitted on the calibration half of `runs` and its error on both halves;
    `timed`: with the large kernels timed alone (kept beside the runs `cache`)."""
    import statistics

    from tofu_tf.runtime import stepmodel
    fitting = [r for r in runs if r["config"] not in HELD_OUT]
    kernels = stepmodel.fit_kernels([s for r in fitting for s in r["samples"]])
    cores = _cores()
    if timed:
        alone, together = kernels_alone(runs, kernels, cores, cache)
        kernels = replace(kernels, timed=alone,
                          cores=stepmodel.busy_cores(alone, together, cores))
    executor = stepmodel.fit_executor([(r["step"], r["measured"]) for r in fitting],
                                      kernels, cores)
    rows, errors = [], {"held_out": [], "calibration": []}
    for r in runs:
        predicted = stepmodel.predict(r["step"], kernels, executor)
        error = predicted.seconds / r["measured"] - 1
        held = r["config"] in HELD_OUT
        errors["held_out" if held else "calibration"].append(abs(error))
        rows.append({"config": r["config"], "devices": r["devices"], "medium": r["medium"],
                     "held_out": held, "measured": r["measured"],
                     "predicted": predicted.seconds, "work_bound": predicted.work_bound,
                     "path_bound": predicted.path_bound, "error": error,
                     "nodes": len(r["step"].nodes), "edges": r["step"].edges,
                     "kernels": kernel_sums(r["samples"], kernels)})
    summary = {k: {"median": statistics.median(v), "worst": max(v), "runs": len(v)}
               for k, v in errors.items() if v}
    return {"rows": rows, "errors": summary, "command": " ".join(sys.argv),
            "timed_kernels": len(kernels.timed), "timed_above": FLAGS.timed_above if timed else 0,
            "busy_cores": sorted(kernels.cores.values()),
            "calibration": stepmodel.Calibration(kernels, executor).to_json()}


def kernels_alone(runs: list[dict], kernels, cores: int,
                  cache: Path | None) -> tuple[dict[str, float], dict[str, float]]:
    """Kernel key -> seconds run alone, and seconds of `cores` copies run at once, for
    every kernel of `runs` the laws put at `--timed_above` or more (kept beside the runs
    cache)."""
    import pickle

    from tensorflow.core.framework import graph_pb2

    from tofu_tf.runtime import stepmodel
    path = cache.with_suffix(".kernels.pkl") if cache is not None else None
    alone, together = (pickle.loads(path.read_bytes()) if path is not None and path.exists()
                       else ({}, {}))
    for r in runs:
        nodes = [n for n in r["step"].nodes if n.key not in alone
                 and kernels.seconds(n) >= FLAGS.timed_above]
        if nodes:
            graph_def = graph_pb2.GraphDef.FromString(r["graph_def"])
            alone.update(stepmodel.time_kernels(graph_def, nodes, repeats=9))
            if cores > 1:
                together.update(stepmodel.time_kernels(graph_def, nodes, repeats=9,
                                                       copies=cores))
    if path is not None:
        path.write_bytes(pickle.dumps((alone, together)))
    return alone, together


def _cores() -> int:
    """The cores kernels share: this CPU's, or a GPU's one stream."""
    return 1 if FLAGS.device == "gpu" else os.cpu_count() or 1


def kernel_samples(run: dict) -> list:
    """(node, seconds) of a run's traced kernels: each kernel's share of the step
    (`--kernel_time=share`), scaled by the untraced step's time over the traced one's
    (tracing slows a tiny step 2-3.5x: bench/results/simulate.md), or its wall time."""
    from tensorflow.core.framework import step_stats_pb2

    from tofu_tf.runtime import stepmodel
    stats = step_stats_pb2.StepStats.FromString(run["step_stats"])
    if FLAGS.kernel_time == "share":
        scale = min(1.0, run["measured"] / stepmodel.traced_seconds(stats))
        times = {name: scale * t
                 for name, t in stepmodel.kernel_shares(stats, _cores()).items()}
    else:
        times = stepmodel.kernel_times(stats)
    return [(node, times[node.name]) for node in run["step"].nodes if node.name in times]


def kernel_sums(samples, kernels) -> dict[str, list[float]]:
    """Per family: [measured kernel seconds (`kernel_samples`), the model's] summed over a
    traced step's nodes."""
    sums: dict[str, list[float]] = {}
    for node, seconds in samples:
        pair = sums.setdefault(node.family, [0.0, 0.0])
        pair[0] += seconds
        pair[1] += kernels.seconds(node)
    return sums


def kernel_table(rows: list[dict]) -> list[str]:
    """Where the model misses, per run: the measured kernels against the model's (laws,
    or times alone), and against the step, and the family whose summed kernels the model
    misses most."""
    table = []
    for r in rows:
        sums = r.get("kernels")
        if not sums:
            continue
        measured = sum(m for m, _ in sums.values())
        law = sum(p for _, p in sums.values())
        worst = max(sums, key=lambda f: abs(sums[f][0] - sums[f][1]))
        table.append([r["config"], r["devices"], "yes" if r["held_out"] else "",
                      _ms(r["measured"]), _ms(measured), _ms(law),
                      f"{measured / r['measured']:.2f}",
                      f"{worst}: {_ms(sums[worst][0])} / {_ms(sums[worst][1])}"])
    if not table:
        return []
    return ["Kernels against the laws (one traced step; ms): measured kernels sum the "
            "kernel times the laws are fitted to (`--kernel_time`: shares, each moment of a "
            "kernel's run counted at most a core's worth while more kernels than cores "
            "ran; wall times count kernels that ran at once each whole, and kernels / step "
            "above 1 is that overlap); model: "
            "the laws, or a kernel's time alone where it was timed (`--timed_above`). "
            "Largest miss: the family whose summed kernels differ most from the model's, "
            "measured / model.", "",
            markdown_table(["config", "devices", "held out", "step ms", "kernels ms",
                            "model ms", "kernels / step", "largest miss"], table), ""]


def _spread(values: list[float]) -> str:
    if not values:
        return "none measured"
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return (f"median {statistics.median(values):.2f}, quartiles {quartiles[0]:.2f} and "
            f"{quartiles[2]:.2f}, most {max(values):.2f}")


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.2f}" if seconds < 10 else f"{1e3 * seconds:.0f}"


def render(stored: dict) -> str:
    lines = ["# Step-time simulators against measured steps", ""]
    for key, where in (("graph", "logical CPU devices"),
                       ("graph_timed", "logical CPU devices, kernels timed alone"),
                       ("graph_gpu", "one GPU")):
        graph = stored.get(key)
        if not graph:
            continue
        cal = graph["calibration"]
        ex = cal["executor"]
        timed = (f"Kernels the laws put at {graph['timed_above'] * 1e6:.0f} us or more "
                 f"({graph['timed_kernels']} kinds) take their time run alone "
                 "(`stepmodel.time_kernels`), on held-out configs too: measured, not "
                 "fitted; and the cores each keeps busy, from its time with "
                 f"{cal['executor']['cores']} copies at once (`stepmodel.busy_cores`: "
                 f"{_spread(graph.get('busy_cores', []))})."
                 if graph.get("timed_kernels") else "")
        lines += [f"## The emitted graph's nodes on {where} (tofu_tf/runtime/stepmodel.py)",
                  "", timed, "",
                  f"Command: `{graph.get('command', '')}`. Error: predicted / measured - 1. "
                  "Held-out configs (yes) were not used to fit anything.", "",
                  markdown_table(["config", "devices", "held out", "measured ms",
                                  "predicted ms", "error", "work bound ms", "path bound ms",
                                  "nodes", "cross-device edges"],
                                 [[r["config"], r["devices"], "yes" if r["held_out"] else "",
                                   _ms(r["measured"]), _ms(r["predicted"]),
                                   f"{r['error']:+.0%}", _ms(r["work_bound"]),
                                   _ms(r["path_bound"]), r["nodes"], r["edges"]]
                                  for r in graph["rows"]]), ""]
        for name, e in sorted(graph["errors"].items(), key=lambda kv: kv[0] != "held_out"):
            lines.append(f"- {name.replace('_', '-')} ({e['runs']} runs): median "
                         f"{e['median']:.0%}, worst {e['worst']:.0%}")
        lines += [""] + kernel_table(graph["rows"])
        lines += ["", f"Executor: {ex['node_overhead'] * 1e6:.2f} us per node, "
                  f"{ex['edge_cost'] * 1e6:.2f} us per cross-device edge, "
                  f"{ex['edge_latency'] * 1e6:.2f} us edge latency, {ex['cores']} cores "
                  f"and inter-op threads, {ex['step_overhead'] * 1e6:.0f} us per step. "
                  "Kernel laws per op type, and per family for rarer types (fixed us, ns per "
                  "KB, ns per MFLOP):", "",
                  markdown_table(["op type or family", "fixed us", "ns per KB",
                                  "ns per MFLOP"],
                                 [[f, f"{v[0] * 1e6:.2f}", f"{v[1] * 1e9 * 1e3:.2f}",
                                   f"{v[2] * 1e9 * 1e6:.2f}"]
                                  for f, v in sorted(cal["kernels"].items())]), ""]
    plan = stored.get("plan")
    if plan:
        lines += ["## The plan (tofu_tf/search/simulate.py)", ""] + plan["table"]
    return "\n".join(lines)


def main(argv) -> int:
    del argv
    stored = read_results("simulate", False)
    stored = {k: stored[k] for k in ("plan", "graph", "graph_timed", "graph_gpu")
              if k in stored}
    if "plan" in FLAGS.sections:
        stored["plan"] = plan_section()
    if "graph" in FLAGS.sections:
        stored.update(graph_section())
    print(write_results("simulate", stored, render))
    return 0


if __name__ == "__main__":
    timed_kernels()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
