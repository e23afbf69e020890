"""The gradient of every described op is described too: each sample's op is differentiated
by TensorFlow inside one `tf.function` and imported as a training step is; no op of the
imported graph lacks a description (a missing one would run whole on every device). The
samples of gradient ops give the second-order gradients (a gradient penalty's: MaxPoolGrad
differentiated is MaxPoolGradGrad). Shape arithmetic of a gradient (ConcatOffset,
BroadcastGradientArgs, ...) is folded to constants by the importer, as in every step."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tofu_tf.importer.graphdef_io import import_concrete_function
from tofu_tf.op_semantics.registry import description
from tofu_tf.op_semantics.samples import all_samples


def _inexact(dtype) -> bool:
    return dtype.is_floating or dtype.is_complex


def _differentiable(value) -> list:
    """The float and complex outputs of static shape (a step's shapes are static)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if isinstance(v, tf.Tensor) and _inexact(v.dtype)
            and v.shape.is_fully_defined()]


def _squares(value) -> tf.Tensor:
    if value.dtype.is_complex:
        return tf.reduce_sum(tf.math.real(value) ** 2 + tf.math.imag(value) ** 2)
    return tf.reduce_sum(value * value)


def _step(samples):
    """One function: each sample's op on fed inputs, the gradient of the sum of its squared
    float (and complex) outputs with respect to its float (and complex) inputs and
    variables. Samples whose op has no registered gradient, or no such output of static
    shape, are left out."""
    rng = np.random.default_rng(0)
    values = {s.id: [a.make(rng) for a in s.args] for s in samples}
    variables = {(s.id, i): tf.Variable(values[s.id][i]) for s in samples
                 for i, a in enumerate(s.args) if a.kind == "variable"}
    fed = [(s.id, i) for s in samples for i, a in enumerate(s.args) if a.kind == "input"]
    specs = [tf.TensorSpec(values[k][i].shape, tf.as_dtype(values[k][i].dtype)) for k, i in fed]
    differentiated = []

    @tf.function(input_signature=specs, autograph=False)
    def step(*inputs):
        feed = dict(zip(fed, inputs))
        results = []
        for s in samples:
            args = [variables[(s.id, i)] if a.kind == "variable" else feed[(s.id, i)]
                    if a.kind == "input" else tf.constant(values[s.id][i])
                    for i, a in enumerate(s.args)]
            sources = [x for x in args if _inexact(x.dtype)]
            try:
                with tf.GradientTape() as tape:
                    tape.watch([x for x in sources if isinstance(x, tf.Tensor)])
                    outputs = _differentiable(s.build(*args))
                    if not outputs or not sources:
                        continue
                    loss = tf.add_n([_squares(o) for o in outputs])
                grads = tape.gradient(loss, sources,
                                      unconnected_gradients=tf.UnconnectedGradients.ZERO)
            except (LookupError, ValueError):   # TensorFlow has no gradient for it (or
                continue                           # for its attrs: EXPLICIT MaxPoolGrad)
            differentiated.append(s.id)
            results += [loss] + grads
        return results
    return step.get_concrete_function(), differentiated


def test_every_described_ops_gradient_is_described():
    function, differentiated = _step(all_samples())
    assert len(differentiated) > 350            # most samples' ops have a gradient
    graph = import_concrete_function(function).graph
    missing = sorted({op.type for op in graph.ops if description(op.type) is None})
    assert not missing, missing
    kinds = {op.type for op in graph.ops}
    for gradient in ("MirrorPadGrad", "ScatterNd", "Conv2DBackpropInput", "MaxPoolGrad",
                     "MaxPoolGradGrad", "IFFT2D"):
        assert gradient in kinds                # the gradients are there to be checked
