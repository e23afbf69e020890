"""Levels composed as the emitter composes them (tofu_tf.tools.validate_levels): a
description right for the whole op but wrong for its part's local op is caught. Every
sample is composed at 2 x 2 and 2 x 3 parts by tests/tools/test_validate.py (SAME pooling,
empty parts of uneven reductions stay fixed there); here the cases beyond that default:
three levels (a hook that cannot cut a deeper part) and 3 x 4 parts (TensorFlow's own
AvgPoolGrad shapes)."""

import pytest
import tensorflow as tf

from tofu_tf.op_semantics import registry
from tofu_tf.op_semantics.ops import shape
from tofu_tf.op_semantics.samples import Sample, all_samples, arg
from tofu_tf.tools.validate import validate_sample

SAMPLES = all_samples()


def _split_offsets_from_outputs(ctx):
    """Split as it was once described: each output's offset along the axis from the
    outputs' sizes, which equal the kernel's pieces for the whole op only (a local op
    below a split of the axis keeps a share of each piece)."""
    x = ctx.inputs[1]
    axis = shape.normalize_axis(shape.const_ints_of(ctx, 0)[0], x.rank)
    shape._split(ctx, x, axis, [s[axis] for s in ctx.output_shapes])


def _gates_sample() -> Sample:
    """An LSTM's gates: a (batch, 4 x hidden) product cut into 4 along the columns."""
    return Sample("Split", "gates", lambda x: tf.split(x, 4, axis=1)[1], (arg((4, 8)),))


def test_a_description_wrong_below_a_split_is_caught(monkeypatch):
    right = registry.registered()["Split"]
    monkeypatch.setitem(registry._REGISTRY, "Split", registry.Description(
        "Split", _split_offsets_from_outputs, None, right.localize, "tests"))
    one_level = validate_sample(_gates_sample(), ks=(2,), levels=1)
    assert not one_level.failures, "\n".join(map(str, one_level.failures))
    two_levels = validate_sample(_gates_sample(), ks=(2,), levels=2)
    wrong = [f for f in two_levels.failures if f.kind == "wrong"]
    assert wrong and all(" then " in f.strategy for f in wrong)
    assert any(f.strategy.startswith("o:d1 then") for f in wrong), wrong


def test_the_right_description_composes():
    report = validate_sample(_gates_sample(), ks=(2,), levels=2)
    assert not report.failures, "\n".join(map(str, report.failures))
    assert report.checks > len(report.by_op["Split"])           # composed checks ran


@pytest.mark.parametrize("sample", [s for s in SAMPLES if s.op_type == "MirrorPad"],
                         ids=lambda s: s.id)
def test_a_part_the_hook_cannot_cut_runs_the_level_above(sample):
    """Below two splits of a dim, a reflected pad's part may need rows its hook cannot
    fetch (PartitionError): the device runs the level above's local op, a superset,
    instead of refusing the plan."""
    report = validate_sample(sample, ks=(2,), levels=3)
    assert not [f for f in report.findings if f.kind in ("wrong", "error", "refused")], \
        "\n".join(map(str, report.findings))


def test_same_average_gradient_regions_span_a_window():
    """TensorFlow's AvgPoolGrad misplaces a 5x5 stride-3 SAME window over an input 4 wide
    (the forward pool is right there). At 3 x 4 parts a local op's aligned region was 4
    wide; regions now span at least one window where the input allows."""
    from tofu_tf.op_semantics.analysis import analyze
    from tofu_tf.tools.kernels import OpInstance, expected_outputs
    from tofu_tf.tools.validate_levels import check_levels
    sample = next(s for s in SAMPLES if s.id == "AvgPoolGrad[5x5 s3 SAME]")
    inst = OpInstance.from_sample(sample)
    checks, findings = check_levels(inst, analyze(inst.sem), expected_outputs(inst),
                                    sample.id, ways=(3, 4))
    assert checks and not findings, "\n".join(map(str, findings))
