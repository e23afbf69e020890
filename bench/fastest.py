"""The fewest bytes or the fastest predicted step: both plans timed on this machine.

    python bench/fastest.py                          # the medium configs, 3 rounds
    python bench/fastest.py --configs=lstm-4-1024 --rounds=5

For each config of bench/common.CONFIGS at `--devices` logical CPU devices: the default plan
(the fewest bytes moved) and `Options(fastest_step=True)` (among the plans at a few memory
weights, the one search/simulate.py predicts fastest on `--profile`), each emitted and run
from the same values. The two take turns, one step each per round after a warm-up step
(this machine is noisy: a slow spell then hits both alike); the figure is each one's median.
Results: bench/results/fastest.{json,md}.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).parent))
from common import CONFIGS, markdown_table, read_results, write_results  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("configs", ["mlp-medium", "wresnet-50-w2", "lstm-4-1024",
                              "transformer-6-512"], "bench/common.CONFIGS names")
flags.DEFINE_integer("devices", 8, "logical CPU devices")
flags.DEFINE_integer("rounds", 3, "timed steps of each plan, taking turns")
flags.DEFINE_string("profile", "this_cpu", "search/simulate.py profile for fastest_step")


def run_config(name: str) -> dict:
    from tofu_tf.api import optimize
    from tofu_tf.models import build
    from tofu_tf.options import Options
    from tofu_tf.runtime.session import Runner, SingleDevice
    model, sizes, _ = CONFIGS[name]
    step = build(model, optimizer="sgd", graph_only=True, **sizes)
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        values = single.values()
    feeds = dict(zip(step.feeds, step.sample_batch(0)))
    plans = {"fewest bytes": Options(),
             "fastest step": Options(fastest_step=True, step_profile=FLAGS.profile)}
    runners, row = {}, {}
    for label, options in plans.items():
        optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                             num_devices=FLAGS.devices, options=options)
        runners[label] = Runner(optimized, values)
        runners[label].run(feeds)                                    # warm-up
        row[label] = {"bytes_moved": optimized.plan.predicted_bytes,
                      "peak_bytes": optimized.plan.peak_bytes,
                      "nodes": len(optimized.graph_def.node), "times": []}
    for _ in range(FLAGS.rounds):
        for label, runner in runners.items():
            start = time.perf_counter()
            runner.run(feeds)
            row[label]["times"].append(time.perf_counter() - start)
    for label, runner in runners.items():
        runner.close()
        row[label]["median_ms"] = statistics.median(row[label]["times"]) * 1e3
    return row


def table(stored: dict) -> str:
    rows = []
    for name, row in stored.get("configs", {}).items():
        a, b = row["fewest bytes"], row["fastest step"]
        rows.append([name, f"{a['median_ms']:.1f}", f"{b['median_ms']:.1f}",
                     f"{a['median_ms'] / b['median_ms']:.2f}x",
                     f"{a['bytes_moved'] / 2**20:.1f} / {b['bytes_moved'] / 2**20:.1f}",
                     f"{a['peak_bytes'] / 2**20:.1f} / {b['peak_bytes'] / 2**20:.1f}",
                     f"{a['nodes']} / {b['nodes']}"])
    return "\n\n".join([
        "# The fewest bytes or the fastest predicted step (bench/fastest.py)",
        f"Command: `{stored.get('command', '')}`  \nMachine: {stored.get('machine')}",
        f"{stored.get('devices')} logical CPU devices; medians of {stored.get('rounds')} "
        f"steps each, the two plans taking turns; fastest step predicted on "
        f"`{stored.get('profile')}`. Speedup: fewest bytes' step / fastest step's.",
        markdown_table(["config", "fewest bytes ms", "fastest step ms", "speedup",
                        "MiB moved (bytes / fastest)", "peak MiB per device", "nodes"], rows)])


def main(argv) -> int:
    del argv
    stored = read_results("fastest", fresh=False)
    stored.update(devices=FLAGS.devices, rounds=FLAGS.rounds, profile=FLAGS.profile)
    for name in FLAGS.configs:
        stored.setdefault("configs", {})[name] = run_config(name)
        print(f"{name}: " + ", ".join(f"{label} {row['median_ms']:.1f} ms" for label, row
                                      in stored["configs"][name].items()), flush=True)
        write_results("fastest", stored, table)
    print(write_results("fastest", stored, table))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    app.run(lambda argv: sys.exit(main(argv)))
