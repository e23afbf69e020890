"""Reference models: eager steps learn and are deterministic, the math matches NumPy,
graph-only builds are small and runnable."""

import numpy as np
import pytest
import tensorflow as tf

from tofu_tf.errors import TofuError
from tofu_tf.models import MODELS, OPTIMIZERS, build

MODEL_NAMES = sorted(MODELS)
CONST_ELEMENT_LIMIT = 4096


def run_steps(step_model, count, seed=0):
    x, y = step_model.sample_batch(seed)
    return [float(step_model.step(x, y)) for _ in range(count)]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_eager_step_learns_changes_state_and_is_deterministic(name, optimizer):
    model = build(name, optimizer=optimizer, batch_size=4, seed=3)
    before = [v.numpy().copy() for v in model.variables]
    losses = run_steps(model, 4)
    assert np.all(np.isfinite(losses)), losses
    if optimizer == "sgd":
        assert losses[-1] < losses[0], losses
    unchanged = [v.name for v, old in zip(model.variables, before)
                 if np.array_equal(v.numpy(), old)]
    assert not unchanged
    again = run_steps(build(name, optimizer=optimizer, batch_size=4, seed=3), 4)
    assert again == losses


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_eager_build_exposes_graph_and_feeds(name):
    model = build(name, batch_size=2)
    nodes = {n.name for n in model.graph_def.node}
    assert model.fetches == ["loss:0", "train_op"]
    assert {"loss", "train_op"} <= nodes
    x, y = model.sample_batch()
    assert [(a.shape, a.dtype.name) for a in (x, y)] == list(model.feeds.values())
    assert [t.name for t in model.concrete_function.inputs[:2]] == list(model.feeds)
    trainable = [v for v in model.variables if v.trainable]
    assert len(model.concrete_function.graph.captures) >= len(trainable)


def test_str_names_model_sizes_and_mode():
    text = str(build("lstm", optimizer="adam", batch_size=2, graph_only=True, hidden=8))
    assert text.startswith("lstm(layers=2, hidden=8,") and "adam, batch 2, graph-only" in text


def test_different_seeds_give_different_weights():
    first, second = (build("mlp", batch_size=2, seed=s) for s in (0, 1))
    assert not np.array_equal(first.variables[0].numpy(), second.variables[0].numpy())


# ---- math against NumPy -------------------------------------------------------------

def numpy_mlp_gradients(params, x, y):
    """Gradients of mean softmax cross-entropy of relu MLP; params = [W0, b0, W1, b1, ...]."""
    layers = list(zip(params[0::2], params[1::2]))
    activations, h = [x], x
    for i, (w, b) in enumerate(layers):
        z = h @ w + b
        h = np.maximum(z, 0.0) if i < len(layers) - 1 else z
        activations.append(h)
    logits = activations[-1]
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    delta = (probs - y) / len(x)
    grads = []
    for i in reversed(range(len(layers))):
        grads[:0] = [activations[i].T @ delta, delta.sum(axis=0)]
        delta = (delta @ layers[i][0].T) * (activations[i] > 0)
    return grads


def mlp_params(model):
    return [v.numpy().astype(np.float64) for v in model.variables if v.trainable]


def test_mlp_sgd_step_matches_numpy():
    model = build("mlp", optimizer="sgd", batch_size=8, learning_rate=0.1, hidden=(12, 7))
    x, y = model.sample_batch(5)
    params = mlp_params(model)
    grads = numpy_mlp_gradients(params, x.astype(np.float64), y.astype(np.float64))
    model.step(x, y)
    for got, w, g in zip(mlp_params(model), params, grads):
        np.testing.assert_allclose(got, w - 0.1 * g, rtol=1e-5, atol=1e-6)


def test_mlp_adam_update_matches_textbook_formula():
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-8
    model = build("mlp", optimizer="adam", batch_size=8, learning_rate=lr, hidden=(12,))
    x, y = model.sample_batch(6)
    by_name = {v.name.split(":")[0]: v for v in model.variables}
    kernel, m, v = (by_name[n] for n in ("dense0/kernel", "dense0/kernel/adam_m",
                                         "dense0/kernel/adam_v"))
    m_old, v_old = np.zeros(kernel.shape), np.zeros(kernel.shape)
    for t in (1, 2):
        w_old = kernel.numpy().astype(np.float64)
        grad = numpy_mlp_gradients(mlp_params(model), x.astype(np.float64),
                                   y.astype(np.float64))[0]
        model.step(x, y)
        assert by_name["adam/step"].numpy() == t
        m_new, v_new = m.numpy().astype(np.float64), v.numpy().astype(np.float64)
        np.testing.assert_allclose(m_new, b1 * m_old + (1 - b1) * grad, atol=1e-7)
        np.testing.assert_allclose(v_new, b2 * v_old + (1 - b2) * grad ** 2, atol=1e-9)
        m_hat, v_hat = m_new / (1 - b1 ** t), v_new / (1 - b2 ** t)
        np.testing.assert_allclose(kernel.numpy(), w_old - lr * m_hat / (np.sqrt(v_hat) + eps),
                                   rtol=1e-5, atol=1e-6)
        m_old, v_old = m_new, v_new


def test_momentum_slot_accumulates_gradient():
    model = build("mlp", optimizer="momentum", batch_size=8, learning_rate=0.1)
    x, y = model.sample_batch(1)
    bias = next(v for v in model.variables if v.name.startswith("dense2/bias"))
    slot = next(v for v in model.variables if v.name.startswith("dense2/bias/momentum"))
    grad = numpy_mlp_gradients(mlp_params(model), x.astype(np.float64), y.astype(np.float64))
    before = bias.numpy().copy()
    model.step(x, y)
    np.testing.assert_allclose(slot.numpy(), grad[-1], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(bias.numpy(), before - 0.1 * grad[-1], rtol=1e-5, atol=1e-7)


# ---- graph-only ---------------------------------------------------------------------

def const_elements(node):
    return int(np.prod([d.size for d in node.attr["value"].tensor.tensor_shape.dim]))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_graph_only_build_is_small_and_complete(name, optimizer):
    model = build(name, optimizer=optimizer, batch_size=2, graph_only=True)
    nodes = {n.name: n for n in model.graph_def.node}
    assert model.step is None and model.variables is None
    assert any(n.op == "VarHandleOp" for n in nodes.values())
    assert model.fetches[0].split(":")[0] in nodes and model.fetches[1] in nodes
    for feed, (shape, dtype) in model.feeds.items():
        node = nodes[feed.split(":")[0]]
        assert node.op == "Placeholder"
        assert tuple(d.size for d in node.attr["shape"].shape.dim) == shape
    big = [n.name for n in nodes.values()
           if n.op == "Const" and const_elements(n) > CONST_ELEMENT_LIMIT]
    assert not big


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_graph_only_build_runs_in_a_session(name):
    model = build(name, optimizer="adam", batch_size=2, graph_only=True)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(model.graph_def, name="")
    x, y = model.sample_batch()
    feed = dict(zip(model.feeds, (x, y)))
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(model.init_op)
        losses = [session.run(model.fetches, feed)[0] for _ in range(3)]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_graph_only_allocates_nothing_for_large_shapes():
    model = build("mlp", batch_size=2, graph_only=True, hidden=(100_000, 100_000))
    assert len(model.graph_def.node) < 1000
    assert model.graph_def.ByteSize() < 1_000_000


# ---- errors -------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, text", [
    (dict(name="vgg"), "vgg"),
    (dict(name="mlp", optimizer="rmsprop"), "rmsprop"),
    (dict(name="mlp", width=3), "width"),
    (dict(name="mlp", batch_size=0), "batch_size"),
    (dict(name="mlp", hidden=(4, -1)), "-1"),
    (dict(name="wresnet", depth=34), "34"),
    (dict(name="wresnet", units=(1, 2)), "units"),
    (dict(name="transformer", d_model=30, heads=4), "heads=4"),
    (dict(name="lstm", learning_rate=-1.0), "learning_rate"),
    (dict(name="lstm", seed=-3), "seed"),
])
def test_bad_settings_raise_tofu_error(kwargs, text):
    kwargs = {"batch_size": 2, **kwargs}
    with pytest.raises(TofuError, match=text):
        build(kwargs.pop("name"), **kwargs)
