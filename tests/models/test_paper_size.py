"""Paper-size graph-only builds stay small: built in a child process, peak RSS < 2 GB."""

import json
import os
import subprocess
import sys

RSS_LIMIT_BYTES = 2 * 1024 ** 3
BUILD_SECONDS_LIMIT = 60

CHILD = r"""
import json, sys, time
import numpy as np
from tofu_tf.models import PAPER_SIZES, build

report = {}
for name in ("wresnet", "lstm", "transformer"):
    start = time.perf_counter()
    model = build(name, optimizer="adam", graph_only=True, **PAPER_SIZES[name])
    consts = [n for n in model.graph_def.node if n.op == "Const"]
    report[name] = {
        "seconds": time.perf_counter() - start,
        "nodes": len(model.graph_def.node),
        "var_handles": sum(n.op == "VarHandleOp" for n in model.graph_def.node),
        "max_const_elements": max(
            int(np.prod([d.size for d in n.attr["value"].tensor.tensor_shape.dim]))
            for n in consts),
    }
# VmHWM: this image's own peak. ru_maxrss would keep the peak of the process before
# exec, i.e. of a fork of the (large) test runner.
with open("/proc/self/status") as status:
    report["peak_rss_bytes"] = next(int(line.split()[1]) * 1024 for line in status
                                    if line.startswith("VmHWM:"))
print(json.dumps(report))
"""


def test_paper_size_graph_only_builds_fit_in_2gb():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                           env=env, timeout=300)
    assert child.returncode == 0, child.stderr[-4000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["peak_rss_bytes"] < RSS_LIMIT_BYTES, report
    for name in ("wresnet", "lstm", "transformer"):
        built = report[name]
        assert built["seconds"] < BUILD_SECONDS_LIMIT, report
        assert built["var_handles"] > 0 and built["max_const_elements"] <= 4096, report
