"""One op run on real values: an instance with its inputs, parts cut from them, compared.

The shared ground of the validators (validate.py: each strategy of one level;
validate_levels.py: levels composed as the emitter composes them): `OpInstance` holds an
op's NodeDef, real input values and semantics and runs its own TensorFlow kernel eagerly;
`cut_input` cuts a part's input (slice, pad with fill), `compare` compares a result with
its share of the whole op's, `combine` reduces partial results, `expected_outputs` is the
whole op's outputs (None where the kernel leaves them undetermined).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tofu_tf.errors import TofuError


@dataclass(frozen=True)
class Finding:
    kind: str       # wrong | error | missing | unsampled | unrunnable | undetermined | refused
    op_type: str
    sample: str
    strategy: str = ""
    k: int = 0
    part: int = -1
    message: str = ""

    def __str__(self) -> str:
        where = f" {self.strategy} k={self.k} part={self.part}" if self.strategy else ""
        return f"{self.kind.upper():9s} {self.sample}{where}: {self.message}"


class OpInstance:
    """One op to validate: its NodeDef, real input values, semantics (described from the
    kernel's own output shapes). Built from a sample (`from_sample`) or from an op of a
    real training graph with the values its inputs had in a step (`validate_graph`)."""

    def __init__(self, node_def, values, resource, input_dtypes, consts, output_dtypes):
        from tofu_tf.op_semantics.registry import describe
        from tofu_tf.importer.tf_attrs import python_attrs
        self.node_def = node_def
        self.op_type = node_def.op
        self.num_outputs = len(output_dtypes)
        self.output_dtypes = list(output_dtypes)
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

    def with_random_floats(self, seed: int = 0) -> "OpInstance":
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
    def from_sample(cls, sample, seed: int = 0) -> "OpInstance":
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


def cut_input(value: np.ndarray, slices, pads, fill) -> np.ndarray:
    part = value[tuple(slice(a, b) for a, b in slices)]
    if pads is not None and any(p0 < 0 or p1 < 0 for p0, p1 in pads):
        # A region wholly past the tensor's edge: an empty slice whose pads place it (one
        # may be negative); the part reads fill only, as the emitter's Fill gives it.
        shape = tuple(b - a + p0 + p1 for (a, b), (p0, p1) in zip(slices, pads))
        return np.full(shape, fill if fill is not None else 0, dtype=value.dtype)
    if pads is not None and any(p0 or p1 for p0, p1 in pads):
        part = np.pad(part, pads, constant_values=fill if fill is not None else 0)
    return part


def compare(got: np.ndarray, want: np.ndarray) -> str | None:
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


def unwritten_outputs(inst) -> set[int]:
    """Outputs TensorFlow's own kernel leaves unwritten (their buffers hold whatever was
    there, which two runs may or may not reproduce): the reserve spaces of an inference
    FusedBatchNorm."""
    from tofu_tf.importer.tf_attrs import python_attrs
    attrs = python_attrs(inst.node_def)
    if inst.op_type.startswith("FusedBatchNorm") and "Grad" not in inst.op_type and \
            not attrs.get("is_training", True):
        return {3, 4}
    return set()


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")


def combine(reducer: str, acc, value):
    if acc is None:
        return value
    if reducer in ("sum", "mean"):
        return acc + value
    if reducer == "max":
        return np.maximum(acc, value)
    if reducer == "min":
        return np.minimum(acc, value)
    return acc * value


def attr_changes(sem, attrs) -> dict:
    """The attrs that differ from the whole op's (`sem`'s): what a local op changes."""
    changes = {}
    for key, value in attrs.items():
        old = sem.attrs.get(key)
        if key not in sem.attrs or not np.array_equal(np.asarray(old, dtype=object),
                                                      np.asarray(value, dtype=object)):
            changes[key] = value
    return changes


def run_local(inst: OpInstance, local) -> list[np.ndarray]:
    """Cut the real inputs as `local` says, run the kernel, crop each output."""
    values = [inst.values[i] if local.input_slices[i] is None
              else cut_input(inst.values[i], local.input_slices[i], local.input_pads[i],
                        local.input_fills[i]) for i in range(len(inst.values))]
    for i, value in local.const_inputs.items():
        values[i] = np.asarray(value, dtype=inst.values[i].dtype)
    results = inst.run(values, attr_changes(inst.sem, local.attrs))
    return [np.asarray(r if crop is None else r[tuple(slice(a, b) for a, b in crop)])
            for r, crop in zip(results, local.output_crops)]


def expected_outputs(inst: OpInstance) -> list:
    """The whole op's outputs; those the kernel leaves undetermined (two runs on the same
    inputs differ, or the kernel is known not to write them: `unwritten_outputs`) are None."""
    expected, again = inst.run(inst.values), inst.run(inst.values)
    return [None if o in unwritten_outputs(inst) or not same_values(a, b) else a
            for o, (a, b) in enumerate(zip(expected, again))]
