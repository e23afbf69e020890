"""The same input gives a byte-identical plan JSON and GraphDef, in one process and across
processes with different hash seeds (set and dict orders must never leak into outputs)."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import hashlib
from tofu_tf.api import optimize
from tofu_tf.models import build
for model, devices in (("transformer", 6), ("mlp", 8)):
    step = build(model, optimizer="adam", graph_only=True, batch_size=8)
    for _ in range(2):
        out = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                       num_devices=devices)
        print(model, devices,
              hashlib.sha256(out.plan.to_json().encode()).hexdigest(),
              hashlib.sha256(out.graph_def.SerializeToString(deterministic=True)).hexdigest())
"""


def _run(hash_seed: str) -> list[str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.split("\n")


def test_plans_and_graphs_are_byte_identical_across_runs_and_processes():
    first, second = _run("1"), _run("2")
    lines = [line for line in first if line]
    assert len(lines) == 4
    assert lines[0] == lines[1] and lines[2] == lines[3]       # within one process
    assert first == second                                    # across hash seeds
