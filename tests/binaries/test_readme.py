"""The README's quick start runs as a user runs it: its Python block as it stands, in a fresh
process, TensorFlow imported first with its default CPU kernels (oneDNN on where the CPU
has AVX-512, as here)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def quick_start_code() -> str:
    section = README.read_text().split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_quick_start_begins_with_tensorflow():
    assert quick_start_code().splitlines()[0] == "import tensorflow as tf"


def test_the_quick_start_trains_with_tensorflow_defaults():
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    run = subprocess.run([sys.executable, "-c", quick_start_code()], capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    epochs = [line for line in run.stdout.splitlines() if line.startswith("epoch")]
    assert len(epochs) == 2, run.stdout
    losses = [float(v) for line in epochs for v in re.findall(r"[-+]?\d+\.\d+(?:e[-+]\d+)?",
                                                               line.split("losses", 1)[1])]
    assert len(losses) == 8 and all(math.isfinite(v) for v in losses), epochs
    assert "Plan for 8 devices" in run.stdout
