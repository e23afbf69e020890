"""Rewrite overhead on one host: partitioned step time over unpartitioned step time.

    python bench/overhead.py                  # every tiny model, sgd, 8 logical CPUs
    python bench/overhead.py --models=mlp --devices=4 --steps=20

Each tiny reference model (graph-only, float32, batch 8) runs `--steps` timed steps after
`--warmup` untimed ones, unpartitioned in a one-device session and partitioned in a
session with one logical CPU per device. Logical CPUs share the host's cores and memory,
so this measures the rewrite's overhead (more, smaller kernels and the copies between
devices), not a speedup. Results (medians, ratio) go to bench/results/overhead.json and
overhead.md, with the step's bytes three ways: the search's model (each level's cut
priced inside its groups), the plan's prediction of the emitted step (rewrite/pricing.py)
and the ledger's step total (equal to the prediction, or the verifier fails).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("models", "mlp,wresnet,lstm,transformer", "comma-separated tiny models")
flags.DEFINE_string("optimizer", "sgd", "optimizer of the steps")
flags.DEFINE_integer("devices", 8, "logical CPU devices")
flags.DEFINE_integer("steps", 20, "timed steps")
flags.DEFINE_integer("warmup", 3, "untimed steps first")

sys.path.insert(0, str(Path(__file__).parent))
from common import markdown_table, median_seconds, write_results  # noqa: E402  (bench/common.py)


def measure(model: str) -> dict:
    from tofu_tf.api import optimize
    from tofu_tf.models import build
    from tofu_tf.runtime import Runner, SingleDevice
    step = build(model, optimizer=FLAGS.optimizer, graph_only=True, batch_size=8)
    feeds = dict(zip(step.feeds, step.sample_batch(0)))
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single_device:
        values = single_device.values()
        single = median_seconds(lambda: single_device.run(feeds), FLAGS.steps, FLAGS.warmup)
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                         num_devices=FLAGS.devices)
    with Runner(optimized, values) as runner:
        parted = median_seconds(lambda: runner.run(feeds), FLAGS.steps, FLAGS.warmup)
    return {"model": model, "devices": FLAGS.devices, "optimizer": FLAGS.optimizer,
            "single_seconds": single, "partitioned_seconds": parted, "ratio": parted / single,
            "nodes_single": len(step.graph_def.node),
            "nodes_partitioned": len(optimized.graph_def.node),
            "moved_bytes": optimized.ledger.moved_bytes, "plan_bytes": optimized.plan.total_bytes,
            "predicted_bytes": optimized.plan.predicted_bytes,
            "ledger_step_bytes": optimized.ledger.step_bytes}


def table(stored: dict) -> str:
    return markdown_table(
        ["model", "devices", "unpartitioned ms", "partitioned ms", "ratio", "nodes",
         "partitioned nodes", "search model B", "predicted B", "ledger B"],
        [[r["model"], r["devices"], f"{1e3 * r['single_seconds']:.2f}",
          f"{1e3 * r['partitioned_seconds']:.2f}", f"{r['ratio']:.2f}", r["nodes_single"],
          r["nodes_partitioned"], f"{r['plan_bytes']:.0f}", r["predicted_bytes"],
          r["ledger_step_bytes"]] for r in stored["rows"]])


def main(argv) -> int:
    del argv
    rows = [measure(m) for m in FLAGS.models.split(",") if m]
    print(write_results("overhead", {"rows": rows}, table))
    return 0


if __name__ == "__main__":
    importlib.import_module("tofu_tf")       # before TensorFlow: its CPU kernel choice
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
