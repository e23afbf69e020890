"""Sources and variables: Const, Placeholder, PlaceholderWithDefault, VarHandleOp, NoOp,
ReadVariableOp, AssignVariableOp / AssignAddVariableOp / AssignSubVariableOp and
VariableShape.

A source has no data inputs, so every output dim splits and a part makes only its share:
a Const holds the slice of its value, a Placeholder is fed its share, a variable handle
names the part's shard of the variable. A handle stands for the variable's value, so a
read is an identity and an assignment an element-wise in-place write of the shard.
"""

from __future__ import annotations

import numpy as np

from tofu_tf.op_semantics.localize import replace
from tofu_tf.op_semantics.hooks import crop_split_outputs
from tofu_tf.op_semantics.ops.shape import shape_query
from tofu_tf.op_semantics.registry import semantics
from tofu_tf.op_semantics.tdl import Fn


def _local_shape_attr(ctx, local):
    """Placeholders and variable handles declare their shape: the part's shape."""
    shape = tuple(b - a for a, b in local.output_slices[0])
    return replace(local, attrs={**local.attrs, "shape": shape})


def _slice_value(ctx, local):
    """A Const whose value is at hand holds the part's slice of it."""
    value = local.attrs.get("value")
    if not isinstance(value, np.ndarray) or value.shape != ctx.sem.output_shapes[0]:
        return local
    share = tuple(slice(a, b) for a, b in local.output_slices[0])
    return replace(local, attrs={**local.attrs, "value": value[share]})


@semantics("Const", localize=_slice_value)
def const(ctx):
    ctx.compute_nd(lambda idx: Fn("const", *idx))


@semantics("Placeholder", "VarHandleOp", localize=_local_shape_attr)
def source(ctx):
    ctx.compute_nd(lambda idx: Fn(ctx.type, *idx))


@semantics("PlaceholderWithDefault", localize=_local_shape_attr)
def placeholder_with_default(ctx):
    default = ctx.inputs[0]
    ctx.compute_nd(lambda idx: default[idx])


@semantics("NoOp")
def no_op(ctx):
    """No outputs: nothing to split."""


@semantics("ReadVariableOp")
def read_variable(ctx):
    variable = ctx.inputs[0]
    ctx.compute_nd(lambda idx: variable[idx])


def _own_shard(ctx, local):
    """An assignment does not read the variable, but its handle names the part's shard."""
    return replace(local, input_slices=(local.output_slices[0],) + local.input_slices[1:])


@semantics("AssignVariableOp", localize=_own_shard)
def assign(ctx):
    value = ctx.inputs[1]
    ctx.update(0, lambda idx: value[idx])


@semantics("AssignAddVariableOp", "AssignSubVariableOp")
def assign_update(ctx):
    variable, value = ctx.inputs[:2]
    if ctx.type == "AssignAddVariableOp":
        ctx.update(0, lambda idx: variable[idx] + value[idx])
    else:
        ctx.update(0, lambda idx: variable[idx] - value[idx])


semantics("VariableShape", localize=crop_split_outputs)(shape_query)
