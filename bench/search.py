"""Search benchmark: the paper configurations at 2, 4, 6 and 8 devices.

    python bench/search.py                       # every configuration (long)
    python bench/search.py --only=lstm-10-8192 --devices=8 --repeats=1

For each configuration the model is built as a graph only, imported once, and searched
`--repeats` times; the result records the median search seconds, the plan's bytes, every
baseline's bytes on the same cost model, and the machine. Results are merged into
bench/results/search.json (keyed by configuration and device count) and the whole table is
written to bench/results/search.md and printed.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("only", "", "comma-separated configuration names (default: all)")
flags.DEFINE_string("devices", "2,4,6,8", "comma-separated device counts")
flags.DEFINE_integer("repeats", 3, "search repetitions (the median is reported)")
flags.DEFINE_bool("baselines", True, "also evaluate the baselines")

RESULTS = Path(__file__).parent / "results"


def configurations() -> dict[str, tuple[str, dict]]:
    configs = {}
    for depth in (50, 101, 152):
        for widen in (4, 6, 8, 10):
            configs[f"wresnet-{depth}-w{widen}"] = ("wresnet", dict(
                depth=depth, widen=widen, base_width=64, image_size=224, num_classes=1000,
                batch_size=8))
    for layers in (4, 6, 8, 10):
        for hidden in (4096, 6144, 8192, 10240):
            configs[f"lstm-{layers}-{hidden}"] = ("lstm", dict(
                layers=layers, hidden=hidden, steps=20, embedding=512, vocab=512,
                num_classes=512, batch_size=8))
    configs["gpt2-medium"] = ("transformer", dict(layers=24, d_model=1024, heads=16,
                                                   seq_len=1024, vocab=50257, batch_size=8))
    return configs


def machine() -> dict:
    import numpy
    import tensorflow as tf
    from tofu_tf.cc import cost_op
    return {"nproc": os.cpu_count(), "python": platform.python_version(),
            "tensorflow": tf.__version__, "numpy": numpy.__version__,
            "cost_backend": cost_op.backend(), "load": os.getloadavg()[0]}


def run_one(model: str, sizes: dict, devices: int, repeats: int, with_baselines: bool) -> dict:
    from tofu_tf.models import build
    from tofu_tf.rewrite.graphdef_io import import_graph_def
    from tofu_tf.search.plan import make_plan
    from tofu_tf.search.topology import Topology
    start = time.perf_counter()
    step = build(model, optimizer="sgd", graph_only=True, **sizes)
    graph = import_graph_def(step.graph_def, step.fetches).graph
    build_seconds = time.perf_counter() - start
    topology = Topology.default(devices)
    seconds, plan = [], None
    for _ in range(repeats):
        plan = make_plan(graph, topology)
        seconds.append(plan.search_seconds)
    row = {"devices": devices, "num_ops": plan.num_ops, "num_groups": plan.num_groups,
           "build_import_seconds": build_seconds, "search_seconds": statistics.median(seconds),
           "search_seconds_all": seconds, "plan_bytes": plan.total_bytes,
           "bytes_per_level": list(plan.bytes_per_level), "exact": plan.exact,
           "variable_storage": plan.variable_storage}
    if with_baselines:
        from tofu_tf.search.baselines import BASELINES
        row["baselines"] = {name: fn(graph, topology).total_bytes
                            for name, fn in BASELINES.items()}
    return row


def table(results: dict) -> str:
    lines = ["| config | devices | ops | search s (median) | plan GiB | best baseline GiB |",
             "|---|---|---|---|---|---|"]
    for key in sorted(results):
        row = results[key]
        base = row.get("baselines") or {}
        best = min(base.items(), key=lambda kv: kv[1]) if base else ("-", float("nan"))
        lines.append(f"| {row['config']} | {row['devices']} | {row['num_ops']} | "
                     f"{row['search_seconds']:.2f} | {row['plan_bytes'] / 2**30:.3f} | "
                     f"{best[1] / 2**30:.3f} ({best[0]}) |")
    return "\n".join(lines)


def main(argv) -> int:
    del argv
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "search.json"
    stored = json.loads(path.read_text()) if path.exists() else {"results": {}}
    wanted = [c for c in FLAGS.only.split(",") if c] or list(configurations())
    for name in wanted:
        model, sizes = configurations()[name]
        for devices in (int(d) for d in FLAGS.devices.split(",")):
            row = run_one(model, sizes, devices, FLAGS.repeats, FLAGS.baselines)
            row["config"] = name
            stored["results"][f"{name}@{devices}"] = row
            print(f"{name} @ {devices}: search {row['search_seconds']:.2f} s, "
                  f"plan {row['plan_bytes'] / 2**30:.3f} GiB", flush=True)
    stored["machine"] = machine()
    stored["command"] = " ".join(sys.argv)
    path.write_text(json.dumps(stored, indent=1, sort_keys=True))
    markdown = table(stored["results"])
    (RESULTS / "search.md").write_text(markdown + "\n")
    print(markdown)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
