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

With --levels=2 (the default), every strategy is also composed with every strategy of its
part's local op, two levels of 2 parts each and 2 then 3 (uneven parts cut again), as the
emitter composes them
(validate_levels.py): a description right for the whole op can be wrong for a local op.
--levels=3 composes three (2x2x2, the 8-device default topology).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from tofu_tf.tools.kernels import (Finding, OpInstance, combine, compare, expected_outputs,
                                   run_local, same_values)
from tofu_tf.tools.validate_levels import check_levels

SOURCE_OPS = frozenset({"Const", "Placeholder", "PlaceholderWithDefault", "VarHandleOp",
                        "NoOp"})
FAILING_KINDS = ("wrong", "error", "missing", "unsampled")


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


def check_strategy(inst: OpInstance, strategy, k: int, expected, sample_id: str
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
            results = run_local(inst, local)
            locals_.append(local)
        except Exception as err:  # a failing kernel is a finding, not a crash
            findings.append(Finding("error", message=f"{type(err).__name__}: "
                                    f"{str(err).splitlines()[0][:300]}", **where))
            return findings
        for o, (state, result) in enumerate(zip(strategy.outputs, results)):
            if state.kind == "partial":
                partial[o] = combine(state.reducer, partial.get(o),
                                      result * local.output_scales[o]
                                      if state.reducer == "mean" else result)
                continue
            if expected[o] is None:
                continue
            want = expected[o][tuple(slice(a, b) for a, b in local.output_slices[o])]
            problem = compare(result, want)
            if problem:
                findings.append(Finding("wrong", message=f"output {o} ({state}): {problem}",
                                        **where))
    for o, combined in partial.items():
        if expected[o] is None:
            continue
        problem = compare(np.asarray(combined, dtype=expected[o].dtype), expected[o])
        if problem:
            # A part whose kernel leaves this output unwritten (two runs differ) has no
            # determined value to combine: reported, not failed, as for the whole op.
            kind = "wrong" if _parts_determined(inst, locals_, o) else "undetermined"
            findings.append(Finding(kind, op_type=sem.op_type, sample=sample_id,
                                    strategy=str(strategy), k=k,
                                    message=f"output {o} combined ({strategy.outputs[o]}): "
                                            f"{problem}"))
    return findings


def _parts_determined(inst: OpInstance, locals_, output: int) -> bool:
    """Whether two runs of every part give the same `output`."""
    return all(same_values(run_local(inst, local)[output], run_local(inst, local)[output])
               for local in locals_)


def _run_parts(inst: OpInstance, strategy, k: int, expected, locals_) -> bool:
    """True when every part of `locals_` reproduces its share (no partial outputs)."""
    for local in locals_:
        try:
            results = run_local(inst, local)
        except Exception:  # the narrowed cut does not even run: not a hidden split
            return False
        for o, result in enumerate(results):
            if expected[o] is None:
                continue
            want = expected[o][tuple(slice(a, b) for a, b in local.output_slices[o])]
            if compare(result, want) is not None:
                return False
    return True


def _varies_along(value, dim: int) -> bool:
    """Whether slices of `value` along `dim` differ: on a value constant along it (a
    zero-initialised slot), any slice gives the right answer and proves nothing."""
    value = np.asarray(value)
    return bool(np.any(value != np.take(value, [0], axis=dim)))


def loose_regions(inst: OpInstance, strategy, expected, sample_id: str) -> list[Finding]:
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


def validate_sample(sample, ks=(2, 3, 4), report: Report | None = None, levels: int = 2
                    ) -> Report:
    report = report or Report()
    report.samples += 1
    try:
        inst = OpInstance.from_sample(sample)
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
    return validate_instance(inst, sample.id, ks, report, levels=levels)


def validate_instance(inst: OpInstance, sample_id: str, ks=(2, 3, 4),
                      report: Report | None = None, oracle: OpInstance | None = None,
                      levels: int = 2) -> Report:
    """Every strategy of one instance against its whole op, for each k in `ks`; `oracle`:
    the instance the loose-region oracle runs on (default: `inst`); `levels` L >= 2: also
    every composition of L levels of 2 parts each, and of L - 1 levels of 2 then one of
    3; 1: one level only."""
    from tofu_tf.op_semantics.analysis import analyze
    report = report or Report()
    op_type = inst.op_type
    expected = expected_outputs(inst)
    oracle, oracle_expected = ((inst, expected) if oracle is None
                               else (oracle, expected_outputs(oracle)))
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
    if ks and levels >= 2:
        # 2 parts per level, and the last level cut 3 ways: an uneven part cut again
        # leaves parts with nothing to read or nothing to hold.
        for ways in ((2,) * levels, (2,) * (levels - 1) + (3,)):
            checks, findings = check_levels(inst, strategies, expected, sample_id, ways)
            report.checks += checks
            report.findings.extend(findings)
    return report


def validate(op_types=None, ks=(2, 3, 4), levels: int = 2) -> Report:
    """Validate every sample (of `op_types`, if given) and report unsampled ops."""
    from tofu_tf.op_semantics.registry import registered
    from tofu_tf.op_semantics.samples import all_samples
    report = Report()
    wanted = set(op_types) if op_types else None
    samples = [s for s in all_samples() if wanted is None or s.op_type in wanted]
    for s in samples:
        validate_sample(s, ks, report, levels)
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


def _graph_instance(node_def, ins, outs, inputs, constants) -> OpInstance:
    import tensorflow as tf
    node = type(node_def)()
    node.CopyFrom(node_def)
    node.device = ""
    return OpInstance(node, inputs, [t.is_resource for t in ins],
                     [None if t.is_resource else tf.as_dtype(t.dtype) for t in ins],
                     constants, [t.dtype for t in outs])


def validate_graph(imported, feeds, values, ks=(2, 3, 4), levels: int = 2) -> Report:
    """Every strategy of every distinct described op of a real training graph, on the
    values its inputs had in a step (see `graph_instances`): the shapes, strides, paddings,
    dilations and data formats the model's layers really use. The loose-region oracle runs
    on random values of the same shapes (`with_random_floats`)."""
    report = Report()
    for sample_id, inst in graph_instances(imported, feeds, values):
        report.samples += 1
        validate_instance(inst, sample_id, ks, report, oracle=inst.with_random_floats(),
                          levels=levels)
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
            part = validate_graph(case.imported, case.batches[0], case.values, ks,
                                  FLAGS.levels)
            report.samples += part.samples
            report.checks += part.checks
            report.strategies += part.strategies
            report.findings += part.findings
            for op_type, lines in part.by_op.items():
                report.by_op.setdefault(op_type, []).extend(lines)
    else:
        report = validate(ops, ks, FLAGS.levels)
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
    flags.DEFINE_integer("levels", 2, "L >= 2: also compose every strategy with every "
                         "strategy of its part's local op, L levels of 2 parts; 1: one level")
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
