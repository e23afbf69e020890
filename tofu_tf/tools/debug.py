"""Where a partitioned step first differs from the unpartitioned one, and why.

    case = model_case("mobilenetv2", dtype="float32")          # or case_of(concrete, batches)
    report = compare_step(case.imported, 8, case.batches, case.values)
    print(report)     # the op to blame, its plan choice per level, each device's piece

    python -m tofu_tf.tools.debug --model=mobilenetv2 --num_devices=8 [--dtype=float32]

Both steps start from the same variable values and batch. The partitioned graph is
emitted with every compared tensor exposed (assembled whole on device 0), the
unpartitioned normalised GraphDef runs in a one-device Session, and the tensors are
compared in the planner graph's topological order. A tensor differs when its largest
absolute error exceeds `rtol` times its scale (its largest magnitude unpartitioned;
`atol` when that is 0). Variables are compared after the step too. With several batches,
each step starts both sides from the unpartitioned side's values, so each is judged alone.

Which op is to blame (`_Judge`): a differing op is replayed whole on one device from the
partitioned side's own inputs, and in float64. It is to blame when its partitioned output
differs from that replay by more than ROUNDING_FACTOR times the whole op's own rounding:
so a float32 sum reordered over parts, or rounding carried in from upstream and
magnified by an ill-conditioned op (a ReLU6 mask at its edge, a batch-norm sum that
cancels), is not blamed, and a wrong description is. A stateful op (no replay) is to
blame when its inputs agree; a read of a variable written earlier in the step blames the
write. No op to blame means the differences are rounding only: in float64 they vanish.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, types_pb2

from tofu_tf.api import optimize_imported
from tofu_tf.graph import Graph
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.options import Options
from tofu_tf.rewrite.emit import partition_of
from tofu_tf.importer.graphdef_io import ImportedGraph
from tofu_tf.runtime.session import ImportedStep, Runner, session_config
from tofu_tf.search.plan import Plan
from tofu_tf.search.topology import Topology

_NOT_COMPARED = frozenset({"resource", "variant", "string"})
EXPOSED = "tofu_expose/"


@dataclass(frozen=True)
class TensorDiff:
    """One tensor (or a variable after the step) compared."""
    tensor: str
    op: str
    op_type: str
    max_error: float          # largest absolute difference
    scale: float              # largest magnitude of the unpartitioned value
    differs: bool

    @property
    def relative(self) -> float:
        return self.max_error / self.scale if self.scale else self.max_error

    def __str__(self) -> str:
        return (f"{self.tensor} ({self.op_type}): max |diff| {self.max_error:.3g} of scale "
                f"{self.scale:.3g} ({self.relative:.2e})")


@dataclass(frozen=True)
class Culprit:
    """The op to blame: its output, replay, plan choices and pieces."""
    diff: TensorDiff
    step: int
    inputs: tuple[TensorDiff, ...]            # its compared inputs (all agree)
    choices: tuple[str, ...]                  # its plan choice at each level
    input_states: tuple[tuple[str, ...], ...]  # per input, its stored state at each level
    pieces: tuple[str, ...]                   # per device: what its local op reads, holds
    replayed: TensorDiff | None = None        # its output against the whole op on its
                                              # partitioned inputs (None: not replayable)

    def __str__(self) -> str:
        lines = [f"step {self.step}: the op to blame is {self.diff.op} ({self.diff.op_type})",
                 f"  output {self.diff}",
                 f"  against the whole op on the same inputs: "
                 f"{self.replayed if self.replayed else 'not replayable (stateful)'}",
                 f"  choice per level: {', '.join(self.choices) or 'none'}"]
        for diff, states in zip(self.inputs, self.input_states):
            lines.append(f"  input  {diff}; stored {', '.join(states)}")
        lines += [f"  {piece}" for piece in self.pieces]
        return "\n".join(lines)


@dataclass(frozen=True)
class StepReport:
    step: int
    tensors: tuple[TensorDiff, ...]            # in topological order
    variables: tuple[TensorDiff, ...]          # after the step

    @property
    def differing(self) -> tuple[TensorDiff, ...]:
        return tuple(d for d in self.tensors + self.variables if d.differs)


@dataclass(frozen=True)
class DebugReport:
    plan: Plan
    steps: tuple[StepReport, ...]
    culprit: Culprit | None

    @property
    def equal(self) -> bool:
        return not any(step.differing for step in self.steps)

    def __str__(self) -> str:
        compared = sum(len(s.tensors) + len(s.variables) for s in self.steps)
        if self.equal:
            return (f"equal: {compared} tensors and variables over {len(self.steps)} "
                    f"step(s) agree within tolerance.")
        lines = [str(self.culprit)] if self.culprit else [
            "rounding only: every differing op's partitioned output equals the whole op run "
            "on its partitioned inputs; the differences are carried from reordered sums "
            "and magnified downstream (compare in float64 to see them vanish)."]
        for step in self.steps:
            worst = sorted(step.differing, key=lambda d: -d.relative)[:8]
            if worst:
                lines.append(f"step {step.step}: {len(step.differing)} differ; worst:")
                lines += [f"  {d}" for d in worst]
        return "\n".join(lines)


def compared_tensors(graph: Graph) -> list[str]:
    """Every op output with data, in topological order."""
    return [t for op in graph for t in op.outputs
            if graph.tensors[t].dtype not in _NOT_COMPARED and not graph.tensors[t].is_resource]


def unpartitioned_values(imported: ImportedGraph, feeds: Mapping[str, np.ndarray],
                         values: Mapping[str, np.ndarray], tensors: Sequence[str]
                         ) -> dict[str, np.ndarray]:
    """`tensors`' values in one unpartitioned step from `values` and `feeds`."""
    with ImportedStep(imported) as single:
        single.load(values)
        got = single.run(feeds, list(tensors) + list(imported.graph.fetches))
    return dict(zip(tensors, got))


def compare_step(imported: ImportedGraph, topology: Topology | str | int,
                 feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
                 values: Mapping[str, np.ndarray], *, options: Options = Options(),
                 plan: Plan | None = None, rtol: float = 1e-4, atol: float = 1e-6,
                 tensors: Sequence[str] | None = None) -> DebugReport:
    """Run one step per feed dict on both sides (see the module docstring). `values`:
    variable (handle op) name -> initial value; `tensors`: those to compare (default:
    every data tensor)."""
    if isinstance(topology, int):
        topology = Topology.default(topology)
    elif isinstance(topology, str):
        topology = Topology.parse(topology)
    batches = [feeds] if isinstance(feeds, Mapping) else list(feeds)
    graph = imported.graph
    tensors = list(tensors if tensors is not None else compared_tensors(graph))
    optimized = optimize_imported(imported, topology, feeds=list(batches[0]), options=options,
                                  plan=plan, expose=tensors)
    exposed = [EXPOSED + t.replace(":", "_") + ":0" for t in tensors]
    reports, culprit = [], None
    with ImportedStep(imported) as single, \
            Runner(optimized, values, config=_exposing_config(optimized)) as runner:
        single.load(values)
        for step, batch in enumerate(batches):
            runner.load(single.values())
            want = single.run(batch, tensors + list(graph.fetches))[:len(tensors)]
            got = runner.run(batch, exposed + list(optimized.fetches))[:len(tensors)]
            report = StepReport(step, tuple(_diff(graph, t, g, w, rtol, atol)
                                            for t, g, w in zip(tensors, got, want)),
                                _variable_diffs(graph, runner.values(), single.values(),
                                                rtol, atol))
            reports.append(report)
            if report.differing:
                culprit = _Judge(imported, optimized.plan, report, dict(zip(tensors, got)),
                                 rtol, atol).culprit()
                break
    return DebugReport(optimized.plan, tuple(reports), culprit)


# The stack of each inter-op thread of the session that exposes every tensor.
# TensorFlow's executor runs a ready node inline when its thread's queue (1024 nodes) is
# full, and a node that completes a transfer readies the next: with thousands of exposed
# tensors crossing devices at once (InceptionResNetV2 at 8 devices) that recursion
# outgrows the default 8 MiB stack. The session gets its own threads, made with this
# stack (address space, committed only as used).
EXPOSING_STACK_BYTES = 1 << 30


def _exposing_config(optimized):
    config = session_config(optimized.num_devices)
    if _default_thread_stack(EXPOSING_STACK_BYTES):
        config.use_per_session_threads = True
    return config


@functools.lru_cache(maxsize=None)
def _default_thread_stack(size: int) -> bool:
    """Make `size` the stack of threads created from now on (glibc's
    pthread_setattr_default_np); False where that is not available."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        attr = ctypes.create_string_buffer(128)          # >= sizeof(pthread_attr_t)
        if libc.pthread_attr_init(attr) != 0:
            return False
        ok = (libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(size)) == 0 and
              libc.pthread_setattr_default_np(attr) == 0)
        libc.pthread_attr_destroy(attr)
        return ok
    except (OSError, AttributeError):
        return False


def _is_float(dtype) -> bool:
    """NumPy's floats and ml_dtypes' (bfloat16: NumPy does not rank it among its floats)."""
    return np.issubdtype(dtype, np.floating) or (dtype.kind == "V" and
                                                 tf.as_dtype(dtype).is_floating)


def _diff(graph: Graph, t: str, got, want, rtol: float, atol: float) -> TensorDiff:
    op = graph.producer(t)
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype == bool or not (np.issubdtype(want.dtype, np.number) or
                                  _is_float(want.dtype)):
        error = float(np.count_nonzero(got != want))
        return TensorDiff(t, op.name, op.type, error, 1.0, error > 0)
    want64, got64 = want.astype(np.float64), got.astype(np.float64)
    error = float(np.max(np.abs(got64 - want64), initial=0.0))
    if np.isnan(got64).any() != np.isnan(want64).any():
        error = float("inf")
    scale = float(np.max(np.abs(want64), initial=0.0))
    return TensorDiff(t, op.name, op.type, error, scale, error > max(rtol * scale, atol))


def _variable_diffs(graph: Graph, got, want, rtol, atol) -> tuple[TensorDiff, ...]:
    out = []
    for name in sorted(want):
        diff = _diff(graph, graph.variables[name].handle, got[name], want[name], rtol, atol)
        out.append(dataclasses.replace(diff, tensor=f"{name} (after the step)"))
    return tuple(out)


class _Judge:
    """Names the culprit of one step's differences. The differing ops are walked in
    topological order. A stateless op is to blame when its partitioned output differs from
    the whole op run on the partitioned side's own inputs (its replay): rounding carried in
    from upstream and magnified by an ill-conditioned op (a ReLU6 mask at its edge, a sum
    that cancels) is then not blamed on it. A stateful op, which cannot be replayed, is to
    blame when its inputs agree; so is a variable update whose inputs agree while the
    variable differs after the step."""

    def __init__(self, imported: ImportedGraph, plan: Plan, report: StepReport,
                 got: Mapping[str, np.ndarray], rtol: float, atol: float):
        self.imported, self.graph, self.plan, self.report = imported, imported.graph, plan, report
        self.got, self.rtol, self.atol = got, rtol, atol
        self.by_tensor = {d.tensor: d for d in report.tensors}

    def culprit(self) -> Culprit | None:
        graph, seen, differing = self.graph, set(), []
        for diff in self.report.tensors:
            if diff.differs and diff.op not in seen:
                seen.add(diff.op)
                differing.append(graph.op(diff.op))
        replayable = [op for op in differing if self._replayable(op)]
        replays = _replay(self.imported, replayable, self.got)
        exact = _replay(self.imported, replayable, self.got, as_float64=True)
        for op in differing:
            if op.name in replays:
                for o, t in enumerate(op.outputs):
                    if t not in self.by_tensor:
                        continue
                    whole = replays[op.name][o]
                    replayed = _diff(graph, t, self.got[t], whole, self.rtol, self.atol)
                    if replayed.differs and not self._own_rounding(
                            self.got[t], whole, exact.get(op.name, [None] * (o + 1))[o]):
                        return self._blame(op, self.by_tensor[t], replayed)
            elif self._inputs_agree(op):
                diff = next(self.by_tensor[t] for t in op.outputs
                            if self.by_tensor.get(t, _AGREES).differs)
                writer = self._earlier_write(op)
                if writer is None:
                    return self._blame(op, diff, None)
                if self._inputs_agree(writer):
                    return self._blame(writer, diff, None)
        for diff in self.report.variables:
            if not diff.differs:
                continue
            for name in graph.variables[diff.op].update_ops:
                update = graph.op(name)
                if self._inputs_agree(update):
                    return self._blame(update, diff, None)
        return None

    @staticmethod
    def _own_rounding(partitioned, whole, exact) -> bool:
        """Whether the partitioned result is within the whole op's own rounding: against
        the float64 result, its error is at most ROUNDING_FACTOR times the whole op's (a
        sum reordered over parts rounds differently, about as much)."""
        if exact is None or not _is_float(np.asarray(whole).dtype):
            return False
        exact = np.asarray(exact, np.float64)
        own = float(np.max(np.abs(np.asarray(whole, np.float64) - exact), initial=0.0))
        error = float(np.max(np.abs(np.asarray(partitioned, np.float64) - exact), initial=0.0))
        return error <= ROUNDING_FACTOR * own

    def _replayable(self, op) -> bool:
        return (op.type not in _STATEFUL and not _is_stateful(op.type) and
                all(t in self.got or t in self.graph.constants for t in op.inputs))

    def _earlier_write(self, op):
        """For a read of a variable written earlier in the step, the first such write."""
        variable = (self.graph.variable_of_handle(op.inputs[0])
                    if op.type == "ReadVariableOp" else None)
        if variable is None:
            return None
        order = self._order
        writes = [w for w in variable.update_ops if order[w] < order[op.name]]
        return self.graph.op(min(writes, key=order.get)) if writes else None

    @functools.cached_property
    def _order(self) -> dict[str, int]:
        return {op.name: i for i, op in enumerate(self.graph)}

    def _inputs_agree(self, op) -> bool:
        return not any(self.by_tensor[t].differs for t in op.inputs if t in self.by_tensor)

    def _blame(self, op, diff: TensorDiff, replayed: TensorDiff | None) -> Culprit:
        plan, levels = self.plan, range(len(self.plan.levels))
        compared = [t for t in op.inputs if t in self.by_tensor]
        return Culprit(diff, self.report.step,
                       tuple(self.by_tensor[t] for t in compared),
                       tuple(level.choices.get(op.name, "-") for level in plan.levels),
                       tuple(tuple(_state(plan, level, t) for level in levels)
                             for t in compared),
                       _pieces(self.imported, plan, op.name), replayed)


ROUNDING_FACTOR = 16
_AGREES = TensorDiff("", "", "", 0.0, 0.0, False)
_STATEFUL = frozenset({"Placeholder", "VarHandleOp", "ReadVariableOp", "Const", "NoOp"})


def _is_stateful(op_type: str) -> bool:
    from tensorflow.python.framework import op_def_registry
    op_def = op_def_registry.get(op_type)
    return op_def is None or op_def.is_stateful


def _replay(imported: ImportedGraph, ops, got: Mapping[str, np.ndarray],
            as_float64: bool = False) -> dict[str, list[np.ndarray]]:
    """Each op run whole on one device from `got`'s values of its inputs: op name -> its
    outputs. `as_float64`: in float64 (floating types, attrs and inputs, widened), for the
    exact value the op's own rounding is measured against. Ops whose replay fails (no
    float64 kernel, a kernel that needs what the copy lacks) are left out."""
    if not ops:
        return {}
    nodes = {node.name: node for node in imported.graph_def.node}
    try:
        return _run_replays(imported, nodes, ops, got, as_float64)
    except (tf.errors.OpError, ValueError, TypeError):
        out = {}
        for op in ops:
            try:
                out.update(_run_replays(imported, nodes, [op], got, as_float64))
            except (tf.errors.OpError, ValueError, TypeError):
                pass
        return out


_NARROW_FLOATS = frozenset({types_pb2.DT_FLOAT, types_pb2.DT_HALF, types_pb2.DT_BFLOAT16})


def _widen(node) -> None:
    """The node's floating type attrs as float64."""
    for attr in node.attr.values():
        if attr.type in _NARROW_FLOATS:
            attr.type = types_pb2.DT_DOUBLE
        for i, t in enumerate(attr.list.type):
            if t in _NARROW_FLOATS:
                attr.list.type[i] = types_pb2.DT_DOUBLE


def _run_replays(imported, nodes, ops, got, as_float64) -> dict[str, list[np.ndarray]]:
    graph = imported.graph
    graph_def = graph_pb2.GraphDef()
    graph_def.versions.CopyFrom(imported.graph_def.versions)
    graph_def.library.CopyFrom(imported.graph_def.library)
    feeds, fetches = {}, {}
    for k, op in enumerate(ops):
        node = graph_def.node.add()
        node.CopyFrom(nodes[op.name])
        node.name, node.device = f"tofu_replay/{k}", ""
        del node.input[:]
        if as_float64:
            _widen(node)
        for i, t in enumerate(op.inputs):
            source = graph_def.node.add()
            source.name = f"tofu_replay/{k}/input_{i}"
            dtype = tf.as_dtype(graph.tensors[t].dtype)
            if as_float64 and dtype.as_datatype_enum in _NARROW_FLOATS:
                dtype = tf.float64
            source.attr["dtype"].type = dtype.as_datatype_enum
            value = graph.constants[t] if t in graph.constants else got[t]
            value = np.asarray(value).astype(dtype.as_numpy_dtype, copy=False)
            if t in graph.constants:
                source.op = "Const"
                source.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype=dtype))
            else:
                source.op = "Placeholder"
                feeds[source.name + ":0"] = value
            node.input.append(source.name)
        fetches[op.name] = [f"{node.name}:{o}" for o in range(len(op.outputs))]
    replay_graph = tf.Graph()
    with replay_graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=replay_graph, config=session_config(1)) as session:
        return session.run(fetches, feeds)


def _state(plan: Plan, level: int, tensor: str) -> str:
    try:
        return plan.state(level, tensor)
    except KeyError:
        return "?"


def _pieces(imported: ImportedGraph, plan: Plan, op_name: str) -> tuple[str, ...]:
    parts = partition_of(imported.graph, imported.graph_def, catalog(imported.graph), plan)
    lines = []
    for piece in parts.ops.get(op_name, ()):
        reads = "; ".join("const" if i is None else _box(i.data) + (
            f" pad {list(i.pads)}" if any(p for pair in i.pads for p in pair) else "")
            for i in piece.inputs)
        holds = "; ".join(f"{_box(o.box)}" + (" partial" if o.partial_levels else "")
                          for o in piece.outputs)
        lines.append(f"device {piece.device} ({piece.op_type}): reads {reads or '-'} -> "
                     f"{holds or '-'}")
    return tuple(lines)


def _box(box) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


# -- models and the binary ------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """A traced training step ready to compare: its import, batches and initial values."""
    imported: ImportedGraph
    batches: tuple[Mapping[str, np.ndarray], ...]
    values: Mapping[str, np.ndarray]


def case_of(concrete, batches: Sequence[Sequence[np.ndarray]]) -> Case:
    """A concrete function of a step over tf.Variables (`step.get_concrete_function(x, y)`)
    and its batches (one tuple of arguments per step); the variables' current values."""
    from tofu_tf.importer.graphdef_io import import_concrete_function
    imported = import_concrete_function(concrete)
    internal = {t.ref() for _, t in concrete.graph.captures}
    feeds = [t.name for t in concrete.inputs if t.ref() not in internal]
    values = {name: variable.numpy() for name, variable in imported.captures.items()}
    return Case(imported, tuple(dict(zip(feeds, batch)) for batch in batches), values)


def model_case(model: str, *, steps: int = 3, batch_size: int = 8, dtype: str = "float64",
               optimizer: str | None = None, image_size: int = 32, seed: int = 0) -> Case:
    """A reference model (`tofu_tf.models`) or a Keras one (`models.keras_models`)."""
    from tofu_tf.errors import TofuError
    from tofu_tf.models import MODELS, build
    from tofu_tf.models.keras_models import KERAS_MODELS, build_keras_step
    if model in MODELS:
        step = build(model, optimizer=optimizer or "momentum", batch_size=batch_size,
                     dtype=dtype, seed=seed)
        return case_of(step.concrete_function,
                       [step.sample_batch(seed + s) for s in range(steps)])
    if model in KERAS_MODELS:
        step = build_keras_step(model, batch_size=batch_size, image_size=image_size,
                                dtype=dtype, optimizer=optimizer or "sgd_momentum", seed=seed)
        return case_of(step.concrete_function(),
                       [step.batch(seed + s) for s in range(steps)])
    raise TofuError(f"unknown model '{model}'; choose one of "
                    f"{', '.join(tuple(MODELS) + KERAS_MODELS)}.")


def main(argv) -> int:
    from absl import flags
    FLAGS = flags.FLAGS
    topology = FLAGS.topology or FLAGS.num_devices
    case = model_case(FLAGS.model, steps=FLAGS.steps, batch_size=FLAGS.batch_size,
                      dtype=FLAGS.dtype, optimizer=FLAGS.optimizer,
                      image_size=FLAGS.image_size)
    report = compare_step(case.imported, topology, case.batches, case.values,
                          rtol=FLAGS.rtol, atol=FLAGS.atol)
    print(report)
    return 0 if report.culprit is None else 1


def _define_flags() -> None:
    from absl import flags
    flags.DEFINE_string("model", "mobilenetv2", "a reference model (mlp, wresnet, lstm, "
                        "transformer) or a Keras one (models/keras_models.py)")
    flags.DEFINE_integer("num_devices", 8, "number of devices (ignored with --topology)")
    flags.DEFINE_string("topology", None, "levels outermost first, e.g. '2x4'")
    flags.DEFINE_integer("steps", 3, "steps to compare, each from the same values")
    flags.DEFINE_integer("batch_size", 8, "batch size")
    flags.DEFINE_integer("image_size", 32, "input size of image models")
    flags.DEFINE_enum("dtype", "float64", ["float32", "float64"],
                      "float dtype of the step (float64: no float32 rounding noise)")
    flags.DEFINE_string("optimizer", None, "optimizer (default: momentum SGD)")
    flags.DEFINE_float("rtol", 1e-4, "a tensor differs beyond rtol times its scale")
    flags.DEFINE_float("atol", 1e-6, "... or atol, where its scale is 0")


if __name__ == "__main__":
    import os
    import sys
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from absl import app
    _define_flags()
    app.run(lambda argv: sys.exit(main(argv)))
