"""Strategy validator: run every derived strategy on real shards with the real kernel.

    python -m tofu_tf.tools.validate [--op=Conv2D,MatMul] [--k=2,3,4] [--verbose]
    python -m tofu_tf.tools.validate --model=mobilenetv2,gpt2   # ops of real graphs

For every sample instance of every registered op (samples/<family>.py), and every strategy
the analysis derives, for k in {2, 3, 4}: each part's inputs are cut from the real inputs
by `localize` (slices, halo padding, local attrs and constants), the op's own TensorFlow
kernel runs on them, and the parts are combined as the strategy says (split outputs are
compared with their share of the unsplit result, partial outputs are reduced first).

With --model, the instances are the distinct described ops of those models' training
graphs (Keras applications, keras_hub backbones, reference models), each on the values
its inputs had in one unpartitioned step: the shapes, strides, paddings, dilations and
data formats real layers use, not only the samples'.

Findings: `wrong` (a part disagrees with the unsplit op), `error` (the local kernel fails),
`missing` (an output dim of size >= 2 no strategy splits, without a stated reason; or an
input dim taken whole although cutting it like the output gives the right answer — a
split the description hides),
`unsampled` (a described op with no sample). Exit status is non-zero on any of them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from tofu_tf.errors import TofuError

SOURCE_OPS = frozenset({"Const", "Placeholder", "PlaceholderWithDefault", "VarHandleOp",
                        "NoOp"})
FAILING_KINDS = ("wrong", "error", "missing", "unsampled")


@dataclass(frozen=True)
class Finding:
    kind: str       # wrong | error | missing | unsampled | unrunnable | undetermined
    op_type: str
    sample: str
    strategy: str = ""
    k: int = 0
    part: int = -1
    message: str = ""

    def __str__(self) -> str:
        where = f" {self.strategy} k={self.k} part={self.part}" if self.strategy else ""
        return f"{self.kind.upper():9s} {self.sample}{where}: {self.message}"


@dataclass
class Report:
    samples: int = 0
    checks: int = 0
    strategies: int = 0
    findings: list[Finding] = field(default_factory=list)
    by_op: dict[str, list[str]] = field(default_factory=dict)

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.kind in FAILING_KINDS]


class _Instance:
    """One op to validate: its NodeDef, real input values, semantics (described from the
    kernel's own output shapes). Built from a sample (`from_sample`) or from an op of a
    real training graph with the values its inputs had in a step (`validate_graph`)."""

    def __init__(self, node_def, values, resource, input_dtypes, consts, output_dtypes):
        from tofu_tf.op_semantics.registry import describe
        from tofu_tf.importer.tf_attrs import python_attrs
        self.node_def = node_def
        self.op_type = node_def.op
        self.num_outputs = len(output_dtypes)
        self.resource = list(resource)
        self.values = list(values)
        self.input_dtypes = list(input_dtypes)
        shapes = [np.shape(v) for v in self.values]
        dtypes = [np.asarray(v).dtype.name for v in self.values]
        # The kernel's own output shapes: a static shape may be unknown (FusedBatchNormV3's
        # reserve_space_3) or differ from what the kernel returns (its gradient's (0,) vs ()).
        self.sem = None
        out_shapes = [r.shape for r in self.run(self.values)]
        self.sem = describe(node_def.name, self.op_type, python_attrs(node_def), shapes,
                            dtypes, out_shapes, list(output_dtypes), consts)

    def with_random_floats(self, seed: int = 0) -> "_Instance":
        """The same op on random floating inputs of the same shapes (meta, integer and
        boolean inputs kept): for the loose-region oracle, which the structure of real
        values (a ReLU mask's zeros, a slot still zero) can fool."""
        import copy
        rng = np.random.default_rng(seed)
        other = copy.copy(self)
        other.values = [
            value if i in self.sem.meta_inputs or not np.issubdtype(np.asarray(value).dtype,
                                                                    np.floating)
            else rng.uniform(-2.0, 2.0, np.shape(value)).astype(np.asarray(value).dtype)
            for i, value in enumerate(self.values)]
        return other

    @classmethod
    def from_sample(cls, sample, seed: int = 0) -> "_Instance":
        import tensorflow as tf
        rng = np.random.default_rng(seed)
        graph = tf.Graph()
        feeds, variables = {}, {}
        with graph.as_default():
            built = []
            for a in sample.args:
                value = a.make(rng)
                if a.kind == "input":
                    ph = tf.compat.v1.placeholder(a.dtype, a.shape)
                    feeds[ph] = value
                    built.append(ph)
                elif a.kind == "const":
                    built.append(tf.constant(value, dtype=a.dtype))
                else:
                    v = tf.Variable(value, dtype=a.dtype)
                    variables[v.handle.op.name] = value
                    built.append(v)
            sample.build(*built)
        targets = [op for op in graph.get_operations() if op.type == sample.op_type]
        if not targets:
            raise TofuError(f"sample {sample.id} builds no {sample.op_type} op.")
        op = targets[-1]
        resource = [t.dtype == tf.resource for t in op.inputs]
        values = cls._input_values(op, graph, feeds, variables)
        consts = {i: values[i] for i, t in enumerate(op.inputs) if t.op.type == "Const"}
        input_dtypes = [t.dtype.base_dtype if not r else None
                        for t, r in zip(op.inputs, resource)]
        return cls(op.node_def, values, resource, input_dtypes, consts,
                   [t.dtype.name for t in op.outputs])

    @staticmethod
    def _input_values(op, graph, feeds, variables) -> list[np.ndarray]:
        import tensorflow as tf
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.initializers.variables(
                graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)))
            plain = [t for t in op.inputs if t.dtype != tf.resource]
            fetched = iter(sess.run(plain, feeds))
        return [np.asarray(variables[t.op.name]) if t.dtype == tf.resource else next(fetched)
                for t in op.inputs]

    def run(self, values, attr_changes=None) -> list[np.ndarray]:
        """Run the op's kernel eagerly; outputs, then the new values of updated inputs."""
        import tensorflow as tf
        from tensorflow.python.eager import context, execute
        from tofu_tf.importer.tf_attrs import execute_attrs
        inputs, holders = [], {}
        for i, value in enumerate(values):
            if self.resource[i]:
                holders[i] = tf.Variable(value)
                inputs.append(holders[i].handle)
            else:
                inputs.append(tf.constant(value, dtype=self.input_dtypes[i]))
        outs = execute.execute(self.op_type.encode(), self.num_outputs, inputs,
                               execute_attrs(self.node_def.attr, attr_changes),
                               context.context())
        results = [o.numpy() for o in (outs or [])]
        for update in (self.sem.updates if self.sem is not None else ()):
            results.append(holders[update.alias].numpy())
        return results


def _cut(value: np.ndarray, slices, pads, fill) -> np.ndarray:
    part = value[tuple(slice(a, b) for a, b in slices)]
    if pads is not None and any(p0 < 0 or p1 < 0 for p0, p1 in pads):
        # A region wholly past the tensor's edge: an empty slice whose pads place it (one
        # may be negative); the part reads fill only, as the emitter's Fill gives it.
        shape = tuple(b - a + p0 + p1 for (a, b), (p0, p1) in zip(slices, pads))
        return np.full(shape, fill if fill is not None else 0, dtype=value.dtype)
    if pads is not None and any(p0 or p1 for p0, p1 in pads):
        part = np.pad(part, pads, constant_values=fill if fill is not None else 0)
    return part


def _close(got: np.ndarray, want: np.ndarray) -> str | None:
    if got.shape != want.shape:
        return f"shape {list(got.shape)} != expected {list(want.shape)}"
    if want.dtype.kind in "fc":
        scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
        if not np.allclose(got, want, rtol=1e-4, atol=1e-5 * scale, equal_nan=True):
            return f"max abs error {float(np.max(np.abs(got - want))):.3g}"
        return None
    if not np.array_equal(got, want):
        return f"{int(np.sum(got != want))} of {want.size} elements differ"
    return None


def _unwritten(inst) -> set[int]:
    """Outputs TensorFlow's own kernel leaves unwritten (their buffers hold whatever was
    there, which two runs may or may not reproduce): the reserve spaces of an inference
    FusedBatchNorm."""
    from tofu_tf.importer.tf_attrs import python_attrs
    attrs = python_attrs(inst.node_def)
    if inst.op_type.startswith("FusedBatchNorm") and "Grad" not in inst.op_type and \
            not attrs.get("is_training", True):
        return {3, 4}
    return set()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")


def _combine(reducer: str, acc, value):
    if acc is None:
        return value
    if reducer in ("sum", "mean"):
        return acc + value
    if reducer == "max":
        return np.maximum(acc, value)
    if reducer == "min":
        return np.minimum(acc, value)
    return acc * value


def _attr_changes(sem, local) -> dict:
    changes = {}
    for key, value in local.attrs.items():
        old = sem.attrs.get(key)
        if key not in sem.attrs or not np.array_equal(np.asarray(old, dtype=object),
                                                      np.asarray(value, dtype=object)):
            changes[key] = value
    return changes


def _run_local(inst: _Instance, local) -> list[np.ndarray]:
    """Cut the real inputs as `local` says, run the kernel, crop each output."""
    values = [inst.values[i] if local.input_slices[i] is None
              else _cut(inst.values[i], local.input_slices[i], local.input_pads[i],
                        local.input_fills[i]) for i in range(len(inst.values))]
    for i, value in local.const_inputs.items():
        values[i] = np.asarray(value, dtype=inst.values[i].dtype)
    results = inst.run(values, _attr_changes(inst.sem, local))
    return [np.asarray(r if crop is None else r[tuple(slice(a, b) for a, b in crop)])
            for r, crop in zip(results, local.output_crops)]


def check_strategy(inst: _Instance, strategy, k: int, expected, sample_id: str
                   ) -> list[Finding]:
    from tofu_tf.op_semantics.localize import localize
    sem = inst.sem
    partial: dict[int, np.ndarray] = {}
    findings, locals_ = [], []
    for part in range(k):
        where = dict(op_type=sem.op_type, sample=sample_id, strategy=str(strategy), k=k,
                     part=part)
        try:
            local = localize(sem, strategy, k, part)
            results = _run_local(inst, local)
            locals_.append(local)
        except Exception as err:  # a failing kernel is a finding, not a crash
            findings.append(Finding("error", message=f"{type(err).__name__}: "
                                    f"{str(err).splitlines()[0][:300]}", **where))
            return findings
        for o, (state, result) in enumerate(zip(strategy.outputs, results)):
            if state.kind == "partial":
                partial[o] = _combine(state.reducer, partial.get(o),
                                      result * local.output_scales[o]
                                      if state.reducer == "mean" else result)
                continue
            if expected[o] is None:
                continue
            want = expected[o][tuple(slice(a, b) for a, b in local.output_slices[o])]
            problem = _close(result, want)
            if problem:
                findings.append(Finding("wrong", message=f"output {o} ({state}): {problem}",
                                        **where))
    for o, combined in partial.items():
        if expected[o] is None:
            continue
        problem = _close(np.asarray(combined, dtype=expected[o].dtype), expected[o])
        if problem:
            # A part whose kernel leaves this output unwritten (two runs differ) has no
            # determined value to combine: reported, not failed, as for the whole op.
            kind = "wrong" if _parts_determined(inst, locals_, o) else "undetermined"
            findings.append(Finding(kind, op_type=sem.op_type, sample=sample_id,
                                    strategy=str(strategy), k=k,
                                    message=f"output {o} combined ({strategy.outputs[o]}): "
                                            f"{problem}"))
    return findings


def _parts_determined(inst: _Instance, locals_, output: int) -> bool:
    """Whether two runs of every part give the same `output`."""
    return all(_same(_run_local(inst, local)[output], _run_local(inst, local)[output])
               for local in locals_)


def _run_parts(inst: _Instance, strategy, k: int, expected, locals_) -> bool:
    """True when every part of `locals_` reproduces its share (no partial outputs)."""
    for local in locals_:
        try:
            results = _run_local(inst, local)
        except Exception:  # the narrowed cut does not even run: not a hidden split
            return False
        for o, result in enumerate(results):
            if expected[o] is None:
                continue
            want = expected[o][tuple(slice(a, b) for a, b in local.output_slices[o])]
            if _close(result, want) is not None:
                return False
    return True


def _varies_along(value, dim: int) -> bool:
    """Whether slices of `value` along `dim` differ: on a value constant along it (a
    zero-initialised slot), any slice gives the right answer and proves nothing."""
    value = np.asarray(value)
    return bool(np.any(value != np.take(value, [0], axis=dim)))


def loose_regions(inst: _Instance, strategy, expected, sample_id: str) -> list[Finding]:
    """Oracle for missed splits: an input dim the analysis takes whole, although cutting
    it like the output (same extent, aligned parts) still gives the right answer."""
    from tofu_tf.op_semantics.localize import localize, replace
    if strategy.kind != "output" or any(o.kind == "partial" for o in strategy.outputs):
        return []
    k = 2
    base = [localize(inst.sem, strategy, k, p) for p in range(k)]
    findings = []
    for i, region in enumerate(strategy.inputs):
        shape = inst.sem.input_shapes[i]
        for dim, size in enumerate(shape):
            if region.kind != "data" or size != strategy.extent or \
                    region.dim_label(dim, size) != "*" or \
                    not _varies_along(inst.values[i], dim):
                continue
            narrowed = []
            for p, local in enumerate(base):
                lo, hi = strategy.part(k, p)
                slices = list(local.input_slices[i])
                slices[dim] = (lo, hi + 1)
                all_slices = list(local.input_slices)
                all_slices[i] = tuple(slices)
                narrowed.append(replace(local, input_slices=tuple(all_slices)))
            if _run_parts(inst, strategy, k, expected, narrowed):
                findings.append(Finding(
                    "missing", inst.sem.op_type, sample_id, str(strategy), k,
                    message=f"input {i} dim {dim} is taken whole, but its aligned slice "
                            "suffices: the description hides a split"))
    return findings


def missing_dims(sem, strategies, sample_id: str) -> list[Finding]:
    """Output dims of size >= 2 that no strategy splits and no stated reason covers."""
    findings = []
    for o, compute in enumerate(sem.computes):
        if compute is None:
            continue
        for d, var in enumerate(compute.vars):
            if var.extent < 2 or var.name in sem.unsplittable:
                continue
            if not any(s.outputs[o].kind == "split" and s.outputs[o].dim == d
                       for s in strategies):
                findings.append(Finding("missing", sem.op_type, sample_id,
                                        message=f"output {o} dim {d} ('{var.name}', size "
                                                f"{var.extent}) has no strategy"))
    return findings


def validate_sample(sample, ks=(2, 3, 4), report: Report | None = None) -> Report:
    report = report or Report()
    report.samples += 1
    try:
        inst = _Instance.from_sample(sample)
    except Exception as err:
        import tensorflow as tf
        # The whole op does not run: TensorFlow's kernels for this build lack the
        # configuration (FusedBatchNormGrad inference in NCHW without oneDNN). Nothing
        # to compare a split against; reported, not failed.
        kind = "unrunnable" if isinstance(err, tf.errors.OpError) else "error"
        report.findings.append(Finding(kind, sample.op_type, sample.id,
                                       message=f"sample does not build or run: "
                                               f"{type(err).__name__}: {err}"[:400]))
        return report
    return validate_instance(inst, sample.id, ks, report)


def validate_instance(inst: _Instance, sample_id: str, ks=(2, 3, 4),
                      report: Report | None = None, oracle: _Instance | None = None
                      ) -> Report:
    """Every strategy of one instance against its whole op, for each k in `ks`; `oracle`:
    the instance the loose-region oracle runs on (default: `inst`)."""
    from tofu_tf.op_semantics.analysis import analyze
    report = report or Report()
    op_type = inst.op_type
    expected = _expected(inst)
    oracle, oracle_expected = (inst, expected) if oracle is None else (oracle, _expected(oracle))
    if inst.sem.is_opaque:
        report.by_op.setdefault(op_type, []).append(f"opaque: {inst.sem.opaque_reason}")
        return report
    strategies = analyze(inst.sem)
    report.findings.extend(missing_dims(inst.sem, strategies, sample_id))
    for strategy in strategies:
        report.strategies += 1
        report.by_op.setdefault(op_type, []).append(str(strategy))
        for k in ks:
            if strategy.valid_for(k):
                report.checks += 1
                report.findings.extend(check_strategy(inst, strategy, k, expected, sample_id))
        if ks:
            report.findings.extend(loose_regions(oracle, strategy, oracle_expected, sample_id))
    return report


def _expected(inst: _Instance) -> list:
    """The whole op's outputs; those the kernel leaves undetermined (two runs on the same
    inputs differ, or the kernel is known not to write them: `_unwritten`) are None."""
    expected, again = inst.run(inst.values), inst.run(inst.values)
    return [None if o in _unwritten(inst) or not _same(a, b) else a
            for o, (a, b) in enumerate(zip(expected, again))]


def validate(op_types=None, ks=(2, 3, 4)) -> Report:
    """Validate every sample (of `op_types`, if given) and report unsampled ops."""
    from tofu_tf.op_semantics.registry import registered
    from tofu_tf.op_semantics.samples import all_samples
    report = Report()
    wanted = set(op_types) if op_types else None
    samples = [s for s in all_samples() if wanted is None or s.op_type in wanted]
    for s in samples:
        validate_sample(s, ks, report)
    sampled = {s.op_type for s in all_samples()}
    for op_type, desc in sorted(registered().items()):
        if wanted is not None and op_type not in wanted:
            continue
        if desc.build is not None and op_type not in sampled and op_type not in SOURCE_OPS:
            report.findings.append(Finding("unsampled", op_type, op_type,
                                           message="described but has no validator sample"))
    return report


def graph_instances(imported, feeds, values):
    """(id, instance) of each distinct described op of a real training graph (by catalog
    signature: type, attrs, shapes, dtypes, constants), with the values its inputs had in
    one unpartitioned step from `values` (variable handle op name -> value) and `feeds`."""
    from tofu_tf.tools.debug import compared_tensors, unpartitioned_values
    from tofu_tf.op_semantics.registry import description, signature
    graph = imported.graph
    got = unpartitioned_values(imported, feeds, values, compared_tensors(graph))
    nodes = {node.name: node for node in imported.graph_def.node}
    seen = set()
    for op in graph:
        desc = description(op.type)
        if op.type in SOURCE_OPS or desc is None or desc.build is None:
            continue
        ins, outs = graph.input_tensors(op), graph.output_tensors(op)
        constants = {i: graph.constants[t] for i, t in enumerate(op.inputs)
                     if t in graph.constants}
        key = signature(op.type, op.attrs, [t.shape for t in ins], [t.dtype for t in ins],
                        [t.shape for t in outs], [t.dtype for t in outs], constants)
        inputs = [_input_value(graph, t, got, values) for t in ins]
        if key in seen or any(v is None for v in inputs):
            continue
        seen.add(key)
        yield f"{op.type}[{op.name}]", _graph_instance(nodes[op.name], ins, outs, inputs,
                                                      constants)


def _input_value(graph, tensor, got, values):
    if tensor.is_resource:
        variable = graph.variable_of_handle(tensor.name)
        return None if variable is None else values[variable.name]
    return got.get(tensor.name)


def _graph_instance(node_def, ins, outs, inputs, constants) -> _Instance:
    import tensorflow as tf
    node = type(node_def)()
    node.CopyFrom(node_def)
    node.device = ""
    return _Instance(node, inputs, [t.is_resource for t in ins],
                     [None if t.is_resource else tf.as_dtype(t.dtype) for t in ins],
                     constants, [t.dtype for t in outs])


def validate_graph(imported, feeds, values, ks=(2, 3, 4)) -> Report:
    """Every strategy of every distinct described op of a real training graph, on the
    values its inputs had in a step (see `graph_instances`): the shapes, strides, paddings,
    dilations and data formats the model's layers really use. The loose-region oracle runs
    on random values of the same shapes (`with_random_floats`)."""
    report = Report()
    for sample_id, inst in graph_instances(imported, feeds, values):
        report.samples += 1
        validate_instance(inst, sample_id, ks, report, oracle=inst.with_random_floats())
    return report


def main(argv) -> int:
    from absl import flags
    FLAGS = flags.FLAGS
    ops = [o for o in FLAGS.op.split(",") if o] if FLAGS.op else None
    ks = tuple(int(k) for k in FLAGS.k.split(","))
    if FLAGS.model:
        from tofu_tf.tools.debug import model_case
        report = Report()
        for name in FLAGS.model.split(","):
            case = model_case(name, steps=1, dtype=FLAGS.dtype, batch_size=FLAGS.batch_size)
            part = validate_graph(case.imported, case.batches[0], case.values, ks)
            report.samples += part.samples
            report.checks += part.checks
            report.strategies += part.strategies
            report.findings += part.findings
            for op_type, lines in part.by_op.items():
                report.by_op.setdefault(op_type, []).extend(lines)
    else:
        report = validate(ops, ks)
    if FLAGS.verbose:
        for op_type, lines in sorted(report.by_op.items()):
            print(op_type)
            for line in lines:
                print("   ", line)
    for finding in report.findings:
        print(finding)
    kinds = {k: sum(f.kind == k for f in report.findings) for k in FAILING_KINDS}
    print(f"validated {report.samples} samples, {report.strategies} strategies, "
          f"{report.checks} checks: " + ", ".join(f"{v} {k}" for k, v in kinds.items()))
    return 1 if report.failures else 0


def _define_flags() -> None:
    from absl import flags
    flags.DEFINE_string("op", "", "comma-separated op types to validate (default: all)")
    flags.DEFINE_string("k", "2,3,4", "comma-separated split counts")
    flags.DEFINE_bool("verbose", False, "print every strategy")
    flags.DEFINE_string("model", "", "validate the ops of these models' training graphs "
                        "(reference or Keras, comma-separated) on their real inputs, "
                        "instead of the samples")
    flags.DEFINE_enum("dtype", "float64", ["float32", "float64"], "float dtype of --model")
    flags.DEFINE_integer("batch_size", 8, "batch size of --model")


if __name__ == "__main__":
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from absl import app
    _define_flags()
    app.run(lambda argv: sys.exit(main(argv)))
