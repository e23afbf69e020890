"""The two storage policies searched in two processes give the plan of one process."""

import dataclasses
import multiprocessing
import os
import time

import pytest

from tofu_tf import _forking
from tofu_tf.errors import PlanInfeasibleError
from tofu_tf.models import build
from tofu_tf.options import Options, VariableStorage
from tofu_tf.importer.graphdef_io import import_concrete_function
from tofu_tf.search import recursive
from tofu_tf.search.plan import make_plan
from tofu_tf.search.topology import Topology

pytestmark = pytest.mark.skipif(not _forking.available(), reason="the platform cannot fork")


# The fewest-bytes plans (no price on repeated work) replicate the MLP's variables, so
# the partitioned policy's child has a plan to return. The tests that count or alter the
# recursions the policies run leave out the joint search (search/joint.py), which runs
# one more in the parent.
BYTES = Options(flop_bytes=0.0, joint_choices=0)
RECURSION = Options(joint_choices=0)


@pytest.fixture(scope="module")
def graph():
    step = build("mlp", optimizer="momentum", batch_size=8)
    return import_concrete_function(step.concrete_function).graph


@pytest.fixture
def forked(monkeypatch):
    """Every graph counts as large: the partitioned policy runs in a child process."""
    monkeypatch.setattr(recursive, "LARGE_GRAPH_OPS", 0)


def _summary(plan):
    """Everything the plan says but how long its search took."""
    return dataclasses.replace(plan, search_seconds=0.0).to_json()


def _in_the_child(parent: int, then):
    """A _recurse that calls `then()` in the child process and searches in the parent."""
    real = recursive._recurse

    def recurse(*args, **kwargs):
        if os.getpid() != parent:
            then()
        return real(*args, **kwargs)
    return recurse


@pytest.mark.parametrize("shared_reads", [False, True], ids=["plain", "shared_reads"])
@pytest.mark.parametrize("devices", [4, 8])
def test_forked_search_finds_the_sequential_plan(graph, devices, shared_reads, monkeypatch):
    options = Options(shared_reads=shared_reads)
    sequential = make_plan(graph, Topology.default(devices), options=options)
    monkeypatch.setattr(recursive, "LARGE_GRAPH_OPS", 0)
    parallel = make_plan(graph, Topology.default(devices), options=options)
    assert _summary(parallel) == _summary(sequential)


def test_with_shared_reads_each_process_prices_one_plan_without_them(graph, forked,
                                                                     monkeypatch):
    """The plan without views, priced with them, is two candidates (its choices kept, or
    chosen again): the parent searches one, the child the other after its policy."""
    parent, seen, real = os.getpid(), [], recursive._repriced

    def recording(*args, **kwargs):
        if os.getpid() == parent:
            seen.append(kwargs["keeps"])
        return real(*args, **kwargs)

    monkeypatch.setattr(recursive, "_repriced", recording)
    options = dataclasses.replace(BYTES, shared_reads=True, joint_choices=1)
    forked_plan = recursive.search(graph, Topology.default(8), options=options)
    assert seen == [(True,)]
    monkeypatch.setattr(recursive, "LARGE_GRAPH_OPS", 10 ** 9)
    sequential = recursive.search(graph, Topology.default(8), options=options)
    assert seen == [(True,), (True,), (False,)]
    assert forked_plan.objective == sequential.objective


def test_the_partitioned_policy_runs_in_another_process(graph, forked, monkeypatch):
    seen = []
    real = recursive._recurse

    def recording(*args, **kwargs):
        seen.append(args[5])                 # the policy; the child's list is its own
        return real(*args, **kwargs)

    monkeypatch.setattr(recursive, "_recurse", recording)
    result = recursive.search(graph, Topology.default(8), options=BYTES)
    assert result.replicates_variables                 # so the child's result was used
    assert seen == [VariableStorage.REPLICABLE]


def test_a_dead_child_is_replaced_by_a_search_here(graph, forked, monkeypatch):
    sequential = recursive.search(graph, Topology.default(8))
    monkeypatch.setattr(recursive, "_recurse",
                        _in_the_child(os.getpid(), lambda: os._exit(3)))
    result = recursive.search(graph, Topology.default(8))
    assert (result.total_bytes, result.variable_storage) == \
        (sequential.total_bytes, sequential.variable_storage)


def test_an_error_in_the_child_reaches_the_caller_whole(graph, forked, monkeypatch):
    def fail():
        raise PlanInfeasibleError("no plan", node="x", fix="y", best_peak_bytes=7)

    monkeypatch.setattr(recursive, "_recurse", _in_the_child(os.getpid(), fail))
    with pytest.raises(PlanInfeasibleError) as caught:
        recursive.search(graph, Topology.default(8), options=BYTES)
    assert (caught.value.node, caught.value.fix, caught.value.best_peak_bytes) == ("x", "y", 7)


def test_the_child_is_not_waited_for_when_its_policy_cannot_win(graph, forked, monkeypatch):
    """With every tensor replicable, the replicable plan is the partitioned one's too."""
    options = Options(replicate_below=10 ** 9)
    sequential = recursive.search(graph, Topology.default(8), options=options)
    assert not sequential.replicates_variables
    monkeypatch.setattr(recursive, "_recurse", _in_the_child(os.getpid(), lambda: os._exit(3)))
    result = recursive.search(graph, Topology.default(8), options=options)
    assert result.total_bytes == sequential.total_bytes


def test_a_plan_from_the_child_gets_its_last_level_back(graph, forked, monkeypatch):
    """The child's result crosses the pipe without its last level's model; when it wins,
    the model is rebuilt from its levels: what one device holds is what a search of that
    policy here finds."""
    parent, real = os.getpid(), recursive._recurse

    def costly_here(*args, **kwargs):             # make the parent's policy lose
        result = real(*args, **kwargs)
        if os.getpid() != parent:
            return result
        levels = tuple(dataclasses.replace(level, bytes=level.bytes * 10)
                       for level in result.levels)
        return dataclasses.replace(result, levels=levels, replicates_variables=True)

    monkeypatch.setattr(recursive, "_recurse", costly_here)
    result = recursive.search(graph, Topology.default(8), options=RECURSION)
    monkeypatch.undo()
    here = recursive.search(graph, Topology.default(8), options=dataclasses.replace(
        RECURSION, variable_storage=VariableStorage.PARTITIONED))
    assert result.variable_storage is VariableStorage.PARTITIONED and result.last is not None
    device, expected = (recursive.device_problem(*r.last) for r in (result, here))
    assert {n: t.shape for n, t in device.tensors.items()} == \
        {n: t.shape for n, t in expected.tensors.items()}
    assert result.memory == here.memory


@pytest.mark.parametrize("replicate_below", [0, 10 ** 9])
def test_the_child_is_not_left_behind(graph, forked, replicate_below):
    """The child is not waited for after its answer (or when it is not needed), but it
    ends and is reaped: no process outlives the search for long."""
    recursive.search(graph, Topology.default(8), options=Options(replicate_below=replicate_below))
    deadline = time.monotonic() + 30
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not multiprocessing.active_children()
