"""What a node and a cross-device transfer cost on logical CPU devices.

    python bench/transfers.py                   # 8 devices, the four patterns below
    python bench/transfers.py --devices=4 --rounds=20

A partitioned step on logical CPUs runs more nodes than the unpartitioned one and moves
regions between devices; this measures the two prices apart, in one v1 Session with one
logical CPU per device (TensorFlow's Send and Recv between them, as in an emitted step):

- node: a chain of `--chain` Sin ops on 16 elements on one device: seconds per node.
- hop: the same chain, each op on the next device: seconds per hop (a node, a Send and a
  Recv on the chain: the latency one cross-device edge adds to a path).
- all-gather: `--rounds` rounds; in each, every device concatenates every device's piece
  (N - 1 of them remote) and takes a Sin of its own slice of the whole: N (N - 1)
  transfers a round. The same graph with every node on one device has the same nodes and
  no transfers, so (partitioned - one device) / transfers is the CPU price of one
  transfer (both cores busy: the wall time of a transfer is the price over the cores).
- all-to-all: as all-gather, but every device reads an N-th of each other device's piece
  (the region a re-layout between two split axes moves): the same number of transfers of
  N times fewer bytes.

Every pattern is timed in alternating blocks against its one-device twin (`paired_medians`).
Results: bench/results/transfers.{json,md}, every run kept (numbered per device count): this
machine's speed drifts by 2-3x between runs minutes apart, the one-device twins alike.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).parent))
from common import (cpu, markdown_table, paired_medians, read_results,  # noqa: E402
                    timed_kernels, write_results)

FLAGS = flags.FLAGS
flags.DEFINE_integer("devices", 8, "logical CPU devices")
flags.DEFINE_integer("chain", 400, "ops in the node and hop chains")
flags.DEFINE_integer("rounds", 40, "rounds of the all-gather and all-to-all patterns")
flags.DEFINE_integer("elements", 64, "elements of each device's piece (float32)")
flags.DEFINE_integer("steps", 60, "timed runs of each graph")

PATTERNS = ("node", "hop", "all-gather", "all-to-all")


def _graph(pattern: str, devices: int, spread: bool):
    """(graph, feed placeholder, fetch, units): the pattern's graph, its ops on `devices`
    devices (all on device 0 unless `spread`), and the chain length or the transfers."""
    import tensorflow as tf
    n, e = devices, FLAGS.elements
    place = (lambda i: f"/device:CPU:{i % n}") if spread else (lambda i: "/device:CPU:0")
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [e])
        if pattern in ("node", "hop"):
            y = x
            for i in range(FLAGS.chain):
                with tf.device(place(i) if pattern == "hop" else "/device:CPU:0"):
                    y = tf.sin(y)
            return graph, x, y, FLAGS.chain
        parts = []
        for d in range(n):
            with tf.device(place(d)):
                parts.append(tf.sin(x + float(d)))
        for _ in range(FLAGS.rounds):
            new = []
            for d in range(n):
                with tf.device(place(d)):
                    if pattern == "all-gather":
                        mine = tf.slice(tf.concat(parts, 0), [d * e], [e])
                    else:             # the d-th n-th of every piece
                        step = e // n
                        mine = tf.concat([tf.slice(p, [d * step], [step]) for p in parts], 0)
                    new.append(tf.sin(mine * 0.5))
            parts = new
        with tf.device(place(0)):
            y = tf.add_n([tf.reduce_sum(p) for p in parts])
        return graph, x, y, FLAGS.rounds * n * (n - 1)


def measure(pattern: str) -> dict:
    import numpy as np
    import tensorflow as tf

    from tofu_tf.runtime.session import session_config
    runs = []
    for spread in (False, True):
        graph, x, y, units = _graph(pattern, FLAGS.devices, spread)
        session = tf.compat.v1.Session(graph=graph, config=session_config(FLAGS.devices))
        feed = {x: np.zeros(FLAGS.elements, np.float32)}
        runs.append((session, lambda s=session, f=feed, t=y: s.run(t, f)))
    one, spread = paired_medians(runs[0][1], runs[1][1], FLAGS.steps, 3)
    for session, _ in runs:
        session.close()
    if pattern == "node":
        price = one / units
    elif pattern == "hop":
        price = spread / units
    else:
        price = (spread - one) * (os.cpu_count() or 1) / units
    row = {"pattern": pattern, "devices": FLAGS.devices, "units": units,
           "one_device_seconds": one, "spread_seconds": spread, "price_seconds": price,
           "cpu": cpu(), "elements": FLAGS.elements, "steps": FLAGS.steps}
    print(f"{pattern}: one device {1e3 * one:.2f} ms, over {FLAGS.devices} devices "
          f"{1e3 * spread:.2f} ms, {1e6 * price:.2f} us per unit", flush=True)
    return row


def table(stored: dict) -> str:
    rows = []
    for r in sorted(stored["rows"].values(),
                    key=lambda r: (r["devices"], r["run"], PATTERNS.index(r["pattern"]))):
        unit = {"node": "node (CPU)", "hop": "hop (latency)"}.get(r["pattern"],
                                                                  "transfer (CPU)")
        rows.append([r["pattern"], r["devices"], r["run"], r["units"],
                     f"{1e3 * r['one_device_seconds']:.2f}",
                     f"{1e3 * r['spread_seconds']:.2f}",
                     f"{1e6 * r['price_seconds']:.2f}", unit])
    lines = ["# What a node and a transfer cost on logical CPU devices", "",
             f"`{stored.get('command', 'bench/transfers.py')}` on {stored['machine']['cpu']}, "
             f"{stored['machine']['nproc']} cores; medians of paired runs. One device: "
             "the same graph with every node on device 0 (no transfers). Per unit: node and "
             "hop: one device's or the spread chain's time over its length; all-gather and "
             "all-to-all: (spread - one device) x cores over the transfers (N (N - 1) a "
             "round; all-to-all's move an N-th of the bytes).", "",
             markdown_table(["pattern", "devices", "run", "units", "one device ms", "spread ms",
                             "us per unit", "unit"], rows)]
    return "\n".join(lines)


def main(argv) -> int:
    del argv
    timed_kernels()
    stored = read_results("transfers", False)
    stored.setdefault("rows", {})
    run = 1 + sum(1 for key in stored["rows"] if key.startswith(f"node@{FLAGS.devices}#"))
    for pattern in PATTERNS:     # every run kept: this machine's speed drifts between runs
        stored["rows"][f"{pattern}@{FLAGS.devices}#{run}"] = measure(pattern) | {"run": run}
    print(write_results("transfers", stored, table))
    return 0


if __name__ == "__main__":
    app.run(main)
