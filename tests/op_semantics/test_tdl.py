"""TDL descriptions are checked when built; the registry refuses duplicates."""

import pytest

from tofu_tf.errors import DescriptionError, RegistryError, UnsupportedOpError
from tofu_tf.op_semantics import registry
from tofu_tf.op_semantics.registry import OpContext, describe, lookup
from tofu_tf.op_semantics.tdl import Max, Sum, Window, Opaque


def _ctx(ins, outs, **attrs):
    return OpContext("node", "Test", attrs, ins, ["float32"] * len(ins), outs,
                     ["float32"] * len(outs))


def test_matmul_description_builds_and_infers_reduction_extent():
    ctx = _ctx([(4, 6), (6, 5)], [(4, 5)])
    a, b = ctx.inputs
    c = ctx.compute(lambda i, j: Sum(lambda k: a[i, k] * b[k, j]))
    assert c.var_names == ("i", "j")
    assert c.body.vars[0].extent == 6


@pytest.mark.parametrize("build,message", [
    (lambda ctx, a, b: ctx.compute(lambda i: a[i, 0]), "rank 2"),
    (lambda ctx, a, b: ctx.compute(lambda i, j: a[i]), "indexed with 1"),
    (lambda ctx, a, b: ctx.compute(lambda i, j: Sum(lambda k: a[i, k] * b[k, j])),
     "different sizes"),
    (lambda ctx, a, b: ctx.compute(lambda i, j: Sum(lambda i: a[i, j])), "shadows"),
    (lambda ctx, a, b: ctx.compute(lambda i, j: a[i, 9]), "out of range"),
    (lambda ctx, a, b: ctx.compute(lambda i, j: Sum(lambda k: a[i, j] * 2)), "cannot be inferred"),
    (lambda ctx, a, b: ctx.compute(lambda i, j: a[i, 1.5]), "not an integer"),
    (lambda ctx, a, b: ctx.compute(lambda i, j: a[i, j], output=3), "does not exist"),
])
def test_malformed_descriptions_fail_when_built(build, message):
    ctx = _ctx([(4, 6), (5, 6)], [(4, 6)])
    a, b = ctx.inputs
    with pytest.raises(DescriptionError, match=message) as err:
        build(ctx, a, b)
    assert "node" in str(err.value)


def test_escaped_reduction_variable_is_rejected():
    ctx = _ctx([(4, 6)], [(4,)])
    x = ctx.inputs[0]
    leaked = []
    Sum(lambda k: leaked.append(k) or x[0, k])
    with pytest.raises(DescriptionError, match="outside"):
        ctx.compute(lambda i: x[i, leaked[0]])


def test_padded_access_may_read_out_of_range_constants():
    ctx = _ctx([(4, 6)], [(4, 6)])
    x = ctx.inputs[0].padded(0.0)
    ctx.compute(lambda i, j: x[i, -1] + x[i, j])


def test_window_and_opaque_bind_their_variables():
    ctx = _ctx([(4, 6)], [(4,)])
    x = ctx.inputs[0]
    ctx.compute(lambda i: Opaque("sort_first", Window(lambda j: x[i, j])) + Max(lambda j: x[i, j]))


def test_registry_refuses_duplicates_and_names_missing_ops():
    lookup("MatMul")  # loads the families
    with pytest.raises(RegistryError, match="registered twice"):
        registry.semantics("MatMul")(lambda ctx: None)
    with pytest.raises(UnsupportedOpError, match="NoSuchOp"):
        describe("n", "NoSuchOp", {}, [], [], [], [])


def test_non_constant_shape_argument_makes_the_instance_opaque(monkeypatch):
    registry_entry = registry.Description("TestReshapeLike", _reshape_like, family="tests")
    monkeypatch.setitem(registry._REGISTRY, "TestReshapeLike", registry_entry)
    sem = describe("r", "TestReshapeLike", {}, [(4, 6), (2,)], ["float32", "int32"],
                   [(24,)], ["float32"], constants={})
    assert sem.is_opaque and "constant" in sem.opaque_reason
    sem = describe("r", "TestReshapeLike", {}, [(4, 6), (1,)], ["float32", "int32"],
                   [(24,)], ["float32"], constants={1: [24]})
    assert not sem.is_opaque and sem.meta_inputs == {1}


def _reshape_like(ctx):
    ctx.const(1)
    x = ctx.inputs[0]
    ctx.compute(lambda f: x[f // 6, f % 6])
