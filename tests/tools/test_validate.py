"""Every derived strategy of every registered op is right on real shards (k = 2, 3, 4)."""

import pytest

from tofu_tf.op_semantics import registry
from tofu_tf.op_semantics.samples import all_samples, arg, Sample
from tofu_tf.op_semantics.tdl import Fn, Sum, Window, Opaque
from tofu_tf.tools.validate import validate, validate_sample

SAMPLES = all_samples()


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.id for s in SAMPLES])
def test_every_strategy_is_right(sample):
    report = validate_sample(sample)
    assert not report.failures, "\n".join(map(str, report.failures))


def test_every_described_op_has_a_sample():
    report = validate(op_types=None, ks=())
    unsampled = [f for f in report.findings if f.kind == "unsampled"]
    assert not unsampled, "\n".join(map(str, unsampled))


def _swap_description(monkeypatch, op_type, build):
    entry = registry.registered()[op_type]
    monkeypatch.setitem(registry._REGISTRY, op_type,
                        registry.Description(op_type, build, None, None, "tests"))
    return entry


def test_a_wrong_region_is_caught(monkeypatch):
    def wrong_matmul(ctx):
        a, b = ctx.inputs
        ctx.compute(lambda i, j: Sum(lambda k: a[i, k] * b[k, 0]) + Fn("f", b[0, j]))
    _swap_description(monkeypatch, "MatMul", wrong_matmul)
    import tensorflow as tf
    sample = Sample("MatMul", "wrong", lambda a, b: tf.matmul(a, b), (arg((5, 7)), arg((7, 6))))
    report = validate_sample(sample, ks=(2,))
    kinds = {f.kind for f in report.failures}
    assert "wrong" in kinds or "error" in kinds


def test_a_hidden_dimension_is_reported_missing(monkeypatch):
    def relu_whole_rows(ctx):
        x = ctx.inputs[0]
        ctx.compute(lambda i, j: Opaque("row", Window(lambda c: x[i, c])) + Fn("f", x[i, j]))
    _swap_description(monkeypatch, "Relu", relu_whole_rows)
    import tensorflow as tf
    sample = Sample("Relu", "hidden", tf.nn.relu, (arg((4, 6)),))
    report = validate_sample(sample, ks=(2,))
    missing = [f for f in report.failures if f.kind == "missing"]
    assert len(missing) == 1 and "input 0 dim 1" in missing[0].message
