"""The fewest bytes, the default, transfers priced too, or the fastest predicted step:
each plan timed here.

    python bench/fastest.py                          # the medium configs, 3 rounds
    python bench/fastest.py --configs=lstm-4-1024 --rounds=5

For each config of bench/common.CONFIGS at `--devices` logical CPU devices, four plans:
the fewest bytes moved (`Options(flop_bytes=0)`), the default (the search also prices the
computation a replicated op repeats at the step profile's rate, `Options.flop_bytes`), with
each transfer's latency priced too (`transfer_bytes=None`: the profile's), and
`Options(fastest_step=True)` (among the plans at a few memory weights, the one
search/simulate.py predicts fastest on `--profile`), each emitted and run
from the same values. They take turns, one step each per round after a warm-up step (this
machine is noisy: a slow spell then hits all alike); the figure is each one's median.
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
from common import CONFIGS, markdown_table, read_results, timed_kernels, write_results  # noqa: E402

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
    plans = {"fewest bytes": Options(flop_bytes=0.0, step_profile=FLAGS.profile),
             "default": Options(step_profile=FLAGS.profile),
             "transfers priced": Options(transfer_bytes=None, step_profile=FLAGS.profile),
             "fastest step": Options(fastest_step=True, step_profile=FLAGS.profile)}
    runners, row = {}, {}
    for label, options in plans.items():
        optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                             num_devices=FLAGS.devices, options=options)
        runners[label] = Runner(optimized, values)
        runners[label].run(feeds)                                    # warm-up
        row[label] = {"bytes_moved": optimized.plan.predicted_bytes,
                      "search_seconds": optimized.plan.search_seconds,
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


LABELS = ("fewest bytes", "default", "transfers priced", "fastest step")


def table(stored: dict) -> str:
    rows = []
    for name, row in stored.get("configs", {}).items():
        labels = [label for label in LABELS if label in row]
        base = row["fewest bytes"]["median_ms"]

        def each(fmt) -> str:
            return " / ".join(fmt(row[label]) for label in labels)
        rows.append([name, each(lambda r: f"{r['median_ms']:.1f}"),
                     each(lambda r: f"{base / r['median_ms']:.2f}x"),
                     each(lambda r: f"{r['bytes_moved'] / 2**20:.1f}"),
                     each(lambda r: f"{r['peak_bytes'] / 2**20:.1f}"),
                     each(lambda r: str(r["nodes"])),
                     each(lambda r: f"{r['search_seconds']:.2f}" if "search_seconds" in r
                          else "")])
    return "\n\n".join([
        "# The fewest bytes, the default, transfers priced, or the fastest predicted step "
        "(bench/fastest.py)",
        f"Command: `{stored.get('command', '')}`  \nMachine: {stored.get('machine')}",
        f"{stored.get('devices')} logical CPU devices; medians of {stored.get('rounds')} "
        f"steps each, the plans taking turns; repeated work and transfers priced and the "
        f"fastest step predicted on `{stored.get('profile')}`. Each cell: fewest bytes "
        "(`flop_bytes=0`) / the default (repeated work priced at the profile's rate) / "
        "transfers priced too (`transfer_bytes=None`) / fastest step (`fastest_step=True`); "
        "speedup: the fewest-bytes step over each.",
        markdown_table(["config", "step ms", "speedup", "MiB moved", "peak MiB per device",
                        "nodes", "search s"], rows)])


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
    timed_kernels()
    app.run(lambda argv: sys.exit(main(argv)))
