"""rewrite/tidy.py: fewer plumbing nodes, the same values, the same bytes across devices."""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from tofu_tf.rewrite.emit import cpu_devices
from tofu_tf.rewrite.nodedefs import GraphBuilder, type_attr
from tofu_tf.rewrite.tidy import tidy
from tofu_tf.rewrite.verify import cross_device_bytes
from tofu_tf.runtime.session import session_config

F32 = types_pb2.DT_FLOAT


def _build():
    """x [8, 6] on device 0, read through plumbing slices by ops on devices 0 and 1."""
    b = GraphBuilder(cpu_devices(2))
    x = b.node("Placeholder", "x", 0, (), {"dtype": type_attr(F32)}, [(8, 6)], [F32])[0]
    fixed = []

    def op(kind, value, device):
        ref = b.node(kind, b.name(kind.lower()), device, (value,), {"T": type_attr(F32)},
                     [value.shape], [F32])[0]
        fixed.append(ref.node)
        return ref

    top = b.slice(x, ((0, 4), (0, 6)), 0, b.name("slice"))       # rows: tile x
    bottom = b.slice(x, ((4, 8), (0, 6)), 0, b.name("slice"))
    op("Neg", top, 1)                                              # crosses devices
    op("Neg", bottom, 0)
    inner = b.slice(bottom, ((1, 3), (2, 5)), 0, b.name("slice"))  # a slice of a slice
    op("Abs", inner, 0)
    left = b.slice(x, ((0, 8), (0, 2)), 1, b.name("slice"))        # x read on device 1
    right = b.slice(x, ((0, 8), (2, 6)), 1, b.name("slice"))       # (columns: tile x)
    op("Neg", left, 1)
    op("Abs", right, 1)
    gap = [b.slice(x, ((0, 8), (0, 1)), 0, b.name("slice")),       # columns 0 and 3-5:
           b.slice(x, ((0, 8), (3, 6)), 0, b.name("slice"))]       # no tiling, no split
    for part in gap:
        op("Neg", part, 1)
    return b, fixed


def _run(graph_def, fetches, x):
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph, config=session_config(2)) as session:
        return session.run([f + ":0" for f in fetches], {"x:0": x})


def test_tidy_splits_tilings_composes_slices_and_keeps_values_and_bytes():
    b, fixed = _build()
    before = b.graph_def.SerializeToString()
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    reference = _run(b.graph_def, fixed, x)
    moved = cross_device_bytes(b.graph_def)

    tidy(b, set(fixed))

    assert b.graph_def.SerializeToString() != before
    ops = collections.Counter(node.op for node in b.graph_def.node)
    # rows on device 0 and columns on device 1 become one SplitV each; the slice of a
    # slice reads x; the two columns with a gap between them stay slices
    assert ops["SplitV"] == 2 and ops["Slice"] == 3, ops
    nodes = {node.name: node for node in b.graph_def.node}
    composed = [n for n in b.graph_def.node if n.op == "Slice" and
                nodes[n.input[0].partition(":")[0]].op == "Placeholder"]
    assert len(composed) == 3
    for name in fixed:                                # the fixed nodes keep their names
        assert name in nodes
    assert cross_device_bytes(b.graph_def) == moved
    for got, want in zip(_run(b.graph_def, fixed, x), reference):
        np.testing.assert_array_equal(got, want)
    # the records the device chain reads follow the new graph
    names, _, _, inputs = b._records
    assert names == [n.name for n in b.graph_def.node]
    assert inputs == [list(n.input) for n in b.graph_def.node]


def test_tidy_leaves_fixed_slices_alone():
    b, fixed = _build()
    slices = [n.name for n in b.graph_def.node if n.op == "Slice"]
    tidy(b, set(fixed) | set(slices))
    assert collections.Counter(n.op for n in b.graph_def.node)["SplitV"] == 0
    assert [n.name for n in b.graph_def.node if n.op == "Slice"] == slices
