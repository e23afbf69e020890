"""Graph-only builds without initializers: the step a planner sees, in fewer nodes."""

from __future__ import annotations

import pytest

from tofu_tf.models import build
from tofu_tf.importer.graphdef_io import import_graph_def

MODELS = {"mlp": {}, "transformer": {"layers": 3}, "wresnet": {"depth": 38}, "lstm": {}}


def _step(model: str, layer_functions: bool, initializers: bool):
    return build(model, optimizer="adam", graph_only=True, batch_size=4,
                 layer_functions=layer_functions, initializers=initializers, **MODELS[model])


def _planner_view(step):
    """The planner graph up to the names TensorFlow numbers (`Const_22`: a flat build's
    initializers take some of those): each op's type, attrs, inputs as (producer's
    position, output) and output shapes and dtypes, in order; and the variables."""
    graph = import_graph_def(step.graph_def, step.fetches).graph
    position = {op.name: i for i, op in enumerate(graph)}
    producer = {t: (position[op.name], j) for op in graph for j, t in enumerate(op.outputs)}
    ops = [(op.type, sorted(op.attrs.items()), [producer[t] for t in op.inputs],
            [(graph.tensors[t].shape, graph.tensors[t].dtype) for t in op.outputs])
           for op in graph]
    return ops, sorted(graph.variables)


@pytest.mark.parametrize("layer_functions", [True, False])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_planner_graph_is_the_same(model, layer_functions, share_from_two_calls):
    full = _step(model, layer_functions, True)
    lean = _step(model, layer_functions, False)
    assert lean.init_op is None and full.init_op is not None
    assert lean.config["initializers"] is False
    assert len(lean.graph_def.node) < len(full.graph_def.node)
    assert not any(n.name.endswith("/Assign") for n in lean.graph_def.node)
    assert _planner_view(lean) == _planner_view(full)


def test_eager_builds_always_initialize():
    step = build("mlp", batch_size=2, initializers=False)
    assert step.config["initializers"] is True and step.variables
