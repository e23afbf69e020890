"""Repeated blocks traced once: graph-only builds call one function per distinct block.

Building a training step op by op through TensorFlow's Python API costs ~0.3 ms an op,
forward and gradient; 24 equal Transformer layers cost 24 times one. A model marks each
block it repeats (`VariableStore.block(name, key, make)`): `make()` creates the block's
variables and returns its `apply`. In a graph-only build, calling the block calls a
`tf.function` traced once per key and input signature, shared by every block with that
key:

    arguments  the block's inputs, then the values of its variables (read outside)
    results    the block's outputs, then the values the block writes to its variables
               (batch-norm statistics; the writes, assign or assign_sub, are made outside)

so the function is pure, and its gradient (the tape's backward function) is built once
too. A key called fewer than `common.MIN_SHARED_CALLS` times in all is built op by op: its
function, inference and backward, and each call's overhead would cost more than the
blocks. Blocks with one key must compute the same thing from their variables: the key holds
every setting `make` reads besides the variables (sizes, strides; a block drawing random
numbers from per-block seeds cannot share). The importer inlines the calls
(importer/_inline.py): the planner sees the same ops on the same values as a flat build.
Eager builds, and graph-only builds with `layer_functions=False`, run `apply` directly.

The initial values of such blocks' variables come from one function per key too (the
stateless seeds as its argument), so each variable costs its handle and its Assign.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import tensorflow as tf
from tensorflow.python.ops import gen_stateless_random_ops_v2

from tofu_tf.errors import TofuError

_RECORDING: list[list] = []     # the updates of the block being traced (innermost last)


class Block:
    """One block of a model: its variables and apply, callable like apply."""

    def __init__(self, name: str, key: Hashable | None, apply: Callable, variables: Sequence,
                 store, traces: dict | None):
        self.name = name
        self.key = key
        self.apply = apply
        self.variables = tuple(variables)
        self._store = store
        self._traces = traces            # None: call apply directly

    def __call__(self, *inputs: tf.Tensor):
        if self._traces is None or not self._store.shares(self.key):
            return self.apply(*inputs)      # tracing a block costs more than one call
        trace = self._trace(inputs)
        with tf.name_scope(self.name):
            values = []
            for v in self.variables:              # after this step's earlier updates of v
                with tf.control_dependencies([] if tracing() else self._store.updates_of(v)):
                    values.append(v.value())
            results = trace.function(*inputs, *values)
        if not isinstance(results, (list, tuple)):
            results = [results]
        outputs, updates = results[:trace.num_outputs], results[trace.num_outputs:]
        for (index, method), value in zip(trace.writes, updates):
            self._store.add_update(getattr(self.variables[index], method)(value))
        return outputs[0] if trace.single else tuple(outputs)

    def _trace(self, inputs) -> "_Trace":
        signature = (self.key, tuple((tuple(t.shape.as_list()), t.dtype) for t in inputs),
                     tuple((tuple(v.shape.as_list()), v.dtype) for v in self.variables))
        trace = self._traces.get(signature)
        if trace is None:
            trace = self._traces[signature] = _Trace(self, inputs)
        return trace


class _Trace:
    """The function of one block key and signature, traced with the first such block."""

    def __init__(self, block: Block, inputs: Sequence[tf.Tensor]):
        self.num_inputs = len(inputs)
        self.writes: tuple[tuple[int, str], ...] = ()    # (variable index, write method)
        self.single = True
        self.num_outputs = 1
        specs = [tf.TensorSpec(t.shape, t.dtype, name=f"input_{i}")
                 for i, t in enumerate(inputs)] + \
            [tf.TensorSpec(v.shape, v.dtype, name=f"variable_{i}")
             for i, v in enumerate(block.variables)]
        self.function = tf.function(self._body(block), autograph=False).get_concrete_function(
            *specs)

    def _body(self, block: Block):
        def body(*args):
            inputs, values = args[:self.num_inputs], args[self.num_inputs:]
            with _bound(block.variables, values) as updates:
                out = block.apply(*inputs)
            self.single = not isinstance(out, (list, tuple))
            outputs = [out] if self.single else list(out)
            self.num_outputs = len(outputs)
            self.writes = tuple((block.variables.index(var), method)
                                for var, method, _ in updates)
            return outputs + [value for _, _, value in updates]
        return body


@contextmanager
def _bound(variables, values):
    """Reads of `variables` return `values`; their writes are recorded (yielded)."""
    updates: list = []
    for var, value in zip(variables, values):
        var.bind(value)
    _RECORDING.append(updates)
    try:
        yield updates
    finally:
        _RECORDING.pop()
        for var in variables:
            var.bind(None)


def tracing() -> bool:
    """A block's function is being traced: its gradient will be derived symbolically from
    the function graph (registered gradients), not recorded on a tape."""
    return bool(_RECORDING)


def record_write(var, method: str, value) -> None:
    """A bound variable's write (`method` "assign" or "assign_sub" of `value`) inside a
    block's trace: made outside, after the call."""
    if not _RECORDING:
        raise TofuError(f"variable '{var.name}' is bound outside a block's trace.")
    _RECORDING[-1].append((var, method, value))


@dataclass(frozen=True)
class InitialValue:
    """A variable's initial value: `offset + scale * stateless_normal(shape, [seed, index])`,
    or the constant `offset` where `scale` is 0 (VariableStore._graph_initial_value)."""
    shape: tuple[int, ...]
    scale: float
    offset: float
    seed_index: int


RNG_ALGORITHM = 3   # tf.random.Algorithm.AUTO_SELECT, what tf.random.stateless_normal uses


def initial_values(store, key: Hashable, variables: Sequence, specs: Sequence[InitialValue]
                   ) -> None:
    """Initializes a block's `variables` from one call of the function that computes
    initial values of these shapes (traced once per key), the seed indices its argument;
    the values are those of the op-by-op initializers."""
    signature = ("initial", key, store.dtype, tuple((s.shape, s.scale, s.offset) for s in specs))
    function = store._traces.get(signature)
    if function is None:
        function = store._traces[signature] = _initializer(specs, store.dtype, store.seed)
    indices = [s.seed_index for s in specs if s.scale] or [0]
    values = function(tf.constant(indices, tf.int32))
    values = values if isinstance(values, (list, tuple)) else [values]
    for var, value in zip(variables, values):
        var.initialize(value)


def _initializer(specs: Sequence[InitialValue], dtype: tf.DType, seed: int):
    def body(indices):
        values, j = [], 0
        for spec in specs:
            if not spec.scale:
                values.append(tf.fill(spec.shape, tf.constant(spec.offset, dtype)))
                continue
            key, counter = gen_stateless_random_ops_v2.stateless_random_get_key_counter(
                tf.stack([tf.constant(seed, tf.int32), indices[j]]))
            j += 1
            normal = gen_stateless_random_ops_v2.stateless_random_normal_v2(
                tf.constant(spec.shape, tf.int32), key, counter,
                tf.constant(RNG_ALGORITHM, tf.int32), dtype=dtype)
            values.append(normal * tf.constant(spec.scale, dtype) +
                          tf.constant(spec.offset, dtype))
        return values
    count = max(1, sum(1 for s in specs if s.scale))
    return tf.function(body, autograph=False).get_concrete_function(
        tf.TensorSpec([count], tf.int32, name="seed_indices"))
