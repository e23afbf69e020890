"""Where a partitioned step first differs from the unpartitioned one.

    report = compare_step(imported, topology, feeds, values)
    print(report)              # the first op whose output differs, its plan choices, devices

Both steps start from the same variable values and batch. The partitioned graph is
emitted with every compared tensor exposed (assembled whole on device 0), the
unpartitioned normalised GraphDef runs in a one-device Session, and the tensors are
compared in the planner graph's topological order. A tensor differs when its largest
absolute error exceeds `rtol` times its scale (the largest magnitude of the unpartitioned
value; `atol` when that is 0). The culprit is the first op, in that order, with a
differing output whose inputs all agree: its strategy at every level and the devices'
pieces name what to look at. Variables are compared after the step as well (an in-place
update has no output of its own). With `steps` > 1 each step starts both sides from the
unpartitioned side's values, so every step is judged on its own.

`python -m tofu_tf.debug --model=mobilenetv2 --num_devices=8` runs it on a reference
model or a Keras model (`tofu_tf.models.keras_models`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from tofu_tf._tf_graph import LazyGraph
from tofu_tf.api import optimize_imported
from tofu_tf.graph import Graph
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.options import Options
from tofu_tf.rewrite.emit import partition_of
from tofu_tf.rewrite.graphdef_io import ImportedGraph
from tofu_tf.runtime import Runner, session_config
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
    """The first op whose output differs while its inputs agree."""
    diff: TensorDiff
    step: int
    inputs: tuple[TensorDiff, ...]            # its compared inputs (all agree)
    choices: tuple[str, ...]                  # its plan choice at each level
    input_states: tuple[tuple[str, ...], ...]  # per input, its stored state at each level
    pieces: tuple[str, ...]                   # per device: what its local op reads, holds

    def __str__(self) -> str:
        lines = [f"step {self.step}: first differing op {self.diff.op} ({self.diff.op_type})",
                 f"  output {self.diff}",
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
            "outputs differ, but no op has a differing output with agreeing inputs "
            "(a variable update differs):"]
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
    reports = []
    with _Unpartitioned(imported) as single, Runner(optimized, values) as runner:
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
                break
    culprit = next((c for c in (_culprit(imported, optimized, r) for r in reports) if c),
                   None)
    return DebugReport(optimized.plan, tuple(reports), culprit)


def _diff(graph: Graph, t: str, got, want, rtol: float, atol: float) -> TensorDiff:
    op = graph.producer(t)
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype == bool or not np.issubdtype(want.dtype, np.number):
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


def _culprit(imported: ImportedGraph, optimized, report: StepReport) -> Culprit | None:
    graph = imported.graph
    by_tensor = {d.tensor: d for d in report.tensors}
    for diff in report.tensors:
        if not diff.differs:
            continue
        op = graph.op(diff.op)
        inputs = [by_tensor[t] for t in op.inputs if t in by_tensor]
        if any(d.differs for d in inputs):
            continue
        plan = optimized.plan
        choices = tuple(level.choices.get(op.name, "-") for level in plan.levels)
        states = tuple(tuple(_state(plan, level, t) for level in range(len(plan.levels)))
                       for t in op.inputs if t in by_tensor)
        return Culprit(diff, report.step, tuple(inputs), choices, states,
                       _pieces(imported, optimized.plan, op.name))
    return None


def _state(plan: Plan, level: int, tensor: str) -> str:
    try:
        return plan.state(level, tensor)
    except KeyError:
        return "?"


def _pieces(imported: ImportedGraph, plan: Plan, op_name: str) -> tuple[str, ...]:
    parts = partition_of(imported.graph, imported.graph_def, catalog(imported.graph), plan)
    lines = []
    for piece in parts.ops.get(op_name, ()):
        reads = "; ".join(f"{_box(i.data)}" + (f" pad {list(i.pads)}" if any(
            p for pair in i.pads for p in pair) else "") for i in piece.inputs)
        holds = "; ".join(f"{_box(o.box)}" + (" partial" if o.partial_levels else "")
                          for o in piece.outputs)
        lines.append(f"device {piece.device} ({piece.op_type}): reads {reads or '-'} -> "
                     f"{holds or '-'}")
    return tuple(lines)


def _box(box) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


class _Unpartitioned:
    """The imported (normalised) GraphDef in a one-device Session, its variables set from
    values by handle name."""

    def __init__(self, imported: ImportedGraph):
        self.graph = LazyGraph(imported.graph_def)
        self._reads, self._assigns = {}, {}
        with self.graph.as_default():
            for name in imported.graph.variables:
                op = self.graph.get_operation_by_name(name)
                dtype = op.get_attr("dtype")
                self._reads[name] = tf.raw_ops.ReadVariableOp(resource=op.outputs[0],
                                                              dtype=dtype)
                value = tf.compat.v1.placeholder(dtype)
                self._assigns[name] = (value, tf.raw_ops.AssignVariableOp(
                    resource=op.outputs[0], value=value))
        self.session = tf.compat.v1.Session(graph=self.graph, config=session_config(1))

    def load(self, values: Mapping[str, np.ndarray]) -> None:
        names = [n for n in values if n in self._assigns]
        self.session.run([self._assigns[n][1] for n in names],
                         {self._assigns[n][0]: values[n] for n in names})

    def values(self) -> dict[str, np.ndarray]:
        return self.session.run(self._reads)

    def run(self, feeds, fetches):
        return self.session.run(list(fetches), dict(feeds))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.session.close()
