"""The absl binaries, run as a user runs them: exit status, output, files written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


def _run(module: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, env=ENV, timeout=timeout)


def test_train_matches_the_unpartitioned_step(tmp_path):
    plan_path = tmp_path / "plan.json"
    run = _run("tofu_tf.train", "--model=mlp", "--num_devices=4", "--steps=3",
               "--optimizer=adam", f"--plan_out={plan_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "MATCH: 3 steps on 4 devices" in run.stdout
    assert run.stderr.count("loss") >= 3                  # absl logs a line per step
    plan = json.loads(plan_path.read_text())
    assert len(plan["per_device_peak_bytes"]) == 4 and plan["single_device_peak_bytes"] > 0


def test_train_in_float32_is_judged_against_its_own_rounding():
    """Float32 steps drift from their own rounding: beyond the float64-level default
    tolerances, the binary compares the drift with the unpartitioned training's from values
    one unit in the last place off (tools.zoo), and says both."""
    run = _run("tofu_tf.train", "--model=wresnet", "--dtype=float32", "--num_devices=8",
               "--steps=3")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "MATCH" in run.stdout and "unit in the last place" in run.stdout, run.stdout


def test_train_writes_a_profile_naming_every_devices_ops(tmp_path):
    from tofu_tf.runtime.profile import trace_devices
    report = tmp_path / "plan.html"
    run = _run("tofu_tf.train", "--model=mlp", "--num_devices=4", "--steps=3",
               f"--profile_dir={tmp_path}", f"--report={report}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "MATCH: 3 steps on 4 devices" in run.stdout
    folder, = (tmp_path / "plugins" / "profile").iterdir()
    xplane, = folder.glob("*.xplane.pb")
    assert b"MatMul" in xplane.read_bytes()
    trace, = folder.glob("*.trace.json.gz")
    rows = trace_devices(trace)
    for d in range(4):
        names = next(v for k, v in rows.items() if k.endswith(f"CPU:{d} Compute"))
        assert any("MatMul" in n for n in names), (d, sorted(names)[:10])
    page = report.read_text()
    assert "Step time per device" in page and all(f"CPU:{d}: busy" in page for d in range(4))


def test_train_and_plan_with_recomputation(tmp_path):
    plan_path = tmp_path / "plan.json"
    run = _run("tofu_tf.train", "--model=transformer", "--num_devices=8", "--steps=2",
               "--recompute", f"--plan_out={plan_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "MATCH: 2 steps on 8 devices" in run.stdout
    printed = run.stdout + run.stderr
    assert "forward ops recomputed" in printed and "updates early" in printed
    plan = json.loads(plan_path.read_text())
    assert plan["recompute"] and plan["early_updates"]
    run = _run("tofu_tf.plan", "--model=wresnet", "--memory_budget=1KiB", "--recompute")
    assert run.returncode == 2 and "with or without recomputation" in run.stderr
    assert "Traceback" not in run.stderr


def test_train_and_plan_with_pipeline_stages(tmp_path):
    plan_path = tmp_path / "plan.json"
    run = _run("tofu_tf.train", "--model=transformer", "--recompute", "--pipeline_stages=2",
               "--num_devices=8", "--steps=2", f"--plan_out={plan_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "MATCH: 2 steps on 8 devices" in run.stdout
    assert "pipeline: 2 stages of 4 devices" in run.stdout + run.stderr
    plan = json.loads(plan_path.read_text())
    assert set(plan["stages"].values()) == {0, 1} and plan["recompute"]
    run = _run("tofu_tf.plan", "--model=transformer", "--memory_budget=400KiB", "--recompute",
               "--pipeline", "--baselines=false")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "predicted step" in run.stdout and "step rewrites" in run.stdout
    run = _run("tofu_tf.plan", "--model=mlp", "--pipeline_stages=3")   # 3 micro-batches
    assert run.returncode == 2 and "does not cut into 3 equal micro-batches" in run.stderr
    run = _run("tofu_tf.plan", "--model=mlp", "--pipeline_stages=3", "--micro_batches=1")
    assert run.returncode == 2 and "pipeline stages over 8 devices" in run.stderr
    assert "Traceback" not in run.stderr


def test_train_with_an_impossible_budget_exits_2_with_the_fix():
    run = _run("tofu_tf.train", "--model=mlp", "--num_devices=4", "--memory_budget=1KiB")
    assert run.returncode == 2, run.stderr[-3000:]
    assert "error:" in run.stderr and "raise the budget to at least" in run.stderr
    assert "Traceback" not in run.stderr


def test_train_on_gpus_that_are_not_there_exits_2_naming_the_fix():
    run = _run("tofu_tf.train", "--model=mlp", "--num_devices=2", "--device_type=gpu")
    assert run.returncode == 2, run.stderr[-3000:]
    assert "GPUs" in run.stderr and "--device_type=cpu" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("bad", ["--memory_budget=lots", "--num_devices=1"])
def test_bad_flags_exit_2_without_a_traceback(bad):
    run = _run("tofu_tf.plan", "--model=mlp", bad, "--nobaselines")
    assert run.returncode == 2 and "error:" in run.stderr, run.stderr[-3000:]
    assert "Traceback" not in run.stderr


def test_plan_writes_a_report_and_diffs_two_plans(tmp_path):
    a, b, page = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "a.html"
    assert _run("tofu_tf.plan", "--model=mlp", "--num_devices=4", "--nobaselines",
                f"--plan_out={a}", f"--report={page}").returncode == 0
    assert _run("tofu_tf.plan", "--model=mlp", "--num_devices=2", "--nobaselines",
                f"--plan_out={b}").returncode == 0
    assert "<h2 id='memory'>" in page.read_text()
    run = _run("tofu_tf.plan", f"--diff={a}", str(b))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "topology: 2x2 -> 2" in run.stdout and "bytes moved:" in run.stdout
    assert _run("tofu_tf.plan", f"--diff={a}").returncode == 2


def test_plan_json_has_the_memory_fields(tmp_path):
    out = tmp_path / "report.json"
    run = _run("tofu_tf.plan", "--model=transformer", "--num_devices=8", "--nobaselines",
               "--memory_budget=300KiB", f"--json_out={out}")
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    assert len(data["per_device_peak_bytes"]) == 8
    assert max(data["per_device_peak_bytes"]) <= data["memory_budget_bytes"] == 300 * 1024
    assert data["single_device_peak_bytes"] > max(data["per_device_peak_bytes"])


def test_train_on_a_local_cluster_checkpoints_and_resumes(tmp_path):
    ckpt = tmp_path / "ckpt"
    common = ("--model=mlp", "--topology=2x2", "--local_cluster", "--optimizer=adam",
              f"--checkpoint_dir={ckpt}")
    run = _run("tofu_tf.train", *common, "--steps=2", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "MATCH: 2 steps on 4 devices in 2 worker processes" in run.stdout
    assert (ckpt / "ckpt-2.index").exists()
    run = _run("tofu_tf.train", *common, "--steps=1", "--resume", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "resuming after step 2" in run.stderr and "step 3: loss" in run.stderr


def test_train_with_a_cluster_that_does_not_fit_the_topology_exits_2():
    run = _run("tofu_tf.train", "--model=mlp", "--topology=2x2",
               "--cluster=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
    assert run.returncode == 2, run.stderr[-3000:]
    assert "names 3 workers" in run.stderr and "--topology=3x" in run.stderr
    assert "Traceback" not in run.stderr
