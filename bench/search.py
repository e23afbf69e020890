"""Search benchmark: the paper configurations at 2, 4, 6 and 8 devices, and more.

    python bench/search.py                       # every section (long: ~1 hour)
    python bench/search.py --sections=configs --only=lstm-10-8192 --devices=8 --repeats=1
    python bench/search.py --sections=end_to_end,backends,gap

Sections (each merged into bench/results/search.json; the tables go to search.md):
- configs: each configuration is built as a graph only and imported once, then searched
  `--repeats` times per device count: median search seconds, the plan's bytes, every
  baseline's bytes on the same cost model. Also the search-time ratio per doubling of
  depth (WResNet 50 -> 101, LSTM 4 -> 8 layers) at 8 devices.
- end_to_end: graph build + import + search in a fresh process (TensorFlow's own import
  excluded), median of `--repeats` processes, for the GPT-2-medium-sized Transformer and
  ResNet-50 with training-mode BatchNorm (WResNet-50 widen 1, 224x224, batch 8). The
  step is built as every planning path builds it: graph-only, without the variables'
  initializers (`initializers=False`; the importer would drop them).
- backends: the whole search with the C++ cost op against the NumPy fallback.
- loaded: the two paper configurations at 8 devices, searched with the machine idle and
  again with one CPU-bound process competing (`python -c "while 1: pass"`), medians of
  `--repeats` alternating runs; a design that forks workers must not degrade past 2.5x.
- gap: on the tiny reference models at 2x2, 2x4 and 2x2x2, the recursion alone, the
  search's plan (all levels at once where that problem is small) and at 2x2x2 the
  lookahead (each level by its two-level optimum) against the joint optimum of all levels
  (exact DP over product domains).
- accounts: on the tiny reference models at 2, 4, 8, 2x4 and 2x2x2, the bytes the search
  prices its plan at against the bytes the emitted step moves (its ledger), per level, and
  how much of the search's excess is on tensors that two or more ops read from other
  devices (the emitter sends a region a device lacks once, whoever reads it); without and
  with `Options.shared_reads` (views: such a tensor priced once).
- stock_lookahead: the stock section with `Options(lookahead=True)` (the table reports
  its 8-device rows: three levels, where the lookahead runs).
- views: each configuration at 4 and 8 devices, the search against the same with
  `Options(shared_reads=True)`, at `--flop_bytes` as configs: median search seconds
  (alternating runs), the plans' bytes and their emitted steps' (`--only` reruns the
  configurations it names, the other rows kept).
- stock: every stock Keras model of tofu_tf.models.keras_models (batch 8, its small
  test sizes) at 4, 6 and 8 devices (`Topology.default`: 2x2, 3x2, 2x2x2): the default
  search against the recursion alone (`Options(joint_choices=0)`), bytes and seconds, and
  whether the plan is the joint optimum of all levels.

Each section records the machine it last ran on: the CPU, and the median seconds of a
fixed interpreter loop that uses none of this package (`common.reference_loop_seconds`),
the yardstick to compare timings from different machines or hours by.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

from absl import app, flags

sys.path.insert(0, str(Path(__file__).parent))
from common import (commit_label, configurations, cpu, load, load_imported,  # noqa: E402
                    machine, read_results, write_results)

FLAGS = flags.FLAGS
flags.DEFINE_string("sections", "configs,end_to_end,backends,loaded,gap,accounts",
                    "comma-separated sections to run")
flags.DEFINE_string("only", "", "comma-separated configuration names, or stock model names "
                    "for the stock sections; their rows replace the stored ones (default: all)")
flags.DEFINE_string("e2e_child", "", "internal: measure one end-to-end run and print JSON")
flags.DEFINE_string("devices", "2,4,6,8", "comma-separated device counts")
flags.DEFINE_integer("repeats", 3, "search repetitions (the median is reported)")
flags.DEFINE_bool("baselines", True, "also evaluate the baselines")
flags.DEFINE_bool("fresh", False, "start from empty results instead of merging")
flags.DEFINE_bool("account_detail", False, "accounts: also print, per level, each tensor "
                  "whose search bytes differ from the ledger's, with the ops that move it")
flags.DEFINE_float("flop_bytes", 0.0, "configs and gap: Options.flop_bytes of the plans "
                   "compared (default 0: bytes alone, the baselines' measure; end_to_end "
                   "and loaded time the default search, repeated work priced)")



def run_one(imported, devices: int, repeats: int, with_baselines: bool) -> dict:
    """The search's row; `emitted_bytes`: what the plan's emitted step moves
    (rewrite/pricing.py, which the verifier holds the ledger to)."""
    from tofu_tf.api import predict
    from tofu_tf.search.plan import make_plan
    from tofu_tf.search.topology import Topology
    graph = imported.graph
    topology = Topology.default(devices)
    from tofu_tf.options import Options
    seconds, plan = [], None
    for _ in range(repeats):
        plan = make_plan(graph, topology, options=Options(flop_bytes=FLAGS.flop_bytes))
        seconds.append(plan.search_seconds)
    row = {"devices": devices, "num_ops": plan.num_ops, "num_groups": plan.num_groups,
           "search_seconds": statistics.median(seconds),
           "search_seconds_all": seconds, "plan_bytes": plan.total_bytes,
           "bytes_per_level": list(plan.bytes_per_level), "exact": plan.exact,
           "variable_storage": plan.variable_storage,
           "emitted_bytes": predict(plan, imported)[0].predicted_bytes}
    if with_baselines:
        from tofu_tf.search.baselines import BASELINES
        row["baselines"] = {name: fn(graph, topology).total_bytes
                            for name, fn in BASELINES.items()}
    return row


def depth_doubling(results: dict) -> dict:
    """Search-time ratio per doubling of depth at 8 devices (widest / largest hidden)."""
    pairs = {"wresnet 50->101 (w10)": ("wresnet-50-w10@8", "wresnet-101-w10@8"),
             "lstm 4->8 layers (h8192)": ("lstm-4-8192@8", "lstm-8-8192@8")}
    return {label: results[b]["search_seconds"] / results[a]["search_seconds"]
            for label, (a, b) in pairs.items() if a in results and b in results}


# -- end to end ----------------------------------------------------------------------------

# (model, sizes, target seconds: build + import + search under 1.5 s on this machine
# class, median of 7; the ILP planner's seconds on the same graph, for scale)
END_TO_END = {
    "gpt2-medium": ("transformer", dict(layers=24, d_model=1024, heads=16, seq_len=1024,
                                        vocab=50257, batch_size=8), 1.5, 11.2),
    "resnet50-train-bn": ("wresnet", dict(depth=50, widen=1, base_width=64, image_size=224,
                                          num_classes=1000, batch_size=8), 1.5, 10.3),
}


def end_to_end_child(name: str) -> None:
    importlib.import_module("tensorflow")   # TensorFlow's own import is not in the figure
    from tofu_tf.models import build
    from tofu_tf.importer.graphdef_io import import_graph_def
    from tofu_tf.search.plan import make_plan
    from tofu_tf.search.topology import Topology
    model, sizes, _, _ = END_TO_END[name]
    start = time.perf_counter()
    step = build(model, optimizer="sgd", graph_only=True, initializers=False, **sizes)
    built = time.perf_counter()
    graph = import_graph_def(step.graph_def, step.fetches).graph
    imported = time.perf_counter()
    plan = make_plan(graph, Topology.default(8))
    done = time.perf_counter()
    print(json.dumps({"build": built - start, "import": imported - built,
                      "search": done - imported, "total": done - start,
                      "nodes": len(step.graph_def.node), "ops": plan.num_ops}))


def end_to_end(repeats: int) -> dict:
    """Each run in a fresh process. The package's bytecode is compiled first, as an
    installed package has it: where the environment sets PYTHONDONTWRITEBYTECODE, modules
    loaded inside the timed run (the op descriptions) would else be compiled in every run."""
    import compileall
    import subprocess
    import tofu_tf
    compileall.compile_dir(os.path.dirname(tofu_tf.__file__), quiet=1)
    out = {}
    for name, (_, _, target, reference) in END_TO_END.items():
        runs = []
        for _ in range(repeats):
            proc = subprocess.run([sys.executable, __file__, f"--e2e_child={name}"],
                                  capture_output=True, text=True, check=True)
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        median = {key: statistics.median(r[key] for r in runs)
                  for key in ("build", "import", "search", "total")}
        out[name] = {**median, "runs": runs, "target_seconds": target,
                     "reference_planner_seconds": reference, "devices": 8}
        print(f"{name}: end to end {median['total']:.2f} s (target {target} s)", flush=True)
    return out


# -- C++ op against the NumPy fallback on the whole search ---------------------------------

def backends(repeats: int) -> dict:
    from tofu_tf.cc import cost_op
    from tofu_tf.search.plan import make_plan
    from tofu_tf.search.topology import Topology
    out = {}
    for name in ("wresnet-152-w10", "lstm-10-8192"):
        graph, _ = load(*configurations()[name])
        seconds = {}
        for backend in ("c++", "numpy"):
            cost_op.use_backend(backend)
            seconds[backend] = statistics.median(
                make_plan(graph, Topology.default(8)).search_seconds for _ in range(repeats))
        cost_op.use_backend(None)
        out[name] = {**seconds, "speedup": seconds["numpy"] / seconds["c++"], "devices": 8}
        print(f"{name}: c++ {seconds['c++']:.2f} s, numpy {seconds['numpy']:.2f} s", flush=True)
    return out


# -- search time with a competing CPU-bound process ------------------------------------------

def loaded(repeats: int) -> dict:
    import subprocess

    from tofu_tf.search.plan import make_plan
    from tofu_tf.search.topology import Topology
    out = {}
    for name in ("wresnet-152-w10", "lstm-10-8192"):
        graph, _ = load(*configurations()[name])
        idle, busy = [], []
        for _ in range(repeats):                  # alternate: both see the same drift
            idle.append(make_plan(graph, Topology.default(8)).search_seconds)
            hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
            try:
                time.sleep(0.5)                   # let it take its core
                busy.append(make_plan(graph, Topology.default(8)).search_seconds)
            finally:
                hog.kill()
                hog.wait()
        row = {"idle": statistics.median(idle), "loaded": statistics.median(busy),
               "idle_all": idle, "loaded_all": busy, "devices": 8}
        row["slowdown"] = row["loaded"] / row["idle"]
        out[name] = row
        print(f"{name}: idle {row['idle']:.2f} s, one competing process {row['loaded']:.2f} s "
              f"({row['slowdown']:.2f}x)", flush=True)
        del graph
    return out


# -- recursive plan against the joint optimum ----------------------------------------------

def gap() -> dict:
    """Per tiny model and multi-level topology: the recursion alone (each level fixed
    before the next), the search's plan (all levels at once where the joint problem fits
    `Options.joint_choices`) with its time, the joint optimum, and the recursion under the
    joint optimum's level 1 (how much of the gap level 1 alone causes)."""
    import time

    from tofu_tf.options import Options
    from tofu_tf.search.exact import joint_model, lookahead_search, recursion_under
    from tofu_tf.search.recursive import search
    from tofu_tf.search.topology import Topology
    out = {}
    for model in ("mlp", "wresnet", "lstm", "transformer"):
        graph, _ = load(model, {"batch_size": 8})
        for shape in ("2x2", "2x4", "2x2x2"):
            topology = Topology.parse(shape)
            options = Options(flop_bytes=FLAGS.flop_bytes)
            recursive = search(graph, topology, options=dataclasses.replace(
                options, joint_choices=0)).total_bytes
            start = time.perf_counter()
            plan = search(graph, topology, options=options)
            row = {"recursive_bytes": recursive, "search_bytes": plan.total_bytes,
                   "search_joint": plan.joint, "search_seconds": time.perf_counter() - start}
            out[f"{model}@{shape}"] = row
            if len(topology.levels) > 2:         # each level by its two-level optimum
                start = time.perf_counter()
                ahead = lookahead_search(graph, topology, options=options)
                row.update(lookahead_bytes=ahead.total_bytes,
                           lookahead_seconds=time.perf_counter() - start)
            try:
                joint = joint_model(graph, topology, options=options)
            except Exception as err:          # joint domains past their bound: say so
                row["error"] = str(err)
                continue
            best = joint.solve()
            under = recursion_under(graph, topology, joint.first_level(best.leaves),
                                    options=options)
            row.update({"joint_bytes": best.cost, "gap": (recursive - best.cost) / recursive,
                        "search_gap": (plan.total_bytes - best.cost) / recursive,
                        "under_joint_level1_bytes": under.total_bytes})
            print(f"{model} @ {shape}: recursion gap {row['gap']:.2%}, search gap "
                  f"{row['search_gap']:.2%} ({row['search_seconds']:.2f} s)", flush=True)
    return out


def accounts(shapes=("2", "4", "8", "2x4", "2x2x2")) -> dict:
    """Per tiny model and topology: the search's bytes and the ledger's, per level, and the
    search's excess on tensors two or more ops fetch (the rest is relaying and the other
    differences between the recursion's per-group account and the emitter's)."""
    from collections import Counter

    from tofu_tf.api import optimize
    from tofu_tf.importer.graphdef_io import import_graph_def
    from tofu_tf.models import build
    from tofu_tf.options import Options
    from tofu_tf.rewrite.ledger import STEP_KINDS
    from tofu_tf.search.plan import make_plan
    from tofu_tf.search.topology import Topology
    out = {}
    for model in ("mlp", "wresnet", "lstm", "transformer"):
        step = build(model, optimizer="sgd", graph_only=True, batch_size=8)
        graph = import_graph_def(step.graph_def, step.fetches, feeds=list(step.feeds)).graph
        for shape, shared in itertools.product(shapes, (False, True)):
            topology = Topology.parse(shape)
            options = Options(flop_bytes=FLAGS.flop_bytes, shared_reads=shared)
            start = time.perf_counter()
            plan = make_plan(graph, topology, options=options)
            seconds = time.perf_counter() - start
            optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                                 plan=plan, options=options)
            searched, readers = Counter(), {}
            for level in plan.levels:
                for transfer in level.transfers:
                    searched[transfer.tensor] += level.groups * transfer.bytes
                    if graph.producer(transfer.tensor).name != transfer.op:
                        readers.setdefault(transfer.tensor, set()).add(transfer.op)
            ledger = Counter()
            for transfer in optimized.ledger.transfers:
                if transfer.kind in STEP_KINDS:
                    ledger[transfer.tensor] += transfer.bytes
            excess = sum(searched[t] - ledger[t] for t, ops in readers.items()
                         if len(ops) > 1 and searched[t] > ledger[t])
            ways = tuple(level.ways for level in plan.levels)
            if FLAGS.account_detail:
                _account_detail(plan, optimized.ledger, ways)
            out[f"{model}@{shape}" + (" shared reads" if shared else "")] = {
                "search_bytes": [level.total_bytes for level in plan.levels],
                "ledger_bytes": list(optimized.ledger.step_bytes_per_level(ways)),
                "shared_reads_excess": excess, "search_seconds": seconds}
            print(f"{model} @ {shape}{' shared reads' if shared else ''}: search "
                  f"{plan.total_bytes:.0f} B, ledger {optimized.ledger.step_bytes} B",
                  flush=True)
    return out


def _account_detail(plan, ledger, ways: tuple[int, ...]) -> None:
    """Per level, each tensor the search prices at other bytes than the ledger moves (a
    transfer counts at the outermost level its two devices differ at), and which ops
    move it in each account."""
    from collections import defaultdict
    searched, moved = defaultdict(list), defaultdict(list)
    for index, level in enumerate(plan.levels):
        for transfer in level.transfers:
            searched[index, transfer.tensor].append((transfer.op,
                                                     level.groups * transfer.bytes))
    for index, t in ledger.step_transfers_by_level(ways):
        moved[index, t.tensor].append((t.kind, t.op, t.src, t.dst, t.bytes))
    for key in sorted(set(searched) | set(moved)):
        search_bytes = sum(b for _, b in searched[key])
        ledger_bytes = sum(t[-1] for t in moved[key])
        if search_bytes != ledger_bytes:
            print(f"  level {key[0] + 1} {key[1]}: search {search_bytes:.0f} B "
                  f"{searched[key]}, ledger {ledger_bytes} B (kind, op, src, dst, bytes) "
                  f"{moved[key]}", flush=True)


def views(repeats: int) -> dict:
    """Per paper configuration (and the GPT-2-medium-sized Transformer) at 4 and 8 devices:
    the search against the same with `Options(shared_reads=True)` (views), both at
    `--flop_bytes` (as configs: bytes alone by default), each run `repeats` times
    alternately (both see the same drift of the machine): median search seconds, the bytes
    each plan is priced at and the bytes its emitted step moves."""
    from tofu_tf.api import predict
    from tofu_tf.options import Options
    from tofu_tf.search.plan import make_plan
    from tofu_tf.search.topology import Topology
    out = {}
    for name in wanted_configurations():
        imported, _ = load_imported(*configurations()[name])
        for devices in (4, 8):
            seconds, row = {False: [], True: []}, {"devices": devices, "config": name}
            for _ in range(repeats):
                for shared in (False, True):
                    plan = make_plan(imported.graph, Topology.default(devices),
                                     options=Options(flop_bytes=FLAGS.flop_bytes,
                                                     shared_reads=shared))
                    seconds[shared].append(plan.search_seconds)
            for shared, label in ((False, "plain"), (True, "views")):
                plan = make_plan(imported.graph, Topology.default(devices),
                                 options=Options(flop_bytes=FLAGS.flop_bytes,
                                                 shared_reads=shared))
                row[label] = {"search_seconds": statistics.median(seconds[shared]),
                              "plan_bytes": plan.total_bytes,
                              "emitted_bytes": predict(plan, imported)[0].predicted_bytes}
            out[f"{name}@{devices}"] = row
            print(f"{name} @ {devices}: emitted with / without views "
                  f"{row['views']['emitted_bytes'] / row['plain']['emitted_bytes']:.4f}, "
                  f"search s {row['plain']['search_seconds']:.2f} -> "
                  f"{row['views']['search_seconds']:.2f}", flush=True)
        del imported
    return out


def table(stored: dict) -> str:
    results = stored.get("results", {})
    lines = ["| config | devices | ops | search s (median) | search s before | plan GiB | "
             "plan GiB before | emitted GiB | emitted GiB before | best baseline GiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(results, key=lambda k: (results[k]["config"], results[k]["devices"])):
        row = results[key]
        base = row.get("baselines") or {}
        best = min(base.items(), key=lambda kv: (kv[1], kv[0])) if base else ("-", float("nan"))
        before = row.get("before", {})
        seconds_before = (f"{before['search_seconds']:.2f}" if "search_seconds" in before
                          else "-")
        gib = {key: f"{value / 2**30:.3f}" for key, value in
               [("plan", row["plan_bytes"]), ("emitted", row.get("emitted_bytes"))] +
               [(f"{k}_before", before.get(f"{k}_bytes")) for k in ("plan", "emitted")]
               if value is not None}
        lines.append(f"| {row['config']} | {row['devices']} | {row['num_ops']} | "
                     f"{row['search_seconds']:.2f} | {seconds_before} | {gib['plan']} | "
                     f"{gib.get('plan_before', '-')} | {gib.get('emitted', '-')} | "
                     f"{gib.get('emitted_before', '-')} | "
                     f"{best[1] / 2**30:.3f} ({best[0]}) |")
    codes = sorted({row.get("code", "") for row in results.values()} - {""})
    before = sorted({row["before"].get("code", "earlier") for row in results.values()
                     if "before" in row})
    lines.append(f"\nBefore: the row each rerun replaced (code {', '.join(before) or '-'}); "
                 f"rows measured at code {', '.join(codes) or '-'}. Plan: the bytes the search "
                 "prices its plan at (and the baselines theirs, on the same model); emitted: "
                 "what the plan's emitted step moves (rewrite/pricing.py, which the verifier "
                 "holds the ledger to).")
    for label, ratio in sorted(stored.get("depth_doubling", {}).items()):
        lines.append(f"\nSearch-time ratio per doubling of depth, {label}: {ratio:.2f}")
    if stored.get("end_to_end"):
        lines += ["", "| end to end (8 devices) | build s | import s | search s | total s | "
                      "target s | ILP planner s |", "|---|---|---|---|---|---|---|"]
        for name, row in sorted(stored["end_to_end"].items()):
            lines.append(f"| {name} | {row['build']:.2f} | {row['import']:.2f} | "
                         f"{row['search']:.2f} | {row['total']:.2f} | "
                         f"{row['target_seconds']} | {row['reference_planner_seconds']} |")
    if stored.get("backends"):
        lines += ["", "| whole search, 8 devices | C++ op s | NumPy s | speedup |",
                  "|---|---|---|---|"]
        for name, row in sorted(stored["backends"].items()):
            lines.append(f"| {name} | {row['c++']:.2f} | {row['numpy']:.2f} | "
                         f"{row['speedup']:.2f}x |")
    if stored.get("loaded"):
        lines += ["", "| search under load, 8 devices | idle s | one competing process s | "
                      "slowdown |", "|---|---|---|---|"]
        for name, row in sorted(stored["loaded"].items()):
            lines.append(f"| {name} | {row['idle']:.2f} | {row['loaded']:.2f} | "
                         f"{row['slowdown']:.2f}x |")
    if stored.get("stock"):
        rows = stored["stock"]
        joint = {k: r for k, r in rows.items() if r["joint"]}
        lines += ["", "| stock Keras model @ devices | ops | search B (joint) | search s | "
                      "recursion B | recursion s | search / recursion |", "|---|---|---|---|---|---|---|"]
        for name, row in sorted(joint.items()):
            lines.append(f"| {name} | {row['ops']} | {row['search_bytes']:.0f} | "
                         f"{row['search_seconds']:.2f} | {row['recursion_bytes']:.0f} | "
                         f"{row['recursion_seconds']:.2f} | "
                         f"{row['search_bytes'] / row['recursion_bytes']:.3f} |")
        others = {k: r for k, r in rows.items() if not r["joint"]}
        ratios = {}                            # device count -> search / recursion seconds
        for name, row in others.items():
            ratios.setdefault(name.split("@")[1], []).append(
                row["search_seconds"] / row["recursion_seconds"])
        per_count = ", ".join(f"{d}: {statistics.median(r):.2f} ({max(r):.2f})"
                              for d, r in sorted(ratios.items()))
        fewer = sum(r["search_bytes"] < r["recursion_bytes"] for r in others.values())
        gains = [r["search_bytes"] / r["recursion_bytes"] for r in joint.values()
                 if r["search_bytes"] < r["recursion_bytes"]]
        lines.append(f"\nStock Keras models (tofu_tf.models.keras_models, batch 8) at 4, 6, 8 "
                     f"devices (`Topology.default`): {len(rows)} searches; the rows are the "
                     f"{len(joint)} whose plan is the joint optimum of all levels (the joint "
                     f"problem fits `Options.joint_choices`), {len(gains)} of them moving "
                     f"fewer bytes than the recursion"
                     + (f" ({min(gains):.3f}-{max(gains):.3f}x)" if gains else "")
                     + f". On the other {len(others)} the "
                     f"plan is the recursion's ({fewer} move fewer bytes); search time / "
                     f"recursion alone per device count, median (largest): {per_count} "
                     f"(one run each).")
    if stored.get("stock_lookahead"):       # the stock searches with Options.lookahead
        rows = [r for k, r in stored["stock_lookahead"].items() if k.endswith("@8")]
        ratios = [r["search_seconds"] / r["recursion_seconds"] for r in rows]
        fewer = sum(r["search_bytes"] < r["recursion_bytes"] for r in rows)
        lines.append(f"\nWith `Options(lookahead=True)` at 8 devices (2x2x2; one run each, "
                     f"{stored['machines']['stock_lookahead']['cpu']}): {fewer} of {len(rows)} "
                     f"stock models move fewer bytes than the recursion; search time / "
                     f"recursion alone median {statistics.median(ratios):.2f}, largest "
                     f"{max(ratios):.2f}.")
    if stored.get("gap"):
        lines += ["", "| tiny model @ topology | recursion B | search B | search s | "
                      "lookahead B (s) | joint optimum B | recursion gap | search gap | "
                      "recursion under the joint level 1, B |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, row in sorted(stored["gap"].items()):
            joint = (f"{row['joint_bytes']:.0f}" if "joint_bytes" in row
                     else "too large: " + row["error"].split(":")[1].split(";")[0].strip()
                     if ":" in row.get("error", "") else row.get("error", "-"))
            gaps = [f"{row[k]:.2%}" if k in row else "-" for k in ("gap", "search_gap")]
            under = (f"{row['under_joint_level1_bytes']:.0f}"
                     if "under_joint_level1_bytes" in row else "-")
            found = (f"{row['search_bytes']:.0f}{' (joint)' if row.get('search_joint') else ''}"
                     if "search_bytes" in row else "-")
            seconds = f"{row['search_seconds']:.2f}" if "search_seconds" in row else "-"
            ahead = (f"{row['lookahead_bytes']:.0f} ({row['lookahead_seconds']:.1f})"
                     if "lookahead_bytes" in row else "-")
            lines.append(f"| {name} | {row['recursive_bytes']:.0f} | {found} | {seconds} | "
                         f"{ahead} | {joint} | {gaps[0]} | {gaps[1]} | {under} |")
        lines.append("\nRecursion: each level fixed before the next (`Options(joint_choices=0)`)"
                     "; search: the default, all levels at once where the joint problem has at "
                     "most `Options.joint_choices` (10000) joint choices (chains of one choice "
                     "per level, summed over ops) and its op tables fit (search/joint.py), "
                     "marked (joint). Lookahead: each level but the last fixed by the "
                     "joint optimum of it and the level below (`Options.lookahead`, "
                     "`recursive.lookahead`), where that two-level problem fits. The "
                     "last column fixes level 1 (states and choices) to the joint optimum's and"
                     " solves the levels below: equal to the joint optimum, the whole gap is "
                     "level 1 chosen by its own cost alone.")
    if stored.get("accounts"):
        lines += ["", "| tiny model @ topology | search B (per level) | ledger B (per level) | "
                      "search / ledger | search's excess on tensors 2+ ops fetch, B | "
                      "ledger with / without shared reads | search s |",
                  "|---|---|---|---|---|---|---|"]
        accounts = stored["accounts"]
        for name, row in sorted(accounts.items()):
            search, ledger = sum(row["search_bytes"]), sum(row["ledger_bytes"])
            plain = accounts.get(name.removesuffix(" shared reads"))
            ratio = (f"{ledger / sum(plain['ledger_bytes']):.3f}"
                     if name.endswith("shared reads") and plain else "")
            seconds = f"{row['search_seconds']:.2f}" if "search_seconds" in row else "-"
            levels = [" + ".join(f"{b:.0f}" for b in row[k])
                      for k in ("search_bytes", "ledger_bytes")]
            lines.append(f"| {name} | {search:.0f} ({levels[0]}) | {ledger} ({levels[1]}) | "
                         f"{search / ledger:.3f} | {row['shared_reads_excess']:.0f} | {ratio} | "
                         f"{seconds} |")
        lines.append("\nSearch: the plan's bytes as the search prices them (each level's cut "
                     "within its groups, every op's read on its own); ledger: what the emitted "
                     "step moves (equal to rewrite/pricing.py's prediction, which the verifier "
                     "checks). Where two ops read the same region a device lacks, the emitter "
                     "sends it once; without shared reads the search counts it per reader "
                     "(excess column); with them (`Options(shared_reads=True)`, rows marked) "
                     "the readers read through a view the search may assemble once. Across "
                     "levels a partial result is reduced once per slice, however many copies "
                     "of it a group holds, and a small one level by level (rewrite/"
                     "collectives.py), as the search prices it: with shared reads the "
                     "outermost level's two accounts agree wherever its cut is two-way; "
                     "inside the groups the search prices each reader's copies of delivered "
                     "regions, the emitter sends a device each region once. Search s: "
                     "make_plan, one run.")
    if stored.get("views"):
        lines += ["", "| config @ devices | search s | with views s | plan GiB | with views | "
                      "emitted GiB | with views | emitted with / without views |",
                  "|---|---|---|---|---|---|---|---|"]
        rows = stored["views"]
        for name, row in sorted(rows.items()):
            plain, seen = row["plain"], row["views"]
            lines.append(f"| {name} | {plain['search_seconds']:.2f} | "
                         f"{seen['search_seconds']:.2f} | {plain['plan_bytes'] / 2**30:.3f} | "
                         f"{seen['plan_bytes'] / 2**30:.3f} | "
                         f"{plain['emitted_bytes'] / 2**30:.3f} | "
                         f"{seen['emitted_bytes'] / 2**30:.3f} | "
                         f"{seen['emitted_bytes'] / plain['emitted_bytes']:.4f} |")
        emitted = [r["views"]["emitted_bytes"] / r["plain"]["emitted_bytes"]
                   for r in rows.values()]
        slower = [r["views"]["search_seconds"] / r["plain"]["search_seconds"]
                  for r in rows.values()]
        lines.append(f"\nViews (`Options(shared_reads=True)`) on the paper configurations, bytes "
                     f"alone (`--flop_bytes` 0, as the configurations above): the emitted step "
                     f"moves {min(emitted):.3f}-{max(emitted):.3f}x the bytes of the plans "
                     f"without them (median {statistics.median(emitted):.3f}); search time "
                     f"{min(slower):.2f}-{max(slower):.2f}x (median "
                     f"{statistics.median(slower):.2f}). Search s: median of the runs, "
                     f"alternating; plan: the bytes the search prices its plan at.")
    if stored.get("machines"):
        lines += ["", "| section | machine | reference loop s |", "|---|---|---|"]
        for section, row in sorted(stored["machines"].items()):
            lines.append(f"| {section} | {row['cpu']}, {row['nproc']} CPUs | "
                         f"{row['reference_loop_seconds']:.3f} |")
    return "\n".join(lines)


def stock(lookahead: bool = False) -> dict:
    """Per stock Keras model and device count: the default search (all levels at once
    where the joint problem fits), or with `Options(lookahead=True)`, against the
    recursion alone, one run each after an untimed one; the models of --only (default:
    all)."""
    from tofu_tf.importer.graphdef_io import import_concrete_function
    from tofu_tf.models.keras_models import KERAS_MODELS, build_keras_step
    from tofu_tf.op_semantics.catalog import catalog
    from tofu_tf.options import Options
    from tofu_tf.search.recursive import search
    from tofu_tf.search.topology import Topology
    out = {}
    for name in [n for n in FLAGS.only.split(",") if n] or KERAS_MODELS:
        step = build_keras_step(name, batch_size=8)       # alive: its variables
        graph = import_concrete_function(step.concrete_function()).graph
        entries = catalog(graph)
        # untimed: the first search of a graph also fills the op analyses' memos
        search(graph, Topology.default(4), entries=entries, options=Options(joint_choices=0))
        for devices in (4, 6, 8):
            topology = Topology.default(devices)
            start = time.perf_counter()
            plan = search(graph, topology, entries=entries,
                          options=Options(lookahead=lookahead))
            middle = time.perf_counter()
            recursion = search(graph, topology, entries=entries,
                               options=Options(joint_choices=0))
            row = {"ops": len(graph), "search_bytes": plan.objective, "joint": plan.joint,
                   "search_seconds": middle - start,
                   "recursion_bytes": recursion.objective,
                   "recursion_seconds": time.perf_counter() - middle}
            out[f"{name}@{devices}"] = row
            print(f"{name} @ {devices}: {row['search_bytes']:.0f} B "
                  f"({'joint' if plan.joint else 'recursion'}) in "
                  f"{row['search_seconds']:.2f} s; recursion {row['recursion_bytes']:.0f} B "
                  f"in {row['recursion_seconds']:.2f} s", flush=True)
        del step
    return out


def main(argv) -> int:
    del argv
    if FLAGS.e2e_child:
        end_to_end_child(FLAGS.e2e_child)
        return 0
    stored = read_results("search", FLAGS.fresh)
    stored.setdefault("results", {})
    sections = set(FLAGS.sections.split(","))

    def merged(key: str, rows: Callable[[], dict]) -> Callable[[], dict]:
        """With --only, the section's stored rows that were not rerun are kept."""
        return lambda: {**(stored.get(key, {}) if FLAGS.only else {}), **rows()}
    runs = {"configs": ("depth_doubling", lambda: configs(stored)),
            "end_to_end": ("end_to_end", lambda: end_to_end(FLAGS.repeats)),
            "backends": ("backends", lambda: backends(FLAGS.repeats)),
            "loaded": ("loaded", lambda: loaded(FLAGS.repeats)), "gap": ("gap", gap),
            "accounts": ("accounts", accounts), "stock": ("stock", merged("stock", stock)),
            "stock_lookahead": ("stock_lookahead",
                                merged("stock_lookahead", lambda: stock(lookahead=True))),
            "views": ("views", merged("views", lambda: views(FLAGS.repeats)))}
    if sections - runs.keys():
        raise app.UsageError(f"unknown --sections {sorted(sections - runs.keys())}; "
                             f"choose from {sorted(runs)}")
    for section, (key, run) in runs.items():
        if section in sections:
            stored[key] = run()
            # sections are rerun at different times, on other machines: each keeps its own
            stored.setdefault("machines", {})[section] = machine(yardstick=True)
    print(write(stored))
    return 0


def configs(stored: dict) -> dict:
    """Every wanted configuration's rows into stored["results"], written as they come;
    returns the search-time ratios per doubling of depth."""
    for name in wanted_configurations():
        imported, build_seconds = load_imported(*configurations()[name])
        for devices in (int(d) for d in FLAGS.devices.split(",")):
            row = run_one(imported, devices, FLAGS.repeats, FLAGS.baselines)
            row.update(config=name, build_import_seconds=build_seconds,
                       code=commit_label(), cpu=cpu())     # rows of one table, many runs
            old = stored["results"].get(f"{name}@{devices}")
            if old is not None:                # the row it replaces, for before/after
                row["before"] = {k: old[k] for k in ("plan_bytes", "search_seconds", "code",
                                                     "emitted_bytes") if k in old}
            stored["results"][f"{name}@{devices}"] = row
            print(f"{name} @ {devices}: search {row['search_seconds']:.2f} s, "
                  f"plan {row['plan_bytes'] / 2**30:.3f} GiB, emitted "
                  f"{row['emitted_bytes'] / 2**30:.3f} GiB", flush=True)
            write(stored)                  # keep what is done if the run is cut short
        del imported
    return depth_doubling(stored["results"])


def wanted_configurations() -> list[str]:
    """The configurations `--only` names (default: all)."""
    return [c for c in FLAGS.only.split(",") if c] or list(configurations())


def write(stored: dict) -> str:
    return write_results("search", stored, table)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
