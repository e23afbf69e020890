"""Partitioned steps on TensorFlow's distributed runtime: worker processes on loopback, a
client Session in this process, faults ending in a typed error in bounded time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tofu_tf.runtime import checkpoint
from tofu_tf.api import optimize
from tofu_tf.runtime.cluster import LocalCluster, cluster_from_tf_config, worker_error
from tofu_tf.errors import WorkerError, tf_error_cause
from tofu_tf.models import build
from tofu_tf.runtime.session import Runner, SingleDevice
from tofu_tf.search.topology import Topology

from equivalence import compare

TOPOLOGY = Topology.hosts(2, 4)
DEVICES = TOPOLOGY.device_names("CPU")
STEP_TIMEOUT_S = 60          # each step here takes < 3 s; a hang would reach this


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(2, 4, step_timeout_s=STEP_TIMEOUT_S) as local:
        yield local
    assert local.dead() == [0, 1]                  # closed: both processes have ended


def test_device_names_place_each_host_level_coordinate_on_one_task():
    assert DEVICES[:4] == tuple(f"/job:worker/replica:0/task:0/device:CPU:{d}"
                                for d in range(4))
    assert DEVICES[4:] == tuple(f"/job:worker/replica:0/task:1/device:CPU:{d}"
                                for d in range(4))


@pytest.mark.parametrize("model", ["wresnet", "transformer"])
def test_two_workers_train_like_one_device(cluster, model):
    # float64: the workers' thread pools sum float32 convolution gradients in another
    # order than this process does (~1e-6 apart after 3 Adam steps), which is not what
    # this test is about.
    optimized = compare(model, "adam", steps=3, dtype="float64", topology=TOPOLOGY,
                        devices=DEVICES,
                        session={"target": cluster.target, "config": cluster.config})
    tasks = {node.device.split("/task:")[1][0] for node in optimized.graph_def.node}
    assert tasks == {"0", "1"}                     # the step really spans both processes


def test_a_killed_worker_ends_the_step_with_a_worker_error_and_the_checkpoint_restores(
        tmp_path):
    step = build("mlp", optimizer="momentum", graph_only=True, batch_size=8)
    batches = [dict(zip(step.feeds, step.sample_batch(seed))) for seed in range(2)]
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        initial = single.values()
        single.run(batches[0])
        after_one = single.values()
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                         topology=TOPOLOGY, devices=DEVICES)
    with LocalCluster(2, 4, step_timeout_s=STEP_TIMEOUT_S) as local:
        runner = Runner(optimized, initial, target=local.target, config=local.config)
        with local.guard(runner):
            runner.run(batches[0])
            saved = checkpoint.save(str(tmp_path), runner.values(), step=1)
        local.kill(1)
        start = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            with local.guard(runner):
                runner.run(batches[1])
        assert time.monotonic() - start < STEP_TIMEOUT_S + 5
        assert runner.session is None              # abandoned, not left to block on close
    assert local.dead() == [0, 1]
    message = str(caught.value)
    assert f"task 1 ({local.addresses[1]})" in message and "Fix:" in message
    values, number = checkpoint.restore(str(tmp_path))
    assert number == 1 and saved.endswith("ckpt-1")
    assert sorted(values) == sorted(after_one)
    for name, value in after_one.items():
        np.testing.assert_allclose(values[name], value, rtol=1e-6, atol=1e-7)


def test_workers_end_by_themselves_when_their_parent_is_killed(tmp_path):
    """The parent (a client holding a LocalCluster) dies without cleaning up: its workers
    see their stdin close and exit."""
    script = textwrap.dedent("""
        import sys, time
        from tofu_tf.runtime.cluster import LocalCluster
        local = LocalCluster(2, 1)
        print(" ".join(str(p.pid) for p in local.processes), flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        pids = [int(pid) for pid in parent.stdout.readline().split()]
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert len(pids) == 2
    deadline = time.monotonic() + 30
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in pids if _running(pid)]
    assert not alive, f"workers {alive} outlived their parent by 30 s"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"      # a zombie has exited
    except FileNotFoundError:
        return False


def test_a_worker_that_cannot_start_is_a_worker_error_naming_it():
    with pytest.raises(WorkerError, match="worker task 0 at 127.0.0.1:.* exited"):
        LocalCluster(1, 1, python="false")        # a "python" that exits at once


def test_tf_config_is_read_and_bad_ones_are_named():
    text = '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}'
    assert cluster_from_tf_config(text) == (["a:1", "b:2"], 1)
    for bad in ("", "{", '{"cluster": {"worker": ["a:1"]}, "task": {"index": 3}}',
                '{"cluster": {"chief": ["a:1"]}, "task": {"index": 0}}'):
        with pytest.raises(WorkerError, match="TF_CONFIG"):
            cluster_from_tf_config(bad)


def test_tensorflow_messages_become_their_cause_and_node():
    message = ("Graph execution error:\n\n=====\nUNAVAILABLE: From /job:worker/task:1:\n"
               "failed to connect to all addresses\n\t [[{{node MatMul_3/tofu_7}}]]\n")
    assert tf_error_cause(message) == ("failed to connect to all addresses", "MatMul_3/tofu_7")
    error = worker_error(RuntimeError(message), [1], ["h:1", "h:2"])
    assert "task 1 (h:2) stopped" in str(error) and error.node == "MatMul_3/tofu_7"


def test_checkpoint_keeps_names_with_slashes_and_dots(tmp_path):
    values = {"a/b.c": np.arange(6.0).reshape(2, 3), "x..S/y": np.ones(2, np.float32)}
    checkpoint.save(str(tmp_path), values, step=4)
    checkpoint.save(str(tmp_path), {k: v + 1 for k, v in values.items()}, step=5)
    latest, number = checkpoint.restore(str(tmp_path))
    assert number == 5 and sorted(latest) == sorted(values)
    for name, value in values.items():
        np.testing.assert_array_equal(latest[name], value + 1)
    with pytest.raises(Exception, match="no readable checkpoint"):
        checkpoint.restore(str(tmp_path / "missing"))
