"""What the benchmarks share: the paper configurations, building them, the machine."""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

# Step-time configs (bench/overhead.py, bench/simulate.py): name -> (model, build
# keywords, medium). Tiny: the reference models' defaults; medium: a step in seconds.
CONFIGS = {
    "mlp": ("mlp", {"batch_size": 8}, False),
    "wresnet": ("wresnet", {"batch_size": 8}, False),
    "lstm": ("lstm", {"batch_size": 8}, False),
    "transformer": ("transformer", {"batch_size": 8}, False),
    "mlp-medium": ("mlp", {"hidden": (4096,) * 4, "input_dim": 4096, "num_classes": 1000,
                           "batch_size": 256}, True),
    "wresnet-50-w2": ("wresnet", {"depth": 50, "widen": 2, "base_width": 64,
                                  "image_size": 64, "num_classes": 100, "batch_size": 32},
                      True),
    "lstm-4-1024": ("lstm", {"layers": 4, "hidden": 1024, "steps": 20, "embedding": 512,
                             "vocab": 1000, "num_classes": 1000, "batch_size": 64}, True),
    "transformer-6-512": ("transformer", {"layers": 6, "d_model": 512, "heads": 8,
                                          "seq_len": 256, "vocab": 4096, "batch_size": 8},
                          True),
}


def paper_config(name: str) -> tuple[str, dict]:
    """A paper-shaped config of any size by name: wresnet-<depth>-w<widen> (224x224,
    1000 classes) or lstm-<layers>-<hidden> (20 steps), batch 8."""
    model, first, second = name.split("-")
    if model == "wresnet":
        return "wresnet", dict(depth=int(first), widen=int(second.lstrip("w")), base_width=64,
                               image_size=224, num_classes=1000, batch_size=8)
    return "lstm", dict(layers=int(first), hidden=int(second), steps=20, embedding=512,
                        vocab=512, num_classes=512, batch_size=8)


def configurations() -> dict[str, tuple[str, dict]]:
    configs = {}
    for depth in (50, 101, 152):
        for widen in (4, 6, 8, 10):
            configs[f"wresnet-{depth}-w{widen}"] = paper_config(f"wresnet-{depth}-w{widen}")
    for layers in (4, 6, 8, 10):
        for hidden in (4096, 6144, 8192, 10240):
            configs[f"lstm-{layers}-{hidden}"] = paper_config(f"lstm-{layers}-{hidden}")
    configs["gpt2-medium"] = ("transformer", dict(layers=24, d_model=1024, heads=16,
                                                   seq_len=1024, vocab=50257, batch_size=8))
    return configs


@functools.cache
def commit_label() -> str:
    """The short commit of the repository the imported tofu_tf lives in (the code a row
    measured)."""
    import subprocess

    import tofu_tf
    run = subprocess.run(["git", "-C", os.path.dirname(tofu_tf.__file__), "rev-parse",
                          "--short", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() or "unknown"


def cpu() -> str:
    """The CPU as /proc/cpuinfo names it, with its family and model numbers (a virtual
    machine's model name alone, e.g. 'AMD EPYC', does not tell the generations apart)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in info.splitlines()[:30] if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    return (f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, "
            f"model {fields.get('model', '?')})")


REFERENCE_LOOP_ITEMS = 1_000_000


def reference_loop_seconds(repeats: int = 5) -> float:
    """Median seconds of a fixed interpreter workload that uses none of this package
    (building and reading `REFERENCE_LOOP_ITEMS` small dicts): a yardstick for the speed
    of the machine at the time of a run, so that timings from different machines or hours
    can be compared. It moves with the host, not with this package's code."""
    def run():
        total = 0
        for i in range(REFERENCE_LOOP_ITEMS):
            row = {"index": i, "square": i * i}
            total += row["square"] % 7
        return total

    return median_seconds(run, repeats, warmup=0)


def timed_kernels() -> None:
    """Timing benches run TensorFlow's own CPU kernels unless TF_ENABLE_ONEDNN_OPTS says
    otherwise, as every stored row so far (`machine()["onednn"]` records the choice);
    call before TensorFlow is imported."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def machine(yardstick: bool = False) -> dict:
    """This machine and its software; with `yardstick`, also the reference loop's seconds
    (half a second to measure)."""
    import numpy
    import tensorflow as tf
    from tofu_tf.cc import cost_op
    return {"nproc": os.cpu_count(), "cpu": cpu(), "python": platform.python_version(),
            "tensorflow": tf.__version__, "numpy": numpy.__version__,
            "cost_backend": cost_op.backend().value, "load": os.getloadavg()[0],
            "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
            **({"reference_loop_seconds": reference_loop_seconds()} if yardstick else {})}


def median_seconds(run, repeats: int, warmup: int = 2) -> float:
    """Median wall seconds of `run()` over `repeats` calls after `warmup` untimed ones."""
    import statistics
    for _ in range(warmup):
        run()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def paired_medians(first, second, steps: int, warmup: int, block: int = 10
                   ) -> tuple[float, float]:
    """Median wall seconds of `first()` and of `second()` over `steps` steps each, timed
    in alternating blocks of `block` steps (the first step of a block untimed: the other
    session's threads may still spin), so that both see the same load on a noisy
    machine. Fewer steps than two blocks: alternate single steps."""
    import statistics
    for _ in range(warmup):
        first()
        second()
    block = block if steps >= 2 * block else 1
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(-(-steps // block)):
        for run, out in ((first, times[0]), (second, times[1])):
            if block > 1:
                run()
            for _ in range(block):
                start = time.perf_counter()
                run()
                out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def load(model: str, sizes: dict):
    """(planner graph, build + import seconds) of a graph-only model."""
    imported, seconds = load_imported(model, sizes)
    return imported.graph, seconds


def load_imported(model: str, sizes: dict):
    """(ImportedGraph, build + import seconds) of a graph-only model."""
    from tofu_tf.models import build
    from tofu_tf.importer.graphdef_io import import_graph_def
    start = time.perf_counter()
    step = build(model, optimizer="sgd", graph_only=True, initializers=False, **sizes)
    imported = import_graph_def(step.graph_def, step.fetches)
    return imported, time.perf_counter() - start


def read_results(name: str, fresh: bool) -> dict:
    """bench/results/<name>.json as stored (empty with `fresh`), to merge new rows into."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() and not fresh else {}


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A markdown table: the header, a rule, one line per row of already formatted cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(name: str, stored: dict, table) -> str:
    """`stored` (with this machine and command) to bench/results/<name>.json, and
    `table(stored)` to <name>.md; returns the table."""
    stored["machine"] = machine()
    stored["command"] = " ".join(sys.argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(stored, indent=1, sort_keys=True,
                                                     default=str))
    markdown = table(stored)
    (RESULTS / f"{name}.md").write_text(markdown + "\n")
    return markdown
