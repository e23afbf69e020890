"""Layers as plain TF ops: each constructor creates its variables and returns `apply(x)`.

Creating variables at construction and computing in `apply` lets the same model code run
eagerly (variables made outside the traced step) and in graph-only mode.
"""

from __future__ import annotations

import math
import weakref
from typing import Callable

import tensorflow as tf
from tensorflow.python.eager import record

from tofu_tf.models.blocks import tracing
from tofu_tf.models.common import VariableStore

Apply = Callable[[tf.Tensor], tf.Tensor]
NORM_EPSILON = 1e-5
BN_MOMENTUM = 0.9
NHW = (0, 1, 2)                    # the axes a batch norm reduces over

_CONSTANTS: "weakref.WeakKeyDictionary[tf.Graph, dict]" = weakref.WeakKeyDictionary()


def shared_constant(value, dtype: tf.DType) -> tf.Tensor:
    """One Const per graph for each (value, dtype) the layers use (reduction axes,
    epsilons, factors), where writing the value at each use makes a Const there: ResNet-50's
    norms would build some 120 equal ones. The table keeps names, not tensors, which would
    keep their graph alive. Eager: a plain constant."""
    if tf.executing_eagerly():
        return tf.constant(value, dtype)
    graph = tf.compat.v1.get_default_graph()
    names, key = _CONSTANTS.setdefault(graph, {}), (value, dtype)
    if key in names:
        return graph.get_tensor_by_name(names[key])
    with graph.name_scope(None):
        tensor = tf.constant(value, dtype, name="shared_constant")
    names[key] = tensor.name
    return tensor


def dense(store: VariableStore, name: str, d_in: int, d_out: int, *,
          scale: float | None = None) -> Apply:
    """y = x @ W + b for x of shape [n, d_in] (a BiasAdd: its gradient is one
    BiasAddGrad, where a broadcasting add's is a Sum and a Reshape)."""
    kernel = store.get(f"{name}/kernel", [d_in, d_out],
                       1.0 / math.sqrt(d_in) if scale is None else scale)
    bias = store.get(f"{name}/bias", [d_out])

    def apply(x):
        return tf.nn.bias_add(tf.matmul(x, kernel), bias)
    return apply


def conv2d(store: VariableStore, name: str, size: int, c_in: int, c_out: int,
           stride: int = 1) -> Apply:
    """NHWC convolution with SAME padding and no bias (a batch norm follows it)."""
    kernel = store.get(f"{name}/kernel", [size, size, c_in, c_out],
                       math.sqrt(2.0 / (size * size * c_in)))

    def apply(x):
        return tf.nn.conv2d(x, kernel, strides=stride, padding="SAME")
    return apply


def batch_norm(store: VariableStore, name: str, channels: int) -> Apply:
    """Training-mode batch norm over N, H, W; also updates the moving mean and variance.
    Its gradient is written out (`_normalize`): ten ops where the tape's derivation of
    the plain formula makes some forty per norm (a third of ResNet-50's step)."""
    gamma = store.get(f"{name}/gamma", [channels], offset=1.0)
    beta = store.get(f"{name}/beta", [channels])
    moving_mean = store.get(f"{name}/moving_mean", [channels], trainable=False)
    moving_var = store.get(f"{name}/moving_variance", [channels], offset=1.0, trainable=False)

    def apply(x):
        axes = shared_constant(NHW, tf.int32)
        mean = tf.reduce_mean(x, axes)
        variance = tf.reduce_mean(tf.math.squared_difference(x, mean), axes)
        _update_moving(store, moving_mean, mean)
        _update_moving(store, moving_var, variance)
        return with_gradient(_normalize, x, mean, variance, tf.convert_to_tensor(gamma),
                             tf.convert_to_tensor(beta))
    return apply


def with_gradient(forward: Callable, *inputs: tf.Tensor) -> tf.Tensor:
    """`forward(*inputs)` returns (y, grad), `grad(dy)` one gradient per input (None: no
    gradient); y is differentiated by `grad` alone.

    On a tape (the step's), one op from `inputs` to y is recorded and the forward's own
    ops are not. `tf.custom_gradient` does the same for any gradient, the symbolic one of
    a block's function graph too, at a cost a tape does not need: an IdentityN over y and
    every input, whose unused outputs the tape fills with zeros, eight ops per batch norm."""
    if tracing():
        return tf.custom_gradient(forward)(*inputs)
    with record.stop_recording():
        y, grad = forward(*inputs)
    record.record_operation(forward.__name__, [y], list(inputs), grad)
    return y


def _normalize(x, mean, variance, gamma, beta):
    """xhat * gamma + beta, xhat = (x - mean) * inv, inv = rsqrt(variance + eps), for the
    mean and variance of x over N, H, W. With m = N*H*W the whole backward (through the
    statistics too, so they get no gradient of their own) is

        dbeta = sum(dy),  dgamma = sum(dy * xhat),
        dx = gamma * inv * (dy - (xhat * dgamma + dbeta) / m)."""
    inv = tf.math.rsqrt(variance + shared_constant(NORM_EPSILON, x.dtype))
    xhat = (x - mean) * inv
    count = math.prod(x.shape[:3])

    def grad(dy):      # constants made here: a block's backward graph would capture them
        axes, per_count = shared_constant(NHW, tf.int32), shared_constant(1.0 / count, x.dtype)
        dbeta = tf.reduce_sum(dy, axes)
        dgamma = tf.reduce_sum(dy * xhat, axes)
        dx = (gamma * inv) * (dy - (xhat * dgamma + dbeta) * per_count)
        return dx, None, None, dgamma, dbeta
    return xhat * gamma + beta, grad


def _update_moving(store: VariableStore, moving: tf.Variable, batch_value: tf.Tensor) -> None:
    """moving -= (moving - batch_value) * (1 - momentum), the moving average as Keras
    writes it: a Sub, a Mul and an AssignSubVariableOp, never differentiated (in a block's
    function, whose backward differentiates every result, a StopGradient keeps the Mul's
    and Sub's broadcasting gradients, dead ops, out of it)."""
    earlier = [] if tracing() else store.updates_of(moving)
    with record.stop_recording(), tf.control_dependencies(earlier):
        delta = (moving - batch_value) * shared_constant(1.0 - BN_MOMENTUM,
                                                         batch_value.dtype)
    if tracing():
        delta = tf.stop_gradient(delta)
    store.add_update(moving.assign_sub(delta, read_value=False))


def layer_norm(store: VariableStore, name: str, channels: int) -> Apply:
    """Normalises the last axis: (x - mean) / sqrt(var + eps) * gain + bias. Its gradient
    is written out (`_layer_normalize`): eleven ops where the tape's derivation of the
    formula makes some twenty-five per norm."""
    gain = store.get(f"{name}/gain", [channels], offset=1.0)
    bias = store.get(f"{name}/bias", [channels])

    def apply(x):
        return with_gradient(_layer_normalize, x, tf.convert_to_tensor(gain),
                             tf.convert_to_tensor(bias))
    return apply


def _layer_normalize(x, gain, bias):
    """xhat * gain + bias, xhat = (x - mean) * inv, inv = rsqrt(variance + eps), for the
    mean and variance of x over its last axis. With g = dy * gain the backward is

        dbias = sum(dy),  dgain = sum(dy * xhat)   (over every axis but the last),
        dx = inv * (g - mean(g) - xhat * mean(g * xhat))   (means over the last axis)."""
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    inv = tf.math.rsqrt(variance + shared_constant(NORM_EPSILON, x.dtype))
    xhat = centered * inv
    outer = list(range(x.shape.rank - 1))

    def grad(dy):
        g = dy * gain
        spread = tf.reduce_mean(g, axis=-1, keepdims=True) + xhat * tf.reduce_mean(
            g * xhat, axis=-1, keepdims=True)
        dx = inv * (g - spread)
        return dx, tf.reduce_sum(dy * xhat, outer), tf.reduce_sum(dy, outer)
    return xhat * gain + bias, grad


def gelu(x: tf.Tensor) -> tf.Tensor:
    """Exact GELU, 0.5 * x * erfc(-x / sqrt(2)), with its constant in x's dtype.

    The same ops and names as `tf.nn.gelu(x, approximate=False)`, which makes its constant
    as a float32 Const cast to x's dtype: float32 rounding (and a float32 node) in a float64
    step. For float32 x the graph is identical.
    """
    with tf.name_scope("Gelu"):
        def inv_sqrt2():
            with tf.name_scope("Cast"):
                return tf.constant(0.7071067811865476, x.dtype, name="x")
        return 0.5 * x * tf.math.erfc(-x * inv_sqrt2())


def softmax_cross_entropy(logits: tf.Tensor, one_hot_labels: tf.Tensor) -> tf.Tensor:
    """Mean softmax cross-entropy against dense (one-hot) labels."""
    losses = tf.nn.softmax_cross_entropy_with_logits(labels=one_hot_labels, logits=logits)
    return tf.reduce_mean(losses)


def sparse_softmax_cross_entropy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Mean softmax cross-entropy against integer labels (logits [n, classes], labels [n])."""
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_mean(losses)
