"""Plan a reference model's training step and print the plan.

    python -m tofu_tf.plan --model=wresnet --depth=152 --widen=10 --num_devices=8
    python -m tofu_tf.plan --model=lstm --layers=10 --hidden=8192 --topology=2x4 \\
        --json_out=report.json --plan_out=plan.json --report=plan.html --ilp
    python -m tofu_tf.plan --diff a.json b.json       # what changed between two plans

The model is built as a graph only (no weight is allocated), imported, and searched. The
summary shows bytes per level and the heaviest tensor groups; the JSON holds the totals,
the baselines' bytes on the same cost model, and with --ilp the ILP optimum of the same
levels.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags, logging

from tofu_tf import _cli
from tofu_tf._cli import FLAGS, model_sizes

flags.DEFINE_string("json_out", None, "write the plan report as JSON here")
flags.DEFINE_bool("predict", True, "also price the emitted step: the bytes its graph "
                  "moves per level (the search prices each level's cut inside its groups)")
flags.DEFINE_bool("ilp", False, "also solve every level by ILP (small graphs)")
flags.DEFINE_bool("baselines", True, "also evaluate the baselines")
flags.DEFINE_string("diff", None, "compare two plans (Plan JSON from --plan_out): "
                    "--diff a.json b.json")


def build_graph(model: str, batch_size: int, optimizer: str, sizes: dict,
                micro_batches: int = 1):
    """The model's training step, imported (planner graph and GraphDef), without weights."""
    from tofu_tf.models import build
    from tofu_tf.importer.graphdef_io import import_graph_def
    step = build(model, optimizer=optimizer, batch_size=batch_size, graph_only=True,
                 initializers=False, micro_batches=micro_batches, **sizes)
    return import_graph_def(step.graph_def, step.fetches)


def report(plan, graph, topology, *, with_baselines: bool, with_ilp: bool,
           build_seconds: float) -> dict:
    data = {"model": FLAGS.model, "batch_size": FLAGS.batch_size, "optimizer": FLAGS.optimizer,
            "sizes": model_sizes(), "topology": str(topology),
            "num_devices": topology.num_devices, "total_bytes": plan.total_bytes,
            "bytes_per_level": list(plan.bytes_per_level),
            "predicted_bytes": plan.predicted_bytes,
            "predicted_bytes_per_level": list(plan.predicted_per_level),
            "search_seconds": plan.search_seconds, "build_import_seconds": build_seconds,
            "num_ops": plan.num_ops, "num_groups": plan.num_groups, "exact": plan.exact,
            "per_device_peak_bytes": list(plan.per_device_peak_bytes),
            "single_device_peak_bytes": plan.single_device_peak_bytes,
            "memory_budget_bytes": _cli.options().memory_budget_bytes}
    if with_baselines:
        from tofu_tf.search.baselines import BASELINES
        data["baselines"] = {name: fn(graph, topology).total_bytes
                             for name, fn in BASELINES.items()}
    if with_ilp:
        from tofu_tf.search.exact import ilp_search
        data["ilp_bytes"] = ilp_search(graph, topology).total_bytes
    return data


def diff(paths: list[str]) -> int:
    from tofu_tf.tools.report import plan_diff
    from tofu_tf.search.plan import Plan
    if len(paths) != 2:
        print("error: --diff takes two plan files: --diff a.json b.json", file=sys.stderr)
        return 2
    try:
        plans = [Plan.from_json(open(p).read()) for p in paths]
    except (OSError, ValueError, TypeError, KeyError) as err:
        print(f"error: cannot read a plan ({err}). Fix: pass files written by --plan_out.",
              file=sys.stderr)
        return 2
    print(plan_diff(*plans))
    return 0


def main(argv) -> int:
    if FLAGS.diff:
        return diff([FLAGS.diff, *argv[1:]])
    del argv
    from tofu_tf.errors import TofuError
    from tofu_tf.search.plan import make_plan
    from tofu_tf.search.topology import check_fits
    try:
        topology = _cli.topology()
        start = time.perf_counter()
        logging.info("building and importing %s ...", FLAGS.model)
        imported = build_graph(FLAGS.model, FLAGS.batch_size, FLAGS.optimizer,
                               model_sizes(), _cli.micro_batches())
        graph = imported.graph
        build_seconds = time.perf_counter() - start
        logging.info("planning %d ops over %s ...", len(graph), topology)
        check_fits(graph, topology)
        plan = make_plan(graph, topology, options=_cli.options())
        if FLAGS.predict:
            from tofu_tf.api import planned_step, predict
            plan, _ = predict(plan, planned_step(imported, plan), options=_cli.options())
        print(plan)
        data = report(plan, graph, topology, with_baselines=FLAGS.baselines,
                      with_ilp=FLAGS.ilp, build_seconds=build_seconds)
    except TofuError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, value in data.get("baselines", {}).items():
        print(f"  baseline {name:16s} {value / 2**20:12.2f} MiB")
    if "ilp_bytes" in data:
        print(f"  ILP optimum          {data['ilp_bytes'] / 2**20:12.2f} MiB")
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
    _cli.write_plan(plan, f"{FLAGS.model} on {topology}", data.get("baselines"))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
