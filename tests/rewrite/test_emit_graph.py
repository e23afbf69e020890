"""The emitted GraphDef itself: the shapes it records are TensorFlow's, and the same plan
always gives the same bytes (in one process and across processes and hash seeds)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tofu_tf.api import optimize
from tofu_tf.models import build
from tofu_tf.search.plan import Plan


def _optimized(model: str, optimizer: str, num_devices: int = 8, plan: Plan | None = None):
    step = build(model, optimizer=optimizer, graph_only=True, batch_size=8, dtype="float64")
    return optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                    num_devices=num_devices, plan=plan)


@pytest.fixture(scope="module")
def wresnet():
    """The tiny WResNet with Adam on 8 devices (convolutions with halos, partial sums)."""
    return _optimized("wresnet", "adam")


def _digest(graph_def) -> str:
    return hashlib.sha256(graph_def.SerializeToString(deterministic=True)).hexdigest()


def _recorded_shapes_are_inferred(graph_def) -> None:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    for node in graph_def.node:
        recorded = [tuple(d.size for d in s.dim) for s in node.attr["_output_shapes"].list.shape]
        inferred = [tuple(t.shape.as_list())
                    for t in graph.get_operation_by_name(node.name).outputs]
        assert recorded == inferred, (node.name, node.op)


def test_recorded_shapes_are_tensorflows(wresnet):
    """Every node's `_output_shapes` (written by the emitter from the plan, read by the
    verifier's byte count) equals TensorFlow's shape inference on the imported graph."""
    _recorded_shapes_are_inferred(wresnet.graph_def)


@pytest.mark.parametrize("model,optimizer,n", [("lstm", "adam", 8), ("transformer", "sgd", 8),
                                               ("mlp", "momentum", 3)])
def test_recorded_shapes_of_other_models(model, optimizer, n):
    _recorded_shapes_are_inferred(_optimized(model, optimizer, n).graph_def)


def test_same_plan_same_bytes_in_one_process(wresnet):
    again = _optimized("wresnet", "adam", plan=wresnet.plan)
    assert _digest(again.graph_def) == _digest(wresnet.graph_def)


DIGEST_SCRIPT = """
import hashlib, sys
from tofu_tf.api import optimize
from tofu_tf.models import build
from tofu_tf.search.plan import Plan
step = build("wresnet", optimizer="adam", graph_only=True, batch_size=8, dtype="float64")
plan = Plan.from_json(open(sys.argv[1]).read())
optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), plan=plan,
                     num_devices=8)
data = optimized.graph_def.SerializeToString(deterministic=True)
print("digest", hashlib.sha256(data).hexdigest())
"""


def test_same_plan_same_bytes_across_processes(wresnet, tmp_path):
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(wresnet.plan.to_json())
    digests = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT, str(plan_path)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        digests.add(proc.stdout.strip().splitlines()[-1].split()[-1])
    assert digests == {_digest(wresnet.graph_def)}


def test_chained_in_place_as_sequence_devices(wresnet):
    """The emitter's own device chains are the ones `sequence_devices` adds afterwards."""
    from tofu_tf.op_semantics.catalog import catalog
    from tofu_tf.rewrite.emit import emit
    from tofu_tf.importer.graphdef_io import import_graph_def
    from tofu_tf.rewrite.schedule import sequence_devices
    step = build("wresnet", optimizer="adam", graph_only=True, batch_size=8, dtype="float64")
    imported = import_graph_def(step.graph_def, list(step.fetches), feeds=list(step.feeds))
    args = (imported.graph, imported.graph_def, catalog(imported.graph, strict=True),
            wresnet.plan)
    plain = emit(*args, feeds=list(step.feeds), sequential=False)
    assert _digest(sequence_devices(plain.graph_def, plain.fetches)) == \
        _digest(wresnet.graph_def)
