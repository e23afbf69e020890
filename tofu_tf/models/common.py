"""Types shared by the reference models: the built `ModelStep` and the `VariableStore`.

A model is written once against a `VariableStore`. In eager mode the store makes real
`tf.Variable`s whose values come from a seeded NumPy generator; in graph-only mode it makes
variables inside the current `tf.Graph` whose initial value is a small op (Fill or a
stateless random op) that is never run, so no weight memory is allocated however large the
shapes are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from tensorflow.core.framework.graph_pb2 import GraphDef

from tofu_tf.errors import TofuError

FeedSpec = tuple[tuple[int, ...], str]  # (shape, dtype name)
STEP_SETTINGS = ("batch_size", "optimizer", "learning_rate", "momentum", "beta1", "beta2",
                 "epsilon", "seed", "graph_only")  # the config keys that are not model sizes


@dataclass(frozen=True, eq=False)
class ModelStep:
    """One built training step: its graph, how to feed and fetch it, and (eager) live state."""

    name: str
    config: dict                        # every size setting, optimizer, batch_size, lr, seed
    graph_def: GraphDef                 # shapes attached (`_output_shapes`)
    fetches: list[str]                  # loss tensor name first, then the grouped update op
    feeds: dict[str, FeedSpec]          # input placeholder tensor name -> (shape, dtype)
    step: Any | None = None             # eager only: tf.function, step(x, y) -> loss
    concrete_function: Any | None = None  # eager only: the step traced for the batch shapes
    variables: list[tf.Variable] | None = None  # eager only: model variables, then slots
    init_op: str | None = None          # graph-only: NoOp running every variable initializer
    _sample: Callable[[np.random.Generator], tuple[np.ndarray, ...]] | None = field(
        default=None, repr=False)

    def sample_batch(self, seed: int = 0) -> tuple[np.ndarray, ...]:
        """A synthetic (x, y) batch with the shapes and dtypes of `feeds`."""
        return self._sample(np.random.default_rng(seed))

    @property
    def graph_only(self) -> bool:
        return self.step is None

    def __str__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.config.items()
                          if k not in STEP_SETTINGS)
        mode = "graph-only" if self.graph_only else "eager"
        return (f"{self.name}({sizes}; {self.config['optimizer']}, batch "
                f"{self.config['batch_size']}, {mode}, {len(self.graph_def.node)} nodes)")


class VariableStore:
    """Creates the named variables of one model, in eager or graph-only mode.

    Variables are float32. `get` returns `offset + init_scale * N(0, 1)` values; with
    `init_scale == 0` the variable is the constant `offset`. Model variables come first in
    `variables`, optimizer slots (made with `slot`) after them. `updates` collects the
    non-optimizer state updates of one step (batch-norm moving statistics).
    """

    def __init__(self, *, graph_only: bool, seed: int):
        self.graph_only = graph_only
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self.model_variables: list[tf.Variable] = []
        self.slot_variables: list[tf.Variable] = []
        self.updates: list[tf.Operation] = []
        self._names: set[str] = set()

    @property
    def variables(self) -> list[tf.Variable]:
        return self.model_variables + self.slot_variables

    @property
    def trainable(self) -> list[tf.Variable]:
        return [v for v in self.model_variables if v.trainable]

    def get(self, name: str, shape, init_scale: float = 0.0, *, offset: float = 0.0,
            trainable: bool = True) -> tf.Variable:
        """A new model variable `name` of `shape`."""
        var = self._make(name, shape, init_scale, offset, trainable)
        self.model_variables.append(var)
        return var

    def slot(self, var: tf.Variable, slot_name: str, shape=None) -> tf.Variable:
        """A zero-initialised optimizer slot for `var` (or a free slot when `var` is None)."""
        base = slot_name if var is None else f"{variable_name(var)}/{slot_name}"
        slot_shape = var.shape.as_list() if shape is None else shape
        slot = self._make(base, slot_shape, 0.0, 0.0, trainable=False)
        self.slot_variables.append(slot)
        return slot

    def add_update(self, op: tf.Operation) -> None:
        self.updates.append(op)

    def _make(self, name, shape, init_scale, offset, trainable) -> tf.Variable:
        if name in self._names:
            raise TofuError(f"variable '{name}' is created twice in one model.",
                            fix="give every variable of a model a distinct name.")
        self._names.add(name)
        shape = [int(d) for d in shape]
        initial = self._initial_value(shape, float(init_scale), float(offset))
        return tf.Variable(initial, name=name, trainable=trainable, dtype=tf.float32)

    def _initial_value(self, shape, init_scale, offset):
        if self.graph_only:
            if init_scale == 0.0:
                return tf.fill(shape, tf.constant(offset, tf.float32))
            seed = tf.constant([self.seed, len(self._names)], tf.int32)
            return tf.random.stateless_normal(shape, seed, mean=offset, stddev=init_scale)
        if init_scale == 0.0:
            return np.full(shape, offset, np.float32)
        values = self._rng.standard_normal(shape, dtype=np.float32) * np.float32(init_scale)
        return values + np.float32(offset)


def variable_name(var: tf.Variable) -> str:
    """The variable's name without the ':0' suffix."""
    return var.name.split(":")[0]
