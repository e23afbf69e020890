"""tofu_tf.tools.debug: a planted wrong description is named; rounding is not blamed."""

import pytest

from tofu_tf.tools.debug import compare_step, model_case
from tofu_tf.op_semantics import registry
from tofu_tf.op_semantics.ops import reduce as reduce_ops


def _plant_mean_as_sum(monkeypatch):
    """Mean described with a sum as its combiner: a split of the reduced dim adds the
    parts' means where it should weigh them."""
    def mean_as_sum(ctx):
        x = ctx.inputs[0]
        axes = reduce_ops.normalize_axes(ctx.const(1), x.rank)
        reduce_ops._reduction(ctx, "sum", lambda index: x[index], axes,
                              bool(ctx.attr("keep_dims", False)))
    monkeypatch.setitem(registry._REGISTRY, "Mean",
                        registry.Description("Mean", mean_as_sum, None, None, "tests"))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_planted_wrong_description_is_named(monkeypatch, dtype):
    case = model_case("mlp", steps=1, dtype=dtype)
    _plant_mean_as_sum(monkeypatch)
    report = compare_step(case.imported, 8, case.batches, case.values)
    assert not report.equal
    culprit = report.culprit
    assert culprit is not None, str(report)
    assert culprit.diff.op_type == "Mean" and culprit.step == 0, str(report)
    assert culprit.replayed is not None and culprit.replayed.differs
    assert all(not d.differs for d in culprit.inputs)
    assert len(culprit.pieces) == 8 and len(culprit.choices) == 3
    assert "Mean" in str(report)


def test_the_unplanted_step_is_equal():
    case = model_case("mlp", steps=2, dtype="float64")
    report = compare_step(case.imported, 8, case.batches, case.values, rtol=1e-9)
    assert report.equal and report.culprit is None, str(report)
    assert len(report.steps) == 2


def test_float32_rounding_is_told_from_a_wrong_op():
    """At a tolerance below float32 rounding, a reordered sum differs from the whole op, but
    no more than the whole op's own rounding: nothing is blamed."""
    case = model_case("wresnet", steps=1, dtype="float32", batch_size=8)
    report = compare_step(case.imported, 8, case.batches, case.values, rtol=1e-7,
                          atol=1e-9)
    assert not report.equal, "the tolerance is meant to see float32 rounding"
    assert report.culprit is None, str(report)
    assert str(report).startswith("rounding only")


def test_bfloat16_rounding_is_told_from_a_wrong_op():
    """Keras's mixed_bfloat16 policy: partial sums rounded to bfloat16 differ from the whole
    ops by bfloat16's rounding, which is not blamed (NumPy does not rank ml_dtypes'
    bfloat16 among its floats: its arrays are still compared as numbers)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tofu_tf.tools.debug import case_of
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(0)
        layers = keras.layers
        model = keras.Sequential([
            keras.Input((8, 8, 3)), layers.Conv2D(8, 3, padding="same"),
            layers.BatchNormalization(), layers.ReLU(), layers.Flatten(), layers.Dense(16),
            layers.Dense(5, dtype="float32")])
        optimizer = keras.optimizers.SGD(0.1)

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=y, logits=model(x, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        rng = np.random.default_rng(0)
        batch = (rng.normal(size=(8, 8, 8, 3)).astype(np.float32),
                 rng.integers(0, 5, 8).astype(np.int32))
        concrete = tf.function(step).get_concrete_function(
            tf.TensorSpec(batch[0].shape, tf.float32), tf.TensorSpec(batch[1].shape, tf.int32))
        case = case_of(concrete, [batch])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    report = compare_step(case.imported, 4, case.batches, case.values, rtol=1e-3)
    assert not report.equal, "the tolerance is meant to see bfloat16 rounding"
    assert report.culprit is None, str(report)
    assert any(d.differs and "bfloat16" in str(case.imported.graph.tensors[d.tensor].dtype)
               for s in report.steps for d in s.tensors), str(report)
