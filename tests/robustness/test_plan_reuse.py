"""A stored plan instead of the search: the same output, and plans for something else
rejected at their first difference."""

from __future__ import annotations

import dataclasses

import pytest

import tofu_tf
from tofu_tf.api import optimize
from tofu_tf.errors import PlanMismatchError
from tofu_tf.models import build
from tofu_tf.search.plan import Plan


@pytest.fixture(scope="module")
def transformer():
    step = build("transformer", optimizer="adam", graph_only=True, batch_size=8)
    searched = optimize(step.graph_def, step.fetches, feeds=list(step.feeds), num_devices=4)
    return step, searched


def _optimize(step, **kwargs):
    return optimize(step.graph_def, step.fetches, feeds=list(step.feeds), **kwargs)


def test_a_stored_plan_skips_the_search_and_gives_the_same_graph(transformer, monkeypatch):
    step, searched = transformer
    stored = Plan.from_json(searched.plan.to_json())

    def no_search(*args, **kwargs):
        raise AssertionError("the search ran although a plan was given")
    monkeypatch.setattr(tofu_tf.api, "make_plan", no_search)
    reused = _optimize(step, plan=stored)                  # the plan's topology: 2x2
    assert reused.num_devices == 4
    assert (reused.graph_def.SerializeToString(deterministic=True)
            == searched.graph_def.SerializeToString(deterministic=True))
    assert reused.ledger.total() == searched.ledger.total()


def test_a_plan_for_another_device_count_is_rejected(transformer):
    step, searched = transformer
    with pytest.raises(PlanMismatchError, match="levels 2x2 .* topology is 2x2x2"):
        _optimize(step, plan=searched.plan, num_devices=8)


def test_a_plan_for_another_model_names_the_first_op_it_lacks(transformer):
    step, searched = transformer
    mlp = build("mlp", optimizer="adam", graph_only=True, batch_size=8)
    with pytest.raises(PlanMismatchError) as caught:
        _optimize(mlp, plan=searched.plan)
    first = next(name for name in _graph_order(mlp) if name not in searched.plan.op_types)
    assert caught.value.node == first and "not in the plan" in str(caught.value)


def test_a_strategy_the_op_cannot_take_is_named(transformer):
    step, searched = transformer
    level = searched.plan.levels[0]
    victim = next(op for op, label in level.choices.items() if label != "replicate")
    choices = {**level.choices, victim: "o:no_such_dim"}
    bad = dataclasses.replace(searched.plan, levels=(
        dataclasses.replace(level, choices=choices),) + searched.plan.levels[1:])
    with pytest.raises(PlanMismatchError, match="'o:no_such_dim'") as caught:
        _optimize(step, plan=bad)
    assert caught.value.node == victim and caught.value.op_type


def test_an_op_the_graph_lacks_is_named(transformer):
    step, searched = transformer
    bad = dataclasses.replace(searched.plan,
                              op_types={**searched.plan.op_types, "ghost": "MatMul"})
    with pytest.raises(PlanMismatchError, match="ops the graph lacks") as caught:
        _optimize(step, plan=bad)
    assert caught.value.node == "ghost"


def _graph_order(step) -> list[str]:
    from tofu_tf.importer.graphdef_io import import_graph_def
    return [op.name for op in import_graph_def(step.graph_def, step.fetches).graph]
