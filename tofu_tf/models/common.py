"""Types shared by the reference models: the built `ModelStep` and the `VariableStore`.

A model is written once against a `VariableStore`. In eager mode the store makes real
`tf.Variable`s whose values come from a seeded NumPy generator; in graph-only mode it makes
variables inside the current `tf.Graph` whose initial value is a small op (Fill or a
stateless random op) that is never run, so no weight memory is allocated however large the
shapes are. The store also carries the step's float dtype (`store.dtype`): model and
optimizer code asks it for every float variable, constant and zero state it makes.
"""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from tensorflow.core.framework.graph_pb2 import GraphDef
from tensorflow.python.ops import (gen_array_ops, gen_resource_variable_ops,
                                   gen_stateless_random_ops_v2)

from tofu_tf.errors import TofuError
from tofu_tf.models.blocks import (RNG_ALGORITHM, Block, InitialValue, initial_values,
                                   record_write)

FeedSpec = tuple[tuple[int, ...], str]  # (shape, dtype name)
STEP_SETTINGS = ("batch_size", "optimizer", "learning_rate", "momentum", "beta1", "beta2",
                 "epsilon", "seed", "graph_only", "dtype",
                 "layer_functions", "initializers")  # config keys that are not sizes
DTYPES = ("float32", "float64")  # valid `dtype` settings; the first is the default
DEFAULT_DTYPE = DTYPES[0]
INITIAL_VALUES_SCOPE = "initial_values/"   # graph-only: Consts the initializers share
# A block key's calls share one function from this many calls in all (blocks.py); fewer
# are built op by op. A function costs its trace and its backward's construction once
# (~25 ms besides its ops), and every call its call ops, its variables' reads and outputs
# and the importer's inlining (2-10 ms). Build plus import in fresh processes on the
# project's 2-core machine: ResNet-50's keys (2, 3 and 5 calls) are 0.22 s faster op by op
# (1.21 s against 1.43 s), while ResNet-101's 22-call key is 1.18x faster as a function,
# 6 Transformer layers 1.31x and 24 layers 1.94x.
MIN_SHARED_CALLS = 6


def check_dtype(dtype) -> str:
    """The float dtype of a whole step: "float32" (default) or "float64", as its name.

    Every float in the step is this dtype: variables, optimizer slots and constants,
    float inputs, masks, batch-norm statistics, losses and `sample_batch` arrays (integer
    inputs such as token ids stay int32). float64 steps let equivalence tests compare a
    partitioned step with the unpartitioned one without float32 rounding noise. Accepts the
    name or a `tf.DType` / `np.dtype`; anything else raises `TofuError`.
    """
    name = dtype if isinstance(dtype, str) else (
        dtype.name if isinstance(dtype, (tf.DType, np.dtype)) else None)
    if name not in DTYPES:
        raise TofuError(f"unknown dtype {dtype!r}; valid choices: {', '.join(DTYPES)}.")
    return name


@dataclass(frozen=True, eq=False)
class ModelStep:
    """One built training step: its graph, how to feed and fetch it, and (eager) live state."""

    name: str
    config: dict                        # sizes, optimizer settings, batch_size, seed, ..., dtype
    graph_def: GraphDef                 # no `_output_shapes`: the importer infers shapes
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
        dtype = self.config.get("dtype", DEFAULT_DTYPE)
        if dtype != DEFAULT_DTYPE:
            mode = f"{mode}, {dtype}"
        return (f"{self.name}({sizes}; {self.config['optimizer']}, batch "
                f"{self.config['batch_size']}, {mode}, {len(self.graph_def.node)} nodes)")


class VariableStore:
    """Creates the named variables of one model, in eager or graph-only mode.

    Variables are of `dtype` (float32 unless the step asks for float64; see `check_dtype`),
    which model code reads back as `store.dtype` (a `tf.DType`). `get` returns `offset + init_scale * N(0, 1)` values; with
    `init_scale == 0` the variable is the constant `offset`. Model variables come first in
    `variables`, optimizer slots (made with `slot`) after them. `updates` collects the
    non-optimizer state updates of one step (batch-norm moving statistics).
    """

    def __init__(self, *, graph_only: bool, seed: int, dtype: str = DEFAULT_DTYPE,
                 layer_functions: bool = False, initializers: bool = True):
        """`initializers=False` (graph-only; eager variables always have values):
        variables get no initializer at all."""
        self.graph_only = graph_only
        self.layer_functions = layer_functions
        self.with_initializers = initializers
        self.blocks: collections.Counter = collections.Counter()   # key -> calls planned
        self._made: list[Block] = []
        self._traces: dict = {}
        self._pending: dict[GraphVariable, InitialValue] = {}   # initializers to make
        self.seed = seed
        self.dtype: tf.DType = tf.as_dtype(check_dtype(dtype))
        self._rng = np.random.default_rng(seed)
        self.model_variables: list[tf.Variable] = []
        self.slot_variables: list[tf.Variable] = []
        self.updates: list[tf.Operation] = []
        self._names: set[str] = set()
        self._constants: dict[tuple, tf.Tensor] = {}     # graph-only initializer Consts

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

    def updates_of(self, var) -> list[tf.Operation]:
        """The step's updates so far that write `var`: a later read of it must wait for
        them (in a graph, a read and an assignment of one variable have no order of their
        own; a step of several micro-batches updates a batch norm's statistics once per
        micro-batch)."""
        handle = getattr(var, "handle", None)
        if handle is None or not tf.is_symbolic_tensor(handle):
            return []      # an eager variable: tf.function orders its reads and writes
        return [op for op in self.updates
                if op.graph is handle.graph and op.inputs and op.inputs[0].name == handle.name]

    def add_update(self, op: tf.Operation | None) -> None:
        """A state update of the step; None (an assignment a block's trace records, made
        after the block's call) adds nothing."""
        if op is not None:
            self.updates.append(op)

    def block(self, name: str, key, make: Callable[[], Callable], uses: int = 1) -> Block:
        """The block `make()` builds (its variables and apply), called as one function per
        distinct `key` in a graph-only build with layer functions (blocks.py), where the
        key's blocks are called MIN_SHARED_CALLS times or more in all (`uses`: this block's
        calls, e.g. the time steps of a recurrent cell); `key` None (or an eager build)
        calls apply directly."""
        first = len(self.model_variables)
        apply = make()
        self.blocks[key] += uses
        block = Block(name, key, apply, self.model_variables[first:], self,
                      self._traces if self.graph_only and self.layer_functions else None)
        self._made.append(block)
        return block

    def shares(self, key) -> bool:
        """Whether the blocks of `key` are called MIN_SHARED_CALLS times or more in all
        (then one function serves them; a key called fewer times is built op by op)."""
        return key is not None and self.blocks[key] >= MIN_SHARED_CALLS

    def _make(self, name, shape, init_scale, offset, trainable) -> tf.Variable:
        if name in self._names:
            raise TofuError(f"variable '{name}' is created twice in one model.",
                            fix="give every variable of a model a distinct name.")
        self._names.add(name)
        shape = [int(d) for d in shape]
        if self.graph_only and not self.with_initializers:
            return GraphVariable(None, name, trainable, shape=shape, dtype=self.dtype)
        if self.graph_only and self.layer_functions:     # initialized in `initializers`
            var = GraphVariable(None, name, trainable, shape=shape, dtype=self.dtype)
            self._pending[var] = InitialValue(tuple(shape), float(init_scale), float(offset),
                                              len(self._names))
            return var
        initial = self._initial_value(shape, float(init_scale), float(offset))
        if self.graph_only:
            return GraphVariable(initial, name, trainable)
        return tf.Variable(initial, name=name, trainable=trainable, dtype=self.dtype)

    def initializers(self) -> list[tf.Operation]:
        """Every variable's initializer. A layer-function build makes them now: the
        variables of each block whose key other blocks share get their initial values
        from one function call (traced once per key), the others op by op."""
        for block in self._made:
            if self.layer_functions and self.shares(block.key):
                initial_values(self, block.key, block.variables,
                               [self._pending.pop(v) for v in block.variables])
        for var, spec in self._pending.items():
            var.initialize(self._initial_value(list(spec.shape), spec.scale, spec.offset,
                                               spec.seed_index))
        self._pending.clear()
        return [v.initializer for v in self.variables]

    def _initial_value(self, shape, init_scale, offset, seed_index: int | None = None):
        if self.graph_only:
            return self._graph_initial_value(shape, init_scale, offset, seed_index)
        np_dtype = self.dtype.as_numpy_dtype
        if init_scale == 0.0:
            return np.full(shape, offset, np_dtype)
        values = self._rng.standard_normal(shape, dtype=np_dtype) * np_dtype(init_scale)
        return values + np_dtype(offset)

    def _graph_initial_value(self, shape, init_scale, offset,
                             seed_index: int | None = None) -> tf.Tensor:
        """Graph-only: Fill(shape, offset), or the values of `tf.random.stateless_normal(
        shape, [seed, index], offset, init_scale)`: StatelessRandomNormalV2(shape, key,
        counter, AUTO_SELECT) * init_scale + offset, key and counter from the seed. The
        shapes, scalars and algorithm are Consts shared by every variable (the
        initializers are never run to plan, so their few thousand nodes are built once)."""
        dims = self._shared_constant(shape, tf.int32)
        if init_scale == 0.0:
            _take_name("Const")
            return gen_array_ops.fill(dims, self._shared_constant(offset, self.dtype),
                                      name="Fill")
        index = len(self._names) if seed_index is None else seed_index
        seed = tf.constant([self.seed, index], tf.int32)
        with tf.name_scope("stateless_random_normal"):
            key, counter = gen_stateless_random_ops_v2.stateless_random_get_key_counter(seed)
            normal = gen_stateless_random_ops_v2.stateless_random_normal_v2(
                dims, key, counter, self._shared_constant(RNG_ALGORITHM, tf.int32),
                dtype=self.dtype)
            return normal * self._shared_constant(init_scale, self.dtype) + \
                self._shared_constant(offset, self.dtype)

    def _shared_constant(self, value, dtype: tf.DType) -> tf.Tensor:
        """One Const per (value, dtype) under `INITIAL_VALUES_SCOPE`, outside any control
        dependencies, so initializers share them."""
        key = (tuple(value) if isinstance(value, list) else value, dtype)
        constant = self._constants.get(key)
        if constant is None:
            with tf.init_scope(), tf.name_scope(INITIAL_VALUES_SCOPE):
                constant = self._constants[key] = tf.constant(value, dtype)
        return constant


class GraphVariable:
    """A graph-only variable: the VarHandleOp and its Assign initializer that tf.Variable
    makes, under the same names, and reads and assignments as tf.Variable emits them,
    without its per-variable bookkeeping (an IsInitialized op, a snapshot read, a walk
    of the initial value's graph), which a planner graph never runs. Reads of a trainable
    variable are differentiated through its handle (`watch` it on the tape)."""

    def __init__(self, initial: tf.Tensor | None, name: str, trainable: bool, *,
                 shape=None, dtype: tf.DType | None = None):
        """`initial` None (with `shape` and `dtype`): the initializer is made later, by
        `initialize`."""
        self._bound: tf.Tensor | None = None
        self.trainable = trainable
        self.dtype = initial.dtype if initial is not None else dtype
        self.shape = initial.shape if initial is not None else tf.TensorShape(shape)
        self.initializer: tf.Operation | None = None
        with tf.name_scope(name) as scope:
            self._name = scope[:-1]
            self.handle = gen_resource_variable_ops.var_handle_op(
                dtype=self.dtype, shape=self.shape, shared_name=self._name, debug_name=scope,
                name=scope)
            if initial is not None:
                self.initialize(initial)

    def initialize(self, initial: tf.Tensor) -> None:
        """Makes the initializer: `<name>/Assign` of `initial`."""
        with tf.name_scope(self._name + "/"):
            self.initializer = gen_resource_variable_ops.assign_variable_op(
                self.handle, initial, name="Assign")

    @property
    def name(self) -> str:
        return self._name + ":0"

    def bind(self, value: tf.Tensor | None) -> None:
        """Inside a block's trace: reads give `value`, assignments are recorded (None:
        unbind)."""
        self._bound = value

    def value(self) -> tf.Tensor:
        if self._bound is not None:
            return self._bound
        return gen_resource_variable_ops.read_variable_op(self.handle, self.dtype)

    def read_value(self) -> tf.Tensor:
        with tf.name_scope("Read"):
            value = self.value()
        return tf.identity(value)

    def sparse_read(self, indices, name=None) -> tf.Tensor:
        """The rows `indices` (a ResourceGather, as tf.gather on a variable makes)."""
        self._not_bound("gathered from")
        with tf.name_scope("Gather" if name is None else name) as scope:
            return gen_resource_variable_ops.resource_gather(self.handle, indices,
                                                             dtype=self.dtype, name=scope)

    def assign(self, value, read_value: bool = False):
        if self._bound is not None:
            return record_write(self, "assign", tf.convert_to_tensor(value, dtype=self.dtype))
        return self._write(functools.partial(gen_resource_variable_ops.assign_variable_op,
                                             validate_shape=True), value, read_value)

    def assign_add(self, value, read_value: bool = False):
        self._not_bound("incremented")
        return self._write(gen_resource_variable_ops.assign_add_variable_op, value, read_value)

    def assign_sub(self, value, read_value: bool = False):
        if self._bound is not None:
            return record_write(self, "assign_sub",
                                tf.convert_to_tensor(value, dtype=self.dtype))
        return self._write(gen_resource_variable_ops.assign_sub_variable_op, value, read_value)

    def _not_bound(self, what: str) -> None:
        if self._bound is not None:
            raise TofuError(f"variable '{self.name}' is {what} inside a block's function.",
                            fix="read it and assign() the new value (the block returns it), "
                                "or build the block without a key.")

    def _write(self, op, value, read_value: bool):
        if read_value:
            raise TofuError("a graph-only variable's assignment does not read it back.",
                            fix="pass read_value=False and read the variable afterwards.")
        return op(self.handle, tf.convert_to_tensor(value, dtype=self.dtype))


tf.register_tensor_conversion_function(
    GraphVariable, lambda var, dtype=None, name=None, as_ref=False: var.value())


def _read_then(operator: str):
    def apply(self, *args):
        return getattr(tf.Tensor, operator)(self.value(), *args)
    return apply


for _operator in tf.Tensor.OVERLOADABLE_OPERATORS - {"__eq__", "__ne__"}:
    setattr(GraphVariable, _operator, _read_then(_operator))


def _take_name(name: str) -> None:
    """Use up `name` in the current scope as an op would. The initializers once made a
    value Const per variable here; taking its name keeps every later op's name (plans
    name ops) as it was."""
    tf.compat.v1.get_default_graph().unique_name(name)


def variable_name(var: tf.Variable) -> str:
    """The variable's name without the ':0' suffix."""
    return var.name.split(":")[0]
