"""Turns a model definition into a `ModelStep`, eagerly or graph-only, from the same code.

A training step is: forward under a `tf.GradientTape`, gradients of the mean loss with
respect to every trainable variable, and the optimizer's assignments. Both modes call
`train_step`:

- eager: variables are made now from a seeded NumPy generator; the step is a `tf.function`
  with a fixed input signature, traced once; its FuncGraph is the GraphDef.
- graph-only: everything, inputs included (`tf.compat.v1.placeholder`), is made inside a
  fresh `tf.Graph`; variable initializers are never run, so no weight memory is allocated.

Either way the graph holds a tensor `loss:0` and a NoOp `train_op` grouping all updates;
a graph-only graph also holds a NoOp `init` that runs every variable initializer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import tensorflow as tf

from tofu_tf.errors import TofuError
from tofu_tf.models.common import FeedSpec, ModelStep, VariableStore
from tofu_tf.models.optimizers import make_optimizer, optimizer_config

LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
LOSS_NAME, TRAIN_OP_NAME, INIT_OP_NAME = "loss", "train_op", "init"


@dataclass(frozen=True)
class ModelDef:
    """How to build one model; calling it is `build(name, ...)`."""

    name: str
    defaults: Mapping[str, object]           # every size setting with its tiny default
    normalize: Callable[[dict], dict]         # checked, completed sizes (raises TofuError)
    define: Callable[[VariableStore, dict, int], LossFn]  # makes variables, returns loss_fn
    inputs: Callable[[dict, int], tuple[FeedSpec, FeedSpec]]  # (x, y) shapes and dtypes
    sample: Callable[[dict, int, np.random.Generator], tuple[np.ndarray, np.ndarray]]

    def __call__(self, **kwargs) -> ModelStep:
        return build_step(self, **kwargs)


def build_step(model: ModelDef, *, optimizer: str = "sgd", batch_size: int,
               graph_only: bool = False, seed: int = 0, learning_rate: float | None = None,
               **sizes) -> ModelStep:
    sizes = model.normalize(_complete_sizes(model, sizes))
    batch_size = check_positive_int("batch_size", batch_size)
    opt = optimizer_config(optimizer, learning_rate)
    config = {**sizes, "batch_size": batch_size, **opt.as_dict(), "seed": seed,
              "graph_only": graph_only}
    x_spec, y_spec = model.inputs(sizes, batch_size)
    sample = lambda rng: model.sample(sizes, batch_size, rng)  # noqa: E731
    build = _build_graph_only if graph_only else _build_eager
    return build(model, sizes, batch_size, opt, seed, x_spec, y_spec, config, sample)


def train_step(loss_fn: LossFn, store: VariableStore, optimizer, x, y):
    """Forward, gradients and updates; returns (loss tensor, train_op).

    Embedding gradients arrive as `tf.IndexedSlices`; they are made dense with
    `tf.convert_to_tensor` (an UnsortedSegmentSum) before the optimizer, so every update
    is a dense assignment.
    """
    store.updates = []
    with tf.GradientTape() as tape:
        loss = loss_fn(x, y)
    grads = tape.gradient(loss, store.trainable)
    missing = [v.name for v, g in zip(store.trainable, grads) if g is None]
    if missing:
        raise TofuError(f"no gradient reaches variable(s) {missing}.",
                        fix="every trainable variable must feed the loss.")
    grads = [tf.convert_to_tensor(g) for g in grads]
    updates = store.updates + optimizer.apply(grads)
    train_op = tf.group(*updates, name=TRAIN_OP_NAME)
    return tf.identity(loss, name=LOSS_NAME), train_op


def _build_eager(model, sizes, batch_size, opt, seed, x_spec, y_spec, config, sample):
    store = VariableStore(graph_only=False, seed=seed)
    loss_fn = model.define(store, sizes, batch_size)
    optimizer = make_optimizer(opt, store)
    signature = [tf.TensorSpec(x_spec[0], x_spec[1], name="x"),
                 tf.TensorSpec(y_spec[0], y_spec[1], name="y")]

    @tf.function(input_signature=signature)
    def step(x, y):
        loss, _ = train_step(loss_fn, store, optimizer, x, y)
        return loss

    concrete = step.get_concrete_function()
    graph_def = concrete.graph.as_graph_def(add_shapes=True)
    feeds = {t.name: (tuple(t.shape.as_list()), t.dtype.name) for t in concrete.inputs[:2]}
    return ModelStep(model.name, config, graph_def, [f"{LOSS_NAME}:0", TRAIN_OP_NAME], feeds,
                     step=step, concrete_function=concrete, variables=store.variables,
                     _sample=sample)


def _build_graph_only(model, sizes, batch_size, opt, seed, x_spec, y_spec, config, sample):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(x_spec[1], x_spec[0], name="x")
        y = tf.compat.v1.placeholder(y_spec[1], y_spec[0], name="y")
        store = VariableStore(graph_only=True, seed=seed)
        loss_fn = model.define(store, sizes, batch_size)
        optimizer = make_optimizer(opt, store)
        loss, train_op = train_step(loss_fn, store, optimizer, x, y)
        init_op = tf.group(*[v.initializer for v in store.variables], name=INIT_OP_NAME)
    graph_def = graph.as_graph_def(add_shapes=True)
    feeds = {t.name: (tuple(t.shape.as_list()), t.dtype.name) for t in (x, y)}
    return ModelStep(model.name, config, graph_def, [loss.name, train_op.name], feeds,
                     init_op=init_op.name, _sample=sample)


def _complete_sizes(model: ModelDef, sizes: dict) -> dict:
    unknown = sorted(set(sizes) - set(model.defaults))
    if unknown:
        raise TofuError(f"model '{model.name}' has no size setting(s) {unknown}; valid "
                        f"settings: {', '.join(model.defaults)}.")
    return {**model.defaults, **sizes}


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise TofuError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)
