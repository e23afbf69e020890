"""`tofu_tf.optimize`: a training step's GraphDef in, a device-placed GraphDef out.

    optimized = tofu_tf.optimize(graph_def, fetches=["loss:0", "train_op"],
                                 feeds=["x:0", "y:0"], num_devices=8)
    optimized.graph_def      # runs in a v1 Session or through wrap_function
    optimized.plan           # the plan it follows
    optimized.ledger         # every cross-device transfer

The result's variables are shards (one VarHandleOp per device, `optimized.shards`);
`tofu_tf.runtime.session` initialises them from unpartitioned values and reads them back.

`@tofu_tf.function` runs a Python training step partitioned:

    @tofu_tf.function(num_devices=8)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

The first call traces the step for its arguments, plans, rewrites, and creates the shard
variables from the current values of the variables the step uses. Later calls run the
partitioned step (the arguments must keep their shapes and dtypes). The original
variables are not updated while it trains: `write_back()` writes the current unpartitioned
values into them (so `tf.train.Checkpoint` and `model.save` work unchanged) and `reload()`
does the reverse, after the original variables were changed or restored.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tofu_tf.errors import KeptWholeWarning, PlanInfeasibleError, TofuError
from tofu_tf.graph import Graph
from tofu_tf.op_semantics.catalog import catalog, missing_types
from tofu_tf.options import Options
from tofu_tf.rewrite.emit import Shard, cpu_devices, emit, partition_of, uses_v2
from tofu_tf.importer.graphdef_io import (ImportedGraph, import_concrete_function,
                                         import_graph_def)
from tofu_tf.rewrite.ledger import Ledger
from tofu_tf.rewrite.pricing import predict_bytes
from tofu_tf.rewrite.verify import verify
from tofu_tf.runtime.session import Runner, box_slices
from tofu_tf.search.plan import Plan, human_bytes, make_plan, step_graph
from tofu_tf.search.reuse import check_plan
from tofu_tf.search.topology import Topology, check_fits


@dataclass(frozen=True)
class Optimized:
    graph_def: graph_pb2.GraphDef
    plan: Plan
    ledger: Ledger
    shards: Mapping[str, tuple[Shard, ...]]    # original variable -> its shards
    devices: tuple[str, ...]
    fetches: tuple[str, ...]                   # fetch names (the input's names)
    feeds: tuple[str, ...]
    graph: Graph                               # the planner graph the plan is for
    op_nodes: frozenset[str] = frozenset()     # emitted nodes that run planner ops
    # Options.shard_feeds: fed tensor -> (placeholder, device, box) per device; the runners
    # cut each fed value into these shares (`feed_dict`)
    feed_shards: Mapping[str, tuple] = dataclasses.field(default_factory=dict)

    def feed_dict(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """`feeds` (fed tensor name -> whole value) as the emitted graph takes them."""
        if not self.feed_shards:
            return dict(feeds)
        out = {}
        for name, value in feeds.items():
            if name not in self.feed_shards:
                out[name] = value
                continue
            value = np.asarray(value)
            for placeholder, _, box in self.feed_shards[name]:
                out[placeholder] = value[box_slices(box)]
        return out

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def memory(self, explain: int = 5):
        """Per device: the estimated peak of the emitted graph (rewrite/memory.py), with
        the `explain` largest buffers live at it."""
        from tofu_tf.rewrite.memory import estimate
        return estimate(self.graph_def, self.fetches, explain=explain)

    def to_dtensor_layouts(self, mesh) -> dict[str, Any]:
        """Variable name -> the DTensor `Layout` on `mesh` that stores it as the plan does:
        the mesh has one dim per level of the plan's topology, outermost first, of the
        level's ways (e.g. `dtensor.create_mesh([("x", 2), ("y", 4)])` for 2x4). A variable
        the plan stores in no such layout (a dim split at two levels, uneven parts) raises
        a TofuError naming it."""
        self._check_mesh(mesh)
        return {name: _layout(self.plan.sharding_spec(variable.handle, variable.shape), mesh)
                for name, variable in self.graph.variables.items()}

    def _check_mesh(self, mesh) -> None:
        ways = tuple(level.ways for level in self.plan.levels)
        shape = tuple(mesh.dim_size(name) for name in mesh.dim_names)
        if shape != ways:
            raise TofuError(f"a mesh of shape {shape} for a plan over ways {ways}.",
                            fix="make the mesh one dim per level, outermost first, each of "
                                "the level's ways.")

    def to_dtensor_activation_layouts(self, mesh) -> tuple[dict[str, Any], dict[str, str]]:
        """({tensor: Layout}, {tensor: why not}) for the step's other stored tensors
        (activations, gradients): the layout in which the plan stores each, where one
        expresses it (a dim split at two levels, or into uneven parts, has none)."""
        self._check_mesh(mesh)
        handles = {v.handle for v in self.graph.variables.values()}
        layouts, not_expressible = {}, {}
        for name, tensor in self.graph.tensors.items():
            if name in handles or tensor.is_resource or name not in self.plan.groups:
                continue
            try:
                layouts[name] = _layout(self.plan.sharding_spec(name, tensor.shape), mesh)
            except TofuError as err:
                not_expressible[name] = str(err)
        return layouts, not_expressible


def _layout(spec: tuple[int | None, ...], mesh):
    """A DTensor Layout from a sharding spec (per dim: the level splitting it, or None)."""
    from tensorflow.experimental import dtensor
    return dtensor.Layout([dtensor.UNSHARDED if level is None else mesh.dim_names[level]
                           for level in spec], mesh)


def optimize(graph_def: graph_pb2.GraphDef, fetches: Sequence[str], *,
             feeds: Sequence[str] = (), num_devices: int | None = None,
             topology: Topology | str | None = None, options: Options = Options(),
             devices: Sequence[str] | None = None, plan: Plan | None = None,
             expose: Sequence[str] = ()) -> Optimized:
    """Partition a training step. `fetches`: tensor ('loss:0') or op ('train_op') names;
    `feeds`: the placeholders fed each step; `num_devices` or `topology` ('2x4');
    `devices`: device names (default: this host's logical CPUs); `plan`: a stored plan
    (`Plan.from_json`) to use instead of searching, checked against the graph first
    (without `num_devices` and `topology`, the plan's topology)."""
    topology = topology_of(num_devices, topology, plan)
    imported = import_graph_def(graph_def, list(fetches), feeds=list(feeds))
    return optimize_imported(imported, topology, feeds=feeds, options=options,
                             devices=devices, plan=plan, expose=expose)


# Plans a budget may take before the emitted step's estimate fits (`optimize_imported`).
BUDGET_ROUNDS = 3


def optimize_imported(imported: ImportedGraph, topology: Topology, *,
                      feeds: Sequence[str] = (), options: Options = Options(),
                      devices: Sequence[str] | None = None, plan: Plan | None = None,
                      expose: Sequence[str] = ()) -> Optimized:
    """Plan (unless given), emit and verify an imported graph. With a memory budget, the
    emitted step's estimated peak (`Optimized.memory`, which also counts the buffers its
    transfers pass through, unlike the plan's) must fit too: where it does not, the plan
    is searched again under the budget scaled by budget / peak, up to BUDGET_ROUNDS
    times, and then a PlanInfeasibleError names the peak (a given plan's, at once)."""
    check_fits(imported.graph, topology)
    entries = catalog(imported.graph, strict=options.strict)
    _warn_kept_whole(entries)
    budget = planned = options.memory_budget_bytes
    if plan is not None:
        optimized = _emitted(imported, topology, entries, plan, True, feeds, options,
                             devices, expose)
        if budget is not None:
            peak = _peak(optimized)
            if peak > budget:
                raise PlanInfeasibleError(
                    f"the given plan's emitted step peaks at an estimated "
                    f"{human_bytes(peak)} per device, over the budget of "
                    f"{human_bytes(budget)}.",
                    fix="plan again under this budget (optimize without plan=), or raise it.")
        return optimized
    peak = None
    for _ in range(BUDGET_ROUNDS + 1):
        lowest = planned
        try:
            plan = make_plan(imported.graph, topology, options=dataclasses.replace(
                options, memory_budget_bytes=planned))
        except PlanInfeasibleError:
            if peak is None:
                raise
            break
        optimized = _emitted(imported, topology, entries, plan, False, feeds, options,
                             devices, expose)
        if budget is None:
            return optimized
        peak = _peak(optimized)
        if peak <= budget:
            return optimized
        planned = int(planned * budget / peak)
    raise PlanInfeasibleError(
        f"the emitted step's estimated peak per device is {human_bytes(peak)} (its plan's "
        f"own estimate {human_bytes(plan.peak_bytes)}: the rest are buffers its transfers "
        f"pass through), over the budget of {human_bytes(budget)}; plans searched for "
        f"budgets down to {human_bytes(lowest)} peak no lower.",
        fix="raise the budget, or hold less: Options(recompute=...), early updates.")


def _peak(optimized: Optimized) -> int:
    """The emitted step's largest estimated peak over its devices."""
    return max(device.peak_bytes for device in optimized.memory(explain=0).values())


def _emitted(imported: ImportedGraph, topology: Topology, entries, plan: Plan, given: bool,
             feeds, options: Options, devices, expose) -> Optimized:
    if plan.early_updates or plan.recompute:      # the step the plan partitions
        imported = planned_step(imported, plan)
        entries = catalog(imported.graph, strict=options.strict)
    if given:
        check_plan(plan, imported.graph, topology, entries)
    plan, parts = predict(plan, imported, entries, options=options, devices=devices,
                          expose=expose)
    emitted = emit(imported.graph, imported.graph_def, entries, plan, devices=devices,
                   feeds=feeds, expose=expose, collectives_mode=options.collectives,
                   sequential=options.sequential, parts=parts,
                   shard_feeds=options.shard_feeds)
    verify(emitted, imported.graph, plan.predicted_per_level)
    return Optimized(emitted.graph_def, plan, emitted.ledger, emitted.shards,
                     emitted.devices, emitted.fetches, tuple(feeds), imported.graph,
                     emitted.op_nodes, emitted.feed_shards)


def planned_step(imported: ImportedGraph, plan: Plan) -> ImportedGraph:
    """The imported step as `plan` partitions it (search/plan.step_graph: its early
    updates and recomputed copies, written from the imported NodeDefs)."""
    return dataclasses.replace(imported, graph=step_graph(imported.graph, plan))


def predict(plan: Plan, imported: ImportedGraph, entries=None, *,
            options: Options = Options(), devices: Sequence[str] | None = None,
            expose: Sequence[str] = ()):
    """(the plan with the bytes its emitted step moves per level, its partition)."""
    entries = entries or catalog(imported.graph, strict=options.strict)
    parts = partition_of(imported.graph, imported.graph_def, entries, plan,
                         options.compute_once_below)
    names = tuple(devices or cpu_devices(parts.num_devices))
    return plan.with_prediction(predict_bytes(
        imported.graph, entries, plan, parts, expose=expose,
        use_v2=uses_v2(options.collectives, names))), parts


def _warn_kept_whole(entries) -> None:
    missing = missing_types(entries)
    if missing:
        listed = "; ".join(f"{op_type} ({len(names)}: {', '.join(names[:3])}"
                           f"{', ...' if len(names) > 3 else ''})"
                           for op_type, names in sorted(missing.items()))
        warnings.warn(KeptWholeWarning(
            f"ops of {len(missing)} types without a description are kept whole (every "
            f"device runs them on whole inputs): {listed}. Describe them with @semantics "
            "in tofu_tf/op_semantics/ops/ to partition them; Options(strict=True) makes "
            "this an error."), stacklevel=3)


def topology_of(num_devices: int | None, topology: Topology | str | None,
                plan: Plan | None = None) -> Topology:
    """The topology from `num_devices` or `topology`; with neither, `plan`'s."""
    if plan is not None and num_devices is None and topology is None:
        return plan.get_topology()
    if (num_devices is None) == (topology is None):
        raise TofuError("pass exactly one of num_devices and topology.",
                        fix="e.g. num_devices=8, or topology='2x4'.")
    if topology is None:
        return Topology.default(num_devices)
    return Topology.parse(topology) if isinstance(topology, str) else topology


class PartitionedFunction:
    def __init__(self, fn: Callable, *, num_devices: int | None = None,
                 topology: Topology | str | None = None, options: Options = Options(),
                 devices: Sequence[str] | None = None, plan: Plan | None = None):
        self._fn = fn if hasattr(fn, "get_concrete_function") else tf.function(fn)
        self._topology = topology_of(num_devices, topology, plan)
        self._options, self._devices, self._plan = options, devices, plan
        self._runner: Runner | None = None
        self._optimized: Optimized | None = None
        self._variables: dict[str, Any] = {}
        self._signature: list[tuple] = []

    def __call__(self, *args):
        flat = [np.asarray(a) for a in tf.nest.flatten(args)]
        if self._runner is None:
            self._build(args)
        signature = [(a.shape, a.dtype) for a in flat]
        if signature != self._signature:
            raise TofuError(f"the step was partitioned for arguments {self._signature}, "
                            f"called with {signature}.",
                            fix="call it with arguments of the traced shapes and dtypes.")
        values = self._runner.run(dict(zip(self._feeds, flat)))
        outputs = [tf.constant(v) for v in values[:self._num_outputs]]
        return tf.nest.pack_sequence_as(self._structure, outputs)

    def _build(self, args) -> None:
        concrete = self._fn.get_concrete_function(*args)
        imported = import_concrete_function(concrete)
        internal = {t.ref() for _, t in concrete.graph.captures}
        self._feeds = [t.name for t in concrete.inputs if t.ref() not in internal]
        self._optimized = optimize_imported(imported, self._topology, feeds=self._feeds,
                                            options=self._options, devices=self._devices,
                                            plan=self._plan)
        self._variables = dict(imported.captures)
        self._num_outputs = len(concrete.outputs)
        self._structure = concrete.structured_outputs
        self._signature = [(np.asarray(a).shape, np.asarray(a).dtype)
                           for a in tf.nest.flatten(args)]
        self._runner = Runner(self._optimized, self._current_values())

    def _current_values(self) -> dict[str, np.ndarray]:
        return {name: variable.numpy() for name, variable in self._variables.items()
                if name in self._optimized.shards}

    @property
    def plan(self):
        self._require_built()
        return self._optimized.plan

    @property
    def optimized(self) -> Optimized:
        self._require_built()
        return self._optimized

    def dtensor_layouts(self, mesh) -> list[tuple[Any, Any]]:
        """[(variable, its DTensor Layout on `mesh`)] for the variables the step reads or
        updates, stored as the plan stores them (`Optimized.to_dtensor_layouts`)."""
        self._require_built()
        layouts = self._optimized.to_dtensor_layouts(mesh)
        return [(self._variables[name], layout) for name, layout in layouts.items()
                if name in self._variables]

    def train(self, data, steps: int | None = None) -> list:
        """One step per element of `data` (a tf.data.Dataset, or any iterable or iterator
        of argument tuples), at most `steps`; the step's outputs, in order."""
        outputs = []
        for element in data:
            if steps is not None and len(outputs) >= steps:
                break
            outputs.append(self(*(element if isinstance(element, (tuple, list))
                                   else (element,))))
        return outputs

    def write_back(self) -> None:
        """The current unpartitioned values into the original variables."""
        self._require_built()
        for name, value in self._runner.values().items():
            self._variables[name].assign(value)

    def reload(self) -> None:
        """The shards from the original variables' current values."""
        self._require_built()
        self._runner.load(self._current_values())

    def _require_built(self) -> None:
        if self._runner is None:
            raise TofuError("the step has not been called yet.",
                            fix="call it once; the first call plans and partitions it.")


def function(fn: Callable | None = None, *, num_devices: int | None = None,
             topology: Topology | str | None = None, options: Options = Options(),
             devices: Sequence[str] | None = None, plan: Plan | None = None):
    """Decorator: `@tofu_tf.function(num_devices=8)` (see the module docstring); `plan`:
    a stored plan instead of the search, as in `optimize`."""
    def wrap(step: Callable) -> PartitionedFunction:
        return PartitionedFunction(step, num_devices=num_devices, topology=topology,
                                   options=options, devices=devices, plan=plan)
    return wrap(fn) if fn is not None else wrap


class KerasTrainStep:
    """Mixed into a `keras.Model` (before it), `fit` runs every training step partitioned:

        class Net(tofu_tf.KerasTrainStep, keras.Model): ...
        net.compile(optimizer=keras.optimizers.Adam(), loss=..., run_eagerly=True)
        net.fit(dataset, epochs=3)     # each batch: loss, gradients, update, on N devices
        net.write_back()               # the trained values into the model's variables

    The step is the model's `compute_loss` (compile's loss and the model's own losses) and
    the optimizer's update, through `tofu_tf.function` (`tofu_num_devices`,
    `tofu_topology`, `tofu_options` configure it); its variables live as shards on the
    devices until `write_back`. `fit` must call it eagerly (`run_eagerly=True`): the
    partitioned step runs in its own session. It reports the batch's loss; compiled
    metrics other than the loss and sample weights are not supported (a TofuError)."""
    tofu_num_devices: int | None = 8
    tofu_topology: Topology | str | None = None
    tofu_options: Options = Options()

    def train_step(self, data):
        import keras
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None:
            raise TofuError("a partitioned Keras train_step takes no sample weights.",
                            fix="weight the loss inside compute_loss, or drop them.")
        if tf.inside_function():
            raise TofuError("the partitioned train_step was called inside a tf.function.",
                            fix="compile the model with run_eagerly=True.")
        step = self.__dict__.get("_tofu_step")
        if step is None:
            self.optimizer.build(self.trainable_variables)

            def plain(x, y):
                with tf.GradientTape() as tape:
                    loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
                grads = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
                return loss
            topology = None if self.tofu_num_devices else self.tofu_topology
            step = PartitionedFunction(plain, num_devices=self.tofu_num_devices,
                                       topology=topology, options=self.tofu_options)
            self.__dict__["_tofu_step"] = step       # not a tracked Keras attribute
        return {"loss": step(x, y)}

    def write_back(self) -> None:
        """The trained values into the model's (and optimizer's) variables."""
        step = self.__dict__.get("_tofu_step")
        if step is None:
            raise TofuError("the model has not been trained yet.", fix="call fit first.")
        step.write_back()

