"""Graph-only builds make GraphVariables: the GraphDef must be the one tf.Variable gives,
minus tf.Variable's never-run bookkeeping nodes (so plans and numbers are unchanged)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from tofu_tf.models import build
from tofu_tf.models import common


def _nodes(step) -> dict:
    out = {}
    for node in step.graph_def.node:
        if "/IsInitialized/" in node.name or node.name.endswith("/Read/ReadVariableOp"):
            continue        # tf.Variable's own: initialised check, snapshot read
        # tf.Variable also colocates its handle with itself ('_class': 'loc:@' + name);
        # a custom gradient's IdentityN names its gradient function uniquely per build
        out[node.name] = (node.op, list(node.input), node.device,
                          sorted((k, str(v)) for k, v in node.attr.items()
                                 if k not in ("_class", "_gradient_op_type")))
    return out


@pytest.mark.parametrize("model,optimizer", [("mlp", "momentum"), ("wresnet", "sgd"),
                                             ("lstm", "adam"), ("transformer", "adam")])
def test_same_graph_as_tf_variable(model, optimizer, monkeypatch):
    fast = build(model, optimizer=optimizer, graph_only=True, batch_size=8,
                 layer_functions=False)
    monkeypatch.setattr(common, "GraphVariable", lambda initial, name, trainable: tf.Variable(
        initial, name=name, trainable=trainable, dtype=initial.dtype))
    plain = build(model, optimizer=optimizer, graph_only=True, batch_size=8,
                  layer_functions=False)
    assert any(n.op == "VarIsInitializedOp" for n in plain.graph_def.node)
    assert not any(n.op == "VarIsInitializedOp" for n in fast.graph_def.node)
    assert _nodes(fast) == _nodes(plain)
    assert (fast.fetches, fast.init_op) == (plain.fetches, plain.init_op)
