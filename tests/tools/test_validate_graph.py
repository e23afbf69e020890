"""The validator on the ops of real training graphs, with the values a step gave them."""

import numpy as np
import pytest
import tensorflow as tf

from tofu_tf.tools.debug import case_of, model_case
from tofu_tf.models.keras_models import keras_float, training_step
from tofu_tf.op_semantics import registry
from tofu_tf.op_semantics.ops import reduce as reduce_ops
from tofu_tf.tools.validate import graph_instances, validate_graph


def _keras_layers_case():
    """Layers with the strides, paddings, dilations and data formats Keras models use:
    stride-2 'same' and 'valid' convolutions on odd and even sizes, a dilated one,
    depthwise (stride 1 and 2), zero padding before a 'valid' stride-2 depthwise
    (MobileNetV2's downsampling), ReLU6, batch norm in training mode, pooling, and a
    residual add."""
    import keras
    keras.utils.set_random_seed(0)
    with keras_float("float64"):
        inputs = keras.Input((15, 15, 3))
        x = keras.layers.Conv2D(8, 3, strides=2, padding="same")(inputs)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU(6.0)(x)
        y = keras.layers.DepthwiseConv2D(3, padding="same")(x)
        x = keras.layers.Add()([x, y])
        x = keras.layers.ZeroPadding2D(((0, 1), (0, 1)))(x)
        x = keras.layers.DepthwiseConv2D(3, strides=2, padding="valid")(x)
        x = keras.layers.Conv2D(8, 3, dilation_rate=2, padding="same")(x)
        x = keras.layers.Conv2D(8, 2, strides=2, padding="valid")(x)
        x = keras.layers.MaxPooling2D(2, strides=1, padding="same")(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        outputs = keras.layers.Dense(4, activation="softmax")(x)
        model = keras.Model(inputs, outputs)
        step = training_step(model, keras.optimizers.SGD(0.05, momentum=0.9),
                             keras.losses.CategoricalCrossentropy())
    rng = np.random.default_rng(0)
    batch = (rng.standard_normal((4, 15, 15, 3)), np.eye(4)[rng.integers(0, 4, 4)])
    return case_of(step.get_concrete_function(*batch), [batch])


def test_keras_layers_validate_on_their_real_inputs():
    case = _keras_layers_case()
    types = {inst.op_type for _, inst in graph_instances(case.imported, case.batches[0],
                                                         case.values)}
    assert {"Conv2D", "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
            "DepthwiseConv2dNativeBackpropFilter", "Conv2DBackpropFilter", "Relu6",
            "Relu6Grad", "Pad", "MaxPool", "MaxPoolGrad"} <= types, types
    report = validate_graph(case.imported, case.batches[0], case.values)
    assert report.samples >= 40 and report.checks > 100
    assert not report.failures, "\n".join(map(str, report.failures))


def test_a_planted_wrong_description_is_found_in_a_real_graph(monkeypatch):
    def mean_as_sum(ctx):
        x = ctx.inputs[0]
        axes = reduce_ops.normalize_axes(ctx.const(1), x.rank)
        reduce_ops._reduction(ctx, "sum", lambda index: x[index], axes,
                              bool(ctx.attr("keep_dims", False)))
    case = model_case("mlp", steps=1)
    monkeypatch.setitem(registry._REGISTRY, "Mean",
                        registry.Description("Mean", mean_as_sum, None, None, "tests"))
    report = validate_graph(case.imported, case.batches[0], case.values, ks=(2,))
    wrong = [f for f in report.failures if f.kind == "wrong"]
    assert wrong and all(f.op_type == "Mean" for f in wrong), [str(f) for f in report.failures]
