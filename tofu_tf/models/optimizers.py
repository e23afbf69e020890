"""Optimizer updates: one fused op for SGD, plain variable assignments for the others.

    sgd:       w -= lr * g
    momentum:  m = mu * m + g;  w -= lr * m
    adam:      t += 1;  m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
               w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

SGD is one ResourceApplyGradientDescent per variable (TensorFlow's own kernel for
w -= lr * g, one node where a Mul and an AssignSubVariableOp would be two). The other
updates are `tf.Variable.assign*` calls, so the graph holds AssignVariableOp,
AssignSubVariableOp and AssignAddVariableOp nodes. New slot values are computed as tensors
from one read of the slot and used directly, so the graph needs no read-after-write
ordering beyond its data edges (the Adam step read is made a control input of its
increment). Slots and constants have the store's dtype (`store.dtype`).
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf
from tensorflow.python.ops import gen_training_ops

from tofu_tf.errors import TofuError
from tofu_tf.models.common import VariableStore

OPTIMIZERS = ("sgd", "momentum", "adam")
DEFAULT_LEARNING_RATE = {"sgd": 0.05, "momentum": 0.02, "adam": 1e-3}


@dataclass(frozen=True)
class OptimizerConfig:
    name: str                 # one of OPTIMIZERS
    learning_rate: float
    momentum: float = 0.9     # momentum only
    beta1: float = 0.9        # adam only
    beta2: float = 0.999      # adam only
    epsilon: float = 1e-8     # adam only

    def as_dict(self) -> dict:
        keys = {"sgd": (), "momentum": ("momentum",),
                "adam": ("beta1", "beta2", "epsilon")}[self.name]
        return {"optimizer": self.name, "learning_rate": self.learning_rate,
                **{k: getattr(self, k) for k in keys}}


def optimizer_config(name: str, learning_rate: float | None) -> OptimizerConfig:
    if name not in OPTIMIZERS:
        raise TofuError(f"unknown optimizer '{name}'; valid choices: {', '.join(OPTIMIZERS)}.")
    lr = DEFAULT_LEARNING_RATE[name] if learning_rate is None else float(learning_rate)
    if not lr > 0.0:
        raise TofuError(f"learning_rate must be positive, got {learning_rate!r}.")
    return OptimizerConfig(name, lr)


class Optimizer:
    """Creates its slots at construction; `apply` emits one step's update ops."""

    def __init__(self, config: OptimizerConfig, store: VariableStore):
        self.config = config
        self.dtype = store.dtype
        self.variables = store.trainable
        self._make_slots(store)

    def _make_slots(self, store: VariableStore) -> None:
        pass

    def constant(self, value: float) -> tf.Tensor:
        return tf.constant(value, self.dtype)

    def apply(self, grads: list[tf.Tensor]) -> list[tf.Operation]:
        lr = self.constant(self.config.learning_rate)
        return [gen_training_ops.resource_apply_gradient_descent(var.handle, lr, grad)
                for var, grad in zip(self.variables, grads)]


class Momentum(Optimizer):
    def _make_slots(self, store):
        self.momenta = [store.slot(v, "momentum") for v in self.variables]

    def apply(self, grads):
        lr = self.constant(self.config.learning_rate)
        mu = self.constant(self.config.momentum)
        updates = []
        for var, slot, grad in zip(self.variables, self.momenta, grads):
            new_m = mu * slot + grad
            updates.append(slot.assign(new_m, read_value=False))
            updates.append(var.assign_sub(lr * new_m, read_value=False))
        return updates


class Adam(Optimizer):
    def _make_slots(self, store):
        self.step = store.slot(None, "adam/step", shape=[])
        self.first = [store.slot(v, "adam_m") for v in self.variables]
        self.second = [store.slot(v, "adam_v") for v in self.variables]

    def apply(self, grads):
        c = self.config
        b1, b2 = self.constant(c.beta1), self.constant(c.beta2)
        step = self.step.read_value() + 1.0
        with tf.control_dependencies([step]):
            updates = [self.step.assign_add(self.constant(1.0), read_value=False)]
        correction1 = 1.0 - tf.pow(b1, step)
        correction2 = 1.0 - tf.pow(b2, step)
        lr = self.constant(c.learning_rate)
        for var, m, v, grad in zip(self.variables, self.first, self.second, grads):
            new_m = b1 * m + (1.0 - b1) * grad
            new_v = b2 * v + (1.0 - b2) * tf.square(grad)
            delta = lr * (new_m / correction1) / (tf.sqrt(new_v / correction2) + c.epsilon)
            updates += [m.assign(new_m, read_value=False), v.assign(new_v, read_value=False),
                        var.assign_sub(delta, read_value=False)]
        return updates


def make_optimizer(config: OptimizerConfig, store: VariableStore) -> Optimizer:
    return {"sgd": Optimizer, "momentum": Momentum, "adam": Adam}[config.name](config, store)
