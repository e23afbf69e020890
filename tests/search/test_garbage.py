"""A search leaves its work to reference counting: none of it in a reference cycle that
only a collection (walking everything the search made) would free."""

from __future__ import annotations

import gc

import pytest

from tofu_tf.options import Options
from tofu_tf.search.plan import make_plan
from tofu_tf.search.topology import Topology

from tests.search.test_search import graph_of

SEARCH_TYPES = {"SearchCache", "Problem", "LevelModel", "OpVectors", "ProblemOp"}


def _cyclic_garbage(make) -> set[str]:
    """The search's types among the objects a collection would free after `make()`."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        make()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return {type(o).__name__ for o in gc.garbage
                if type(o).__module__.startswith("tofu_tf.search")} & SEARCH_TYPES
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()


@pytest.mark.parametrize("options", [
    Options(),                                            # recursion, joint search
    Options(memory_budget_bytes=1 << 40),                 # searches sharing one cache
    Options(fastest_step=True, step_profile="h200_8"),
], ids=["default", "budget", "fastest"])
def test_a_search_leaves_no_cycle(options):
    graph = graph_of("wresnet")
    assert not _cyclic_garbage(
        lambda: make_plan(graph, Topology.parse("2x2x2"), options=options))
