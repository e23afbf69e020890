"""Differential fuzzing at scale: random training steps (tofu_tf/tools/fuzz.py) on random device
counts, partitioned against unpartitioned.

    python bench/fuzz.py --examples=2000 --first_seed=100000
    python bench/fuzz.py --pipeline_stages=2 --max_ops=14    # pipeline stages: fuzz_pipeline

Writes bench/results/fuzz.{json,md} (with stages: fuzz_pipeline.{json,md}, each example on
S x 2..4 devices; a step with fewer independent variable groups than stages, which the
planner refuses with a typed error, is counted as skipped): examples run, mismatches (wrong numbers), errors (a
TofuError or any other exception), each with its seed, device count and ops, so that
`python -c "from tofu_tf.tools.fuzz import *; ..."` replays it; and the op types covered.
"""

from __future__ import annotations

import collections
import random
import sys
import time
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).parent))
from common import write_results  # noqa: E402

flags.DEFINE_integer("examples", 2000, "random steps to check")
flags.DEFINE_integer("first_seed", 100_000, "seed of the first example (then +1 each)")
flags.DEFINE_integer("max_ops", 7, "largest number of random ops per step")
flags.DEFINE_integer("pipeline_stages", 1, "Options.pipeline_stages of every example")
FLAGS = flags.FLAGS


def devices_for(seed: int, stages: int = 1) -> int:
    """The device count of example `seed`: 2..8 (with stages: stages x 2..4), drawn from
    the seed."""
    if stages > 1:
        return stages * random.Random(seed).randint(2, 4)
    return random.Random(seed).randint(2, 8)


def run(examples: int, first_seed: int, max_ops: int, stages: int = 1) -> dict:
    from tofu_tf.errors import PlanInfeasibleError
    from tofu_tf.options import Options
    from tofu_tf.tools.fuzz import RandomChooser, check, random_step
    failures, op_types, skipped = [], collections.Counter(), 0
    start = time.perf_counter()
    for seed in range(first_seed, first_seed + examples):
        case = random_step(RandomChooser(seed), max_ops=max_ops, seed=seed)
        devices = devices_for(seed, stages)
        op_types.update(case.ops)
        try:
            problem = check(case, devices, Options(pipeline_stages=stages))
            kind = "mismatch"
        except PlanInfeasibleError as err:
            if "variable groups" not in str(err):
                raise
            skipped += 1
            continue
        except Exception as err:                       # noqa: BLE001 -- every error counts
            problem, kind = f"{type(err).__name__}: {str(err)[:400]}", "error"
        if problem:
            failures.append({"seed": seed, "devices": devices, "ops": case.describe(),
                             "kind": kind, "problem": problem})
            print(f"seed {seed} @ {devices}: {kind}: {problem[:200]}", flush=True)
    return {"examples": examples, "first_seed": first_seed, "max_ops": max_ops,
            "pipeline_stages": stages, "skipped": skipped,
            "seconds": time.perf_counter() - start,
            "mismatches": sum(f["kind"] == "mismatch" for f in failures),
            "errors": sum(f["kind"] == "error" for f in failures),
            "failures": failures, "op_types": dict(op_types)}


def table(stored: dict) -> str:
    stages = stored.get("pipeline_stages", 1)
    devices = f"{2 * stages}-{4 * stages} ({stages} stages)" if stages > 1 else "2-8"
    lines = ["| examples | seeds | devices | skipped | mismatches | errors | seconds |",
             "|---|---|---|---|---|---|---|",
             f"| {stored['examples']} | {stored['first_seed']}.."
             f"{stored['first_seed'] + stored['examples'] - 1} | {devices} | "
             f"{stored.get('skipped', 0)} | {stored['mismatches']} | "
             f"{stored['errors']} | {stored['seconds']:.0f} |", "",
             "| random op | count |", "|---|---|"]
    lines += [f"| {op} | {n} |" for op, n in sorted(stored["op_types"].items())]
    if stored["failures"]:
        lines += ["", "| seed | devices | ops | problem |", "|---|---|---|---|"]
        lines += [f"| {f['seed']} | {f['devices']} | {f['ops']} | {f['problem'][:120]} |"
                  for f in stored["failures"]]
    return "\n".join(lines)


def main(argv) -> int:
    del argv
    stored = run(FLAGS.examples, FLAGS.first_seed, FLAGS.max_ops, FLAGS.pipeline_stages)
    name = "fuzz_pipeline" if FLAGS.pipeline_stages > 1 else "fuzz"
    print(write_results(name, stored, table))
    return 1 if stored["failures"] else 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
