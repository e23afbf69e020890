"""The `dtype` step setting: float64 steps are float64 throughout, float32 stays the default."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tofu_tf.errors import TofuError
from tofu_tf.models import DTYPES, MODELS, OPTIMIZERS, build, layers

MODEL_NAMES = sorted(MODELS)
INT_INPUT_MODELS = ("lstm", "transformer")  # token ids and labels stay int32


def float_outputs_not_float64(graph):
    """'op:index dtype' of every floating node output in `graph` that is not float64."""
    return [f"{t.name} {t.dtype.name}" for op in graph.get_operations() for t in op.outputs
            if t.dtype.is_floating and t.dtype != tf.float64]


def without_gradient_names(graph_def):
    """A copy without `_gradient_op_type`: TensorFlow names each custom gradient (the
    norms') from a process-wide counter, so two builds differ there only."""
    copy = type(graph_def)()
    copy.CopyFrom(graph_def)
    for nodes in [copy.node] + [f.node_def for f in copy.library.function]:
        for node in nodes:
            node.attr.pop("_gradient_op_type", None)
    return copy


def run_graph_only(step, count):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(step.graph_def, name="")
    feed = dict(zip(step.feeds, step.sample_batch(0)))
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(step.init_op)
        losses = [session.run(step.fetches, feed)[0] for _ in range(count)]
    return graph, losses


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_graph_only_float64_step_is_float64_throughout_and_runs(name):
    step = build(name, optimizer="adam", batch_size=2, graph_only=True, dtype="float64")
    assert step.config["dtype"] == "float64" and "float64" in str(step)
    graph, losses = run_graph_only(step, 2)
    assert not float_outputs_not_float64(graph)
    assert all(isinstance(loss, np.float64) for loss in losses), losses
    assert np.all(np.isfinite(losses)), losses
    batch = step.sample_batch(0)
    assert [(a.shape, a.dtype.name) for a in batch] == list(step.feeds.values())
    want = "int32" if name in INT_INPUT_MODELS else "float64"
    assert [dtype for _, dtype in step.feeds.values()] == [want, want]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_optimizer_builds_float64_graph_only(name, optimizer):
    step = build(name, optimizer=optimizer, batch_size=2, graph_only=True, dtype="float64")
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(step.graph_def, name="")
    assert not float_outputs_not_float64(graph)
    handles = [op for op in graph.get_operations() if op.type == "VarHandleOp"]
    assert handles and all(op.get_attr("dtype") == tf.float64 for op in handles)


def test_eager_float64_mlp_variables_and_step():
    step = build("mlp", optimizer="adam", batch_size=4, seed=2, dtype="float64")
    assert step.config["dtype"] == "float64"
    assert step.variables and all(v.dtype == tf.float64 for v in step.variables)
    assert not float_outputs_not_float64(step.concrete_function.graph)
    assert [dtype for _, dtype in step.feeds.values()] == ["float64", "float64"]
    x, y = step.sample_batch(1)
    assert x.dtype == y.dtype == np.float64
    before = [v.numpy().copy() for v in step.variables]
    losses = [step.step(x, y) for _ in range(2)]
    assert all(loss.dtype == tf.float64 for loss in losses)
    assert np.all(np.isfinite([float(loss) for loss in losses]))
    assert not [v.name for v, old in zip(step.variables, before)
                if np.array_equal(v.numpy(), old)]


@pytest.mark.parametrize("name, optimizer", [
    ("lstm", "sgd"), ("transformer", "adam"), ("wresnet", "momentum")])
def test_eager_float64_other_models_run(name, optimizer):
    step = build(name, optimizer=optimizer, batch_size=2, dtype="float64")
    assert all(v.dtype == tf.float64 for v in step.variables)
    assert not float_outputs_not_float64(step.concrete_function.graph)
    assert np.isfinite(float(step.step(*step.sample_batch(0))))


def test_float64_sgd_step_matches_numpy_to_float64_precision():
    """Softmax regression (mlp without hidden layers): one step, exact to ~1e-13."""
    lr = 0.5
    step = build("mlp", optimizer="sgd", batch_size=8, learning_rate=lr, hidden=(),
                 dtype="float64")
    kernel, bias = (v.numpy() for v in step.variables)
    x, y = step.sample_batch(4)
    logits = x @ kernel + bias
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    delta = (probs - y) / len(x)
    loss = float(step.step(x, y))
    np.testing.assert_allclose(loss, -np.mean(np.sum(y * np.log(probs), axis=1)), rtol=1e-13)
    np.testing.assert_allclose(step.variables[0].numpy(), kernel - lr * x.T @ delta,
                               rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(step.variables[1].numpy(), bias - lr * delta.sum(axis=0),
                               rtol=1e-13, atol=1e-15)


def test_gelu_constant_has_the_input_dtype():
    x64 = np.linspace(-6.0, 6.0, 101)
    want = 0.5 * x64 * np.array([math.erfc(-v / math.sqrt(2.0)) for v in x64])
    np.testing.assert_allclose(layers.gelu(tf.constant(x64)).numpy(), want,
                               rtol=1e-14, atol=1e-15)
    x32 = tf.constant(x64, tf.float32)
    np.testing.assert_array_equal(layers.gelu(x32).numpy(),
                                  tf.nn.gelu(x32, approximate=False).numpy())


def test_float32_is_the_default_and_explicit_float32_is_the_same_graph():
    default = build("transformer", optimizer="adam", batch_size=2, graph_only=True)
    explicit = build("transformer", optimizer="adam", batch_size=2, graph_only=True,
                     dtype=tf.float32)
    assert default.config["dtype"] == explicit.config["dtype"] == DTYPES[0] == "float32"
    assert without_gradient_names(default.graph_def) == \
        without_gradient_names(explicit.graph_def)
    assert "float32" not in str(default)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int32", "double", None, 64])
def test_unknown_dtype_raises_tofu_error_naming_valid_values(dtype):
    with pytest.raises(TofuError, match="float32, float64"):
        build("mlp", batch_size=2, graph_only=True, dtype=dtype)
