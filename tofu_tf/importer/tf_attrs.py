"""NodeDef attrs <-> plain Python values, both directions.

The planner sees attrs as int, float, bool, str, dtype names ("float32"), shapes as tuples
(None for unknown rank) and lists as tuples. `to_attr_value` turns a changed Python value
back into an AttrValue of the same kind as the original, and `execute_attrs` flattens
attrs for eager kernel execution.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, tensor_shape_pb2


def _shape(proto: tensor_shape_pb2.TensorShapeProto) -> tuple[int, ...] | None:
    if proto.unknown_rank:
        return None
    return tuple(int(d.size) for d in proto.dim)


def _dtype_name(enum_value: int) -> str:
    return tf.dtypes.as_dtype(enum_value).name


def _string(raw: bytes) -> str | bytes:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def python_value(value: attr_value_pb2.AttrValue) -> Any:
    """One AttrValue as a plain Python value (tensors as NumPy arrays)."""
    kind = value.WhichOneof("value")
    if kind == "list":
        lst = value.list
        for field, convert in (("s", _string), ("i", int), ("f", float), ("b", bool),
                               ("type", _dtype_name), ("shape", _shape),
                               ("tensor", tf.make_ndarray), ("func", lambda f: f.name)):
            items = getattr(lst, field)
            if len(items):
                return tuple(convert(x) for x in items)
        return ()
    if kind is None:
        return None
    if kind == "s":
        return _string(value.s)
    if kind == "type":
        return _dtype_name(value.type)
    if kind == "shape":
        return _shape(value.shape)
    if kind == "tensor":
        return tf.make_ndarray(value.tensor)
    if kind == "func":
        return value.func.name
    return getattr(value, kind)


def python_attrs(node_def, *, keep_private: bool = False) -> dict[str, Any]:
    """All attrs of a NodeDef as Python values; attrs starting with '_' are dropped."""
    return {key: python_value(node_def.attr[key]) for key in sorted(node_def.attr)
            if keep_private or not key.startswith("_")}


def to_attr_value(original: attr_value_pb2.AttrValue | None, value: Any
                  ) -> attr_value_pb2.AttrValue:
    """`value` as an AttrValue of the same kind as `original` (or inferred from value)."""
    kind = original.WhichOneof("value") if original is not None else None
    out = attr_value_pb2.AttrValue()
    if kind == "list" or (kind is None and isinstance(value, (tuple, list))):
        item_kind = _list_kind(original, value)
        target = getattr(out.list, item_kind)
        for item in value:
            if item_kind == "type":
                target.append(tf.dtypes.as_dtype(item).as_datatype_enum)
            elif item_kind == "s":
                target.append(item.encode() if isinstance(item, str) else item)
            elif item_kind == "shape":
                target.add().CopyFrom(tf.TensorShape(item).as_proto())
            else:
                target.append(item)
        out.list.SetInParent()
        return out
    kind = kind or _scalar_kind(value)
    if kind == "type":
        out.type = tf.dtypes.as_dtype(value).as_datatype_enum
    elif kind == "s":
        out.s = value.encode() if isinstance(value, str) else value
    elif kind == "shape":
        out.shape.CopyFrom(tf.TensorShape(value).as_proto())
    elif kind == "tensor":
        out.tensor.CopyFrom(tf.make_tensor_proto(value))
    else:
        setattr(out, kind, value)
    return out


def _list_kind(original, value) -> str:
    if original is not None:
        for field in ("s", "i", "f", "b", "type", "shape"):
            if len(getattr(original.list, field)):
                return field
    first = next(iter(value), 0)
    return _scalar_kind(first) if not isinstance(first, (tuple, list)) else "shape"


def _scalar_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "b"
    if isinstance(value, (int, np.integer)):
        return "i"
    if isinstance(value, (float, np.floating)):
        return "f"
    if isinstance(value, np.ndarray):
        return "tensor"
    return "s"


def execute_attrs(node_attrs: Mapping[str, attr_value_pb2.AttrValue],
                  changes: Mapping[str, Any] | None = None) -> tuple:
    """Flat (name, value, ...) attrs for eager execution, with `changes` applied."""
    flat: list[Any] = []
    for key in sorted(node_attrs):
        if key.startswith("_"):
            continue
        proto = node_attrs[key]
        if changes and key in changes:
            proto = to_attr_value(proto, changes[key])
        flat.extend((key, _execute_value(proto)))
    return tuple(flat)


def _execute_value(value: attr_value_pb2.AttrValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "list":
        lst = value.list
        if len(lst.type):
            return list(lst.type)
        if len(lst.shape):
            return [_shape(s) for s in lst.shape]
        for field in ("s", "i", "f", "b"):
            if len(getattr(lst, field)):
                return list(getattr(lst, field))
        return []
    if kind == "shape":
        shape = _shape(value.shape)
        return None if shape is None else list(shape)
    if kind == "type":
        return value.type
    if kind == "tensor":
        return value.tensor
    if kind == "func":
        return value.func
    return getattr(value, kind) if kind else None
