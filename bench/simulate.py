"""Calibrate the step-time simulator on this CPU and report its error.

    python bench/simulate.py                 # tiny models, 1 and 8 logical CPU devices

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
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).parent))
from common import median_seconds, write_results  # noqa: E402  (bench/common.py)

FLAGS = flags.FLAGS
flags.DEFINE_string("models", "mlp,wresnet,lstm,transformer", "comma-separated tiny models")
flags.DEFINE_integer("devices", 8, "logical CPU devices")
flags.DEFINE_integer("steps", 30, "timed steps")



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


def main(argv) -> int:
    del argv
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
    print(write_results("simulate", {"rows": rows, "profile": asdict(profile),
                                     "errors": summary}, lambda _: "\n".join(table)))
    return 0


if __name__ == "__main__":
    importlib.import_module("tofu_tf")       # before TensorFlow: its CPU kernel choice
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
