"""Turns a model definition into a `ModelStep`, eagerly or graph-only, from the same code.

A training step is: forward under a `tf.GradientTape`, gradients of the mean loss with
respect to every trainable variable, and the optimizer's assignments. Both modes call
`train_step`:

- eager: variables are made now from a seeded NumPy generator; the step is a `tf.function`
  with a fixed input signature, traced once; its FuncGraph is the GraphDef.
- graph-only: everything, inputs included (`tf.compat.v1.placeholder`), is made inside a
  fresh `tf.Graph`; variable initializers are never run, so no weight memory is allocated.
  Variables are `GraphVariable`s: the nodes tf.Variable makes that a step uses, under
  the same names (the GraphDef is tf.Variable's minus its never-run bookkeeping nodes),
  in a fraction of the time.

Every float in the step has the build's `dtype` ("float32" default, or "float64"; see
`common.check_dtype`): the `VariableStore` carries it, and `inputs` and `sample` get it.

Either way the graph holds a tensor `loss:0` and a NoOp `train_op` grouping all updates;
a graph-only graph also holds a NoOp `init` that runs every variable initializer, unless
it is built with `initializers=False`: a step that is only planned never runs them (the
importer drops every node the fetches do not need), and they are a sixth of its nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework.graph_pb2 import GraphDef

from tofu_tf._gc import paused_gc
from tofu_tf.errors import TofuError
from tofu_tf.models.common import (DEFAULT_DTYPE, FeedSpec, GraphVariable, ModelStep,
                                   VariableStore, check_dtype)
from tofu_tf.models.optimizers import OptimizerConfig, make_optimizer, optimizer_config

LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
LOSS_NAME, TRAIN_OP_NAME, INIT_OP_NAME = "loss", "train_op", "init"


@dataclass(frozen=True)
class ModelDef:
    """How to build one model; calling it is `build(name, ...)`."""

    name: str
    defaults: Mapping[str, object]           # every size setting with its tiny default
    normalize: Callable[[dict], dict]         # checked, completed sizes (raises TofuError)
    define: Callable[[VariableStore, dict, int], LossFn]  # makes variables, returns loss_fn
    # (sizes, batch_size, float dtype name) -> (x, y) shapes and dtypes
    inputs: Callable[[dict, int, str], tuple[FeedSpec, FeedSpec]]
    # (sizes, batch_size, float dtype name, rng) -> one (x, y) batch
    sample: Callable[[dict, int, str, np.random.Generator], tuple[np.ndarray, np.ndarray]]

    def __call__(self, **kwargs) -> ModelStep:
        return build_step(self, **kwargs)


@dataclass(frozen=True)
class _Setup:
    """The checked settings of one build."""

    model: ModelDef
    sizes: dict
    batch_size: int
    optimizer: OptimizerConfig
    seed: int
    dtype: str                                # "float32" or "float64"
    layer_functions: bool                     # graph-only: one function per distinct block
    initializers: bool                        # graph-only: build the variables' `init` op
    micro_batches: int = 1                    # gradients accumulated over batch slices

    def prepare(self, graph_only: bool):
        """A fresh store, the model's loss_fn and the optimizer (variables made here)."""
        store = VariableStore(graph_only=graph_only, seed=self.seed, dtype=self.dtype,
                              layer_functions=self.layer_functions,
                              initializers=self.initializers)
        loss_fn = self.model.define(store, self.sizes, self.batch_size // self.micro_batches)
        return store, loss_fn, make_optimizer(self.optimizer, store)

    def input_specs(self):
        return self.model.inputs(self.sizes, self.batch_size, self.dtype)


def build_step(model: ModelDef, *, optimizer: str = "sgd", batch_size: int,
               graph_only: bool = False, seed: int = 0, learning_rate: float | None = None,
               dtype: str = DEFAULT_DTYPE, layer_functions: bool = True,
               initializers: bool = True, micro_batches: int = 1, **sizes) -> ModelStep:
    """`layer_functions` (graph-only): the model's repeated blocks are traced once each, as
    functions the importer inlines (blocks.py); False builds every op directly.
    `initializers=False` (graph-only): no variable initializers and no `init` op (the
    step's `init_op` is None), for a step that is planned, never run. `micro_batches`:
    the step accumulates the gradients of that many equal slices of its batch (see
    `train_step`)."""
    batch_size = check_positive_int("batch_size", batch_size)
    micro_batches = check_positive_int("micro_batches", micro_batches)
    if batch_size % micro_batches:
        raise TofuError(f"a batch of {batch_size} does not cut into {micro_batches} equal "
                        "micro-batches.", fix="pass a micro-batch count that divides the "
                                              "batch size.")
    setup = _Setup(model, model.normalize(_complete_sizes(model, sizes)), batch_size,
                   optimizer_config(optimizer, learning_rate), _check_seed(seed),
                   check_dtype(dtype), bool(layer_functions) and graph_only,
                   bool(initializers) or not graph_only, micro_batches)
    config = {**setup.sizes, "batch_size": setup.batch_size, **setup.optimizer.as_dict(),
              "micro_batches": micro_batches,
              "seed": seed, "graph_only": graph_only, "dtype": setup.dtype,
              "layer_functions": setup.layer_functions, "initializers": setup.initializers}
    fields = _build_graph_only(setup) if graph_only else _build_eager(setup)
    return ModelStep(model.name, config, **fields, _sample=partial(
        model.sample, setup.sizes, setup.batch_size, setup.dtype))


def train_step(loss_fn: LossFn, store: VariableStore, optimizer, x, y,
               micro_batches: int = 1):
    """Forward, gradients and updates; returns (loss tensor, train_op).

    With `micro_batches` = M > 1, x and y are cut into M equal slices along the batch, the
    forward pass runs on each in turn, and the loss is the mean of the slices' mean losses:
    its gradient, computed once over all slices, is the mean of theirs (the whole batch's,
    for a model without batch statistics), each weight's gradient one sum over every
    slice's reads (a running sum under `Options.early_updates`), and the optimizer updates
    once.

    Embedding gradients arrive as `tf.IndexedSlices`; they are made dense with
    `tf.convert_to_tensor` (an UnsortedSegmentSum) before the optimizer, so every update
    is a dense assignment.
    """
    store.updates = []
    # A GraphVariable is differentiated through its handle (the tape sums its reads).
    with tf.GradientTape() as tape:
        watched = [v.handle if isinstance(v, GraphVariable) else v for v in store.trainable]
        tape.watch(watched)
        if micro_batches == 1:
            loss = loss_fn(x, y)
        else:
            losses = [loss_fn(x_m, y_m) for x_m, y_m in
                      zip(tf.split(x, micro_batches), tf.split(y, micro_batches))]
            loss = tf.add_n(losses) / tf.cast(micro_batches, losses[0].dtype)
    grads = tape.gradient(loss, watched)
    missing = [v.name for v, g in zip(store.trainable, grads) if g is None]
    if missing:
        raise TofuError(f"no gradient reaches variable(s) {missing}.",
                        fix="every trainable variable must feed the loss.")
    grads = [tf.convert_to_tensor(g) for g in grads]
    updates = store.updates + optimizer.apply(grads)
    train_op = tf.group(*updates, name=TRAIN_OP_NAME)
    return tf.identity(loss, name=LOSS_NAME), train_op


def _build_eager(setup: _Setup) -> dict:
    store, loss_fn, optimizer = setup.prepare(graph_only=False)
    signature = [tf.TensorSpec(shape, dtype, name=name)
                 for name, (shape, dtype) in zip("xy", setup.input_specs())]

    @tf.function(input_signature=signature)
    def step(x, y):
        loss, _ = train_step(loss_fn, store, optimizer, x, y, setup.micro_batches)
        return loss

    concrete = step.get_concrete_function()
    return {"graph_def": concrete.graph.as_graph_def(),
            "fetches": [f"{LOSS_NAME}:0", TRAIN_OP_NAME],
            "feeds": _feeds(concrete.inputs[:2]), "step": step,
            "concrete_function": concrete, "variables": store.variables}


def _build_graph_only(setup: _Setup) -> dict:
    graph = tf.Graph()
    with graph.as_default(), paused_gc():   # ~10^6 small objects, no cycles to collect
        x, y = (tf.compat.v1.placeholder(dtype, shape, name=name)
                for name, (shape, dtype) in zip("xy", setup.input_specs()))
        store, loss_fn, optimizer = setup.prepare(graph_only=True)
        loss, train_op = train_step(loss_fn, store, optimizer, x, y, setup.micro_batches)
        init_op = (tf.group(*store.initializers(), name=INIT_OP_NAME).name
                   if setup.initializers else None)
    return {"graph_def": canonical_function_names(graph.as_graph_def()),
            "fetches": [loss.name, train_op.name], "feeds": _feeds((x, y)),
            "init_op": init_op}


def canonical_function_names(graph_def: GraphDef) -> GraphDef:
    """Library functions renamed `block_0`, `block_1`, ... in the order the graph first
    calls them, and the library put in that order (in place; returns it). TensorFlow names
    a traced function after a process-wide counter and orders the library by name; with
    these names two builds of one step give equal GraphDefs, but for the
    `_gradient_op_type` of custom gradients (the norms'): those name the gradient
    function registered in this process, so they keep TensorFlow's numbering."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    if not functions:
        return graph_def
    order: list[str] = []
    for node in graph_def.node:
        name = node.attr["f"].func.name if "f" in node.attr else None
        if name in functions and name not in order:
            order.append(name)
    order += sorted(set(functions) - set(order))      # called from other functions only
    renames = {name: f"block_{i}" for i, name in enumerate(order)}
    kept = [type(functions[name])() for name in order]
    for copy, name in zip(kept, order):
        copy.CopyFrom(functions[name])
    del graph_def.library.function[:]
    graph_def.library.function.extend(kept)
    for function in graph_def.library.function:
        function.signature.name = renames[function.signature.name]
        for key in ("forward_function_name", "backward_function_name"):
            if key in function.attr:
                function.attr[key].s = renames[function.attr[key].s.decode()].encode()
        _rename_calls(function.node_def, renames)
    _rename_calls(graph_def.node, renames)
    return graph_def


def _rename_calls(nodes, renames: dict[str, str]) -> None:
    for node in nodes:
        if "f" in node.attr and node.attr["f"].func.name in renames:
            node.attr["f"].func.name = renames[node.attr["f"].func.name]


def _feeds(placeholders) -> dict:
    return {t.name: (tuple(t.shape.as_list()), t.dtype.name) for t in placeholders}


def _complete_sizes(model: ModelDef, sizes: dict) -> dict:
    unknown = sorted(set(sizes) - set(model.defaults))
    if unknown:
        raise TofuError(f"model '{model.name}' has no size setting(s) {unknown}; valid "
                        f"settings: {', '.join(model.defaults)}.")
    return {**model.defaults, **sizes}


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise TofuError(f"seed must be a non-negative integer, got {seed!r}.")
    return int(seed)


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise TofuError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)
