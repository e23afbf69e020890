"""Plan a reference model's training step and print the plan.

    python -m tofu_tf.plan --model=wresnet --depth=152 --widen=10 --num_devices=8
    python -m tofu_tf.plan --model=lstm --layers=10 --hidden=8192 --topology=2x4 \\
        --json_out=plan.json --ilp

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

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "wresnet", ["mlp", "wresnet", "lstm", "transformer"], "model")
flags.DEFINE_integer("batch_size", 8, "batch size")
flags.DEFINE_enum("optimizer", "sgd", ["sgd", "momentum", "adam"], "optimizer")
flags.DEFINE_integer("num_devices", 8, "number of devices (ignored with --topology)")
flags.DEFINE_string("topology", None, "levels outermost first, e.g. '2x4' or '2@12e9x4@300e9'")
flags.DEFINE_string("json_out", None, "write the plan report as JSON here")
flags.DEFINE_string("plan_out", None, "write the full plan (Plan.to_json) here")
flags.DEFINE_bool("ilp", False, "also solve every level by ILP (small graphs)")
flags.DEFINE_bool("baselines", True, "also evaluate the baselines")
flags.DEFINE_string("memory_budget", None,
                    "largest estimated peak per device, e.g. 12GiB: the least-communication "
                    "plan that fits, or an error naming the smallest peak reachable")
# model sizes: only the flags given are passed on; the rest keep the model's defaults
SIZE_FLAGS = {
    "depth": int, "widen": int, "base_width": int, "image_size": int, "num_classes": int,
    "layers": int, "hidden": int, "steps": int, "embedding": int, "vocab": int,
    "d_model": int, "heads": int, "seq_len": int, "input_dim": int,
}
for _name in SIZE_FLAGS:
    flags.DEFINE_integer(_name, None, f"model size: {_name}")


def model_sizes() -> dict:
    sizes = {name: getattr(FLAGS, name) for name in SIZE_FLAGS
             if getattr(FLAGS, name) is not None}
    if "hidden" in sizes and FLAGS.model == "mlp":
        sizes["hidden"] = (sizes["hidden"],) * 2
    return sizes


def build_graph(model: str, batch_size: int, optimizer: str, sizes: dict):
    """The model's training step as an imported planner graph, without weights."""
    from tofu_tf.models import build
    from tofu_tf.rewrite.graphdef_io import import_graph_def
    step = build(model, optimizer=optimizer, batch_size=batch_size, graph_only=True, **sizes)
    return import_graph_def(step.graph_def, step.fetches).graph


def budget_bytes() -> int | None:
    from tofu_tf.options import parse_bytes
    return parse_bytes(FLAGS.memory_budget) if FLAGS.memory_budget else None


def report(plan, graph, topology, *, with_baselines: bool, with_ilp: bool,
           build_seconds: float) -> dict:
    data = {"model": FLAGS.model, "batch_size": FLAGS.batch_size, "optimizer": FLAGS.optimizer,
            "sizes": model_sizes(), "topology": str(topology),
            "num_devices": topology.num_devices, "total_bytes": plan.total_bytes,
            "bytes_per_level": list(plan.bytes_per_level),
            "search_seconds": plan.search_seconds, "build_import_seconds": build_seconds,
            "num_ops": plan.num_ops, "num_groups": plan.num_groups, "exact": plan.exact,
            "per_device_peak_bytes": list(plan.per_device_peak_bytes),
            "single_device_peak_bytes": plan.single_device_peak_bytes,
            "memory_budget_bytes": budget_bytes()}
    if with_baselines:
        from tofu_tf.search.baselines import BASELINES
        data["baselines"] = {name: fn(graph, topology).total_bytes
                             for name, fn in BASELINES.items()}
    if with_ilp:
        from tofu_tf.search.exact import ilp_search
        data["ilp_bytes"] = ilp_search(graph, topology).total_bytes
    return data


def main(argv) -> int:
    del argv
    from tofu_tf.errors import TofuError
    from tofu_tf.options import Options
    from tofu_tf.search.plan import make_plan
    from tofu_tf.search.topology import Topology
    try:
        topology = (Topology.parse(FLAGS.topology) if FLAGS.topology
                    else Topology.default(FLAGS.num_devices))
        start = time.perf_counter()
        logging.info("building and importing %s ...", FLAGS.model)
        graph = build_graph(FLAGS.model, FLAGS.batch_size, FLAGS.optimizer, model_sizes())
        build_seconds = time.perf_counter() - start
        logging.info("planning %d ops over %s ...", len(graph), topology)
        plan = make_plan(graph, topology, options=Options(memory_budget_bytes=budget_bytes()))
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
    if FLAGS.plan_out:
        with open(FLAGS.plan_out, "w") as f:
            f.write(plan.to_json())
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
