"""Hierarchical topologies: the plan that knows which links are slow, against one that
counts bytes only, and against data parallelism, in simulated time.

    python bench/topology.py
    python bench/topology.py --only=lstm-4-4096 --shapes=2x4

For each configuration and hosts x devices shape (H100-class devices: 450 GB/s inside a
host, 100 Gb/s between hosts):
- hierarchical: `Topology.hosts(h, d)` (the first cut across hosts, then the devices of a
  host by their prime factors), candidates ranked by predicted transfer time
  (`Objective.TIME`);
- bytes only: the device count cut by its prime factors, largest first, as if every link
  were alike, candidates ranked by bytes; its levels are then laid on the machine (the
  leading levels whose ways multiply to the host count cross hosts) to price its time;
- data parallelism on the hierarchical topology.
Each gets the simulator's step time (search/simulate.py, h100_8 compute, each level's own
links). Results: bench/results/topology.{json,md}.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).parent))
from common import configurations, load, read_results, write_results  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("only", "wresnet-50-w4,lstm-4-4096", "comma-separated configurations")
flags.DEFINE_string("shapes", "2x4,2x8,4x8", "hosts x devices per host")
flags.DEFINE_bool("fresh", False, "start from empty results instead of merging")

INTRA = (450e9, 3e-6)
INTER = (12.5e9, 20e-6)


def laid_on_hosts(ways: tuple[int, ...], hosts: int):
    """A topology of `ways` whose leading levels (up to `hosts` devices' worth) cross
    hosts, the rest inside one."""
    from tofu_tf.search.topology import Level, Topology
    levels, crossed = [], 1
    for k in ways:
        across = crossed < hosts
        crossed *= k if across else 1
        bandwidth, latency = INTER if across else INTRA
        levels.append(Level(k, bandwidth, latency, "hosts" if across else "devices"))
    return Topology(tuple(levels))


def run(graph, batch: int, hosts: int, per_host: int) -> dict:
    from tofu_tf.options import Objective, Options
    from tofu_tf.search.baselines import data_parallel
    from tofu_tf.search.recursive import search
    from tofu_tf.search.simulate import PROFILES, plan_step_time
    from tofu_tf.search.topology import Topology, prime_factors
    profile = PROFILES["h100_8"]
    hierarchical = Topology.hosts(hosts, per_host, inter=INTER, intra=INTRA)
    flat = laid_on_hosts(tuple(sorted(prime_factors(hosts * per_host), reverse=True)), hosts)
    results = {
        "hierarchical": search(graph, hierarchical, options=Options(objective=Objective.TIME)),
        "bytes_only": search(graph, flat, options=Options(objective=Objective.BYTES)),
        "data_parallel": data_parallel(graph, hierarchical),
    }
    row = {}
    for name, result in results.items():
        step = plan_step_time(graph, result, profile, topology_links=True)
        row[name] = {"ways": list(result.topology.ways), "bytes": result.total_bytes,
                     "transfer_seconds": result.transfer_seconds,
                     "step_seconds": step.seconds,
                     "samples_per_second": batch / step.seconds}
    return row


def table(stored: dict) -> str:
    lines = ["# Hierarchical topologies (simulated, H100-class devices)", "",
             f"Command: `{stored.get('command', '')}`  ", f"Machine: {stored.get('machine')}",
             "", f"Links: {INTRA[0] / 1e9:.0f} GB/s inside a host, {INTER[0] / 1e9:.1f} GB/s "
             "between hosts. Step = compute + transfers (no overlap).", "",
             "| config | hosts x devices | plan | cuts | bytes moved | transfer ms | step ms | "
             "samples/s |", "|---|---|---|---|---:|---:|---:|---:|"]
    for key, row in sorted(stored.get("rows", {}).items()):
        name, shape = key.split("@")
        for plan in ("hierarchical", "bytes_only", "data_parallel"):
            r = row[plan]
            lines.append(f"| {name} | {shape} | {plan} | {'x'.join(map(str, r['ways']))} | "
                         f"{r['bytes'] / 2 ** 20:.1f} MiB | {1e3 * r['transfer_seconds']:.2f} | "
                         f"{1e3 * r['step_seconds']:.2f} | {r['samples_per_second']:.1f} |")
    slower = [k for k, row in stored.get("rows", {}).items()
              if row["hierarchical"]["step_seconds"] > row["bytes_only"]["step_seconds"]]
    lines += ["", "Hierarchical slower than bytes only: " + (", ".join(slower) or "never") + "."]
    return "\n".join(lines)


def main(argv) -> int:
    del argv
    stored = read_results("topology", FLAGS.fresh)
    for name in [c for c in FLAGS.only.split(",") if c]:
        model, sizes = configurations()[name]
        graph, _ = load(model, sizes)
        for shape in FLAGS.shapes.split(","):
            hosts, per_host = (int(x) for x in shape.split("x"))
            row = run(graph, sizes["batch_size"], hosts, per_host)
            stored.setdefault("rows", {})[f"{name}@{shape}"] = row
            print(f"{name} @ {shape}: " + ", ".join(
                f"{k} {v['step_seconds'] * 1e3:.1f} ms" for k, v in row.items()), flush=True)
            write_results("topology", stored, table)
    print(write_results("topology", stored, table))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
