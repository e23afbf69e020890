"""Keras models nobody here wrote train partitioned to the numbers they train to whole.

The fastest few of bench/keras_zoo.py (which sweeps them all): 3 steps of SGD with momentum
at 8 devices, through tofu_tf.function against tf.function, in float64 (so no float32
rounding, which training magnifies, stands between the two), loss and every variable."""

import pytest

import tofu_tf
from tofu_tf.tools import zoo
from tofu_tf.tools.zoo import LOSS_TOLERANCE, VARIABLE_TOLERANCE, train_side_by_side

FAST = ("mobilenetv2", "llama", "albert", "deberta_v3")


@pytest.mark.parametrize("model", FAST)
def test_trains_to_the_same_numbers(model):
    result = train_side_by_side(model, num_devices=8, dtype="float64", steps=3)
    assert result.outcome == "equal", result.to_dict()
    assert result.partitioned.loss_error <= LOSS_TOLERANCE
    assert result.partitioned.variable_error <= VARIABLE_TOLERANCE
    assert result.details["partitioned_nodes"] > result.details["planner_ops"]


@pytest.mark.parametrize("model", ["mobilenetv2", "llama"])
def test_trains_to_the_same_numbers_with_the_step_rewritten(model):
    """Updates early, gradient sums running, cheap forward ops recomputed: a real Keras
    graph (batch norm, depthwise convolutions, ReLU6; rotary attention, RMS norm)."""
    options = tofu_tf.Options(early_updates=True, recompute=tofu_tf.Recompute.CHEAP)
    result = train_side_by_side(model, num_devices=8, dtype="float64", steps=3,
                                options=options)
    assert result.outcome == "equal", result.to_dict()
    assert result.partitioned.variable_error <= VARIABLE_TOLERANCE
    assert result.details["recomputed_ops"] > 0


def test_grouped_convolutions_compiled_by_xla_train_to_the_same_numbers():
    """ConvNeXt's depthwise layers are Conv2D(groups=C), which Keras runs compiled by XLA:
    the call is inlined and each grouped op becomes a depthwise one (importer/_grouped)."""
    result = train_side_by_side("convnexttiny", num_devices=8, dtype="float64", steps=2)
    assert result.outcome == "equal", result.to_dict()
    assert result.partitioned.variable_error <= VARIABLE_TOLERANCE


def test_a_float64_drift_past_the_tolerances_is_measured_against_the_yardstick(monkeypatch):
    """In float64 the yardstick (the unpartitioned training from weights one unit in the
    last place off) runs where the drift is past the tolerances (here made 0): Adam turns
    float64 rounding into drift too (tools/zoo.py)."""
    monkeypatch.setattr(zoo, "LOSS_TOLERANCE", 0.0)
    monkeypatch.setattr(zoo, "VARIABLE_TOLERANCE", 0.0)
    result = train_side_by_side("fnet", num_devices=2, dtype="float64", steps=1)
    assert zoo.verdict(result.partitioned, None) == "DIFFERS"    # past them
    assert result.yardstick is not None and result.yardstick.losses
