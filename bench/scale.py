"""Planning at scale: GPT-2-medium-wide Transformers of growing depth (up to ~50,000 graph
nodes), each built, imported and planned for 8 devices in a fresh process; wall time per
phase and the process's peak resident memory.

    python bench/scale.py                    # layers 24, 64, 128; then 128 limited to 5 s

Writes bench/results/scale.{json,md}. The last row plans the deepest model again with
Options(search_time_limit_s=--time_limit): the search stops with a PlanInfeasibleError
naming the limit (the row records the message and when it came).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).parent))
from common import markdown_table, write_results  # noqa: E402

flags.DEFINE_list("layers", ["24", "64", "128"], "transformer depths")
flags.DEFINE_float("time_limit", 5.0, "search time limit of the last row, in seconds")
flags.DEFINE_string("child", "", "internal: measure one depth and print JSON")
FLAGS = flags.FLAGS
SIZES = dict(d_model=1024, heads=16, seq_len=1024, vocab=50257, batch_size=8)


def child(layers: int, time_limit: float) -> None:
    import tensorflow  # noqa: F401 -- TensorFlow's own import is not in the figures
    from tofu_tf.errors import TofuError
    from tofu_tf.models import build
    from tofu_tf.options import Options
    from tofu_tf.importer.graphdef_io import import_graph_def
    from tofu_tf.search.plan import make_plan
    from tofu_tf.search.topology import Topology
    start = time.perf_counter()
    step = build("transformer", optimizer="adam", graph_only=True, initializers=False,
                 layers=layers, **SIZES)
    built = time.perf_counter()
    graph = import_graph_def(step.graph_def, step.fetches).graph
    imported = time.perf_counter()
    row = {"layers": layers, "time_limit_s": time_limit or None,
           "nodes": len(step.graph_def.node), "ops": len(graph),
           "build_s": built - start, "import_s": imported - built}
    try:
        plan = make_plan(graph, Topology.default(8),
                         options=Options(search_time_limit_s=time_limit or None))
        row.update(search_s=time.perf_counter() - imported, plan_bytes=plan.total_bytes,
                   outcome="planned")
    except TofuError as err:
        row.update(search_s=time.perf_counter() - imported, outcome=str(err)[:300])
    row["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(row))


def table(stored: dict) -> str:
    return markdown_table(
        ["layers", "search limit s", "graph nodes", "planner ops", "build s", "import s",
         "search s", "peak RSS MiB", "outcome"],
        [[row["layers"], row["time_limit_s"] or "-", row["nodes"], row["ops"],
          f"{row['build_s']:.1f}", f"{row['import_s']:.1f}", f"{row['search_s']:.1f}",
          f"{row['peak_rss_mib']:.0f}", row["outcome"]] for row in stored["rows"]])


def main(argv) -> int:
    del argv
    if FLAGS.child:
        child(int(FLAGS.child), FLAGS.time_limit)
        return 0
    rows = []
    runs = [(layers, 0) for layers in FLAGS.layers] + [(FLAGS.layers[-1], FLAGS.time_limit)]
    for layers, limit in runs:
        command = [sys.executable, __file__, f"--child={layers}", f"--time_limit={limit}"]
        proc = subprocess.run(command, capture_output=True, text=True, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    print(write_results("scale", {"rows": rows, "devices": 8, "sizes": SIZES}, table))
    return 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
