"""Topologies: default factorisation for any device count, parsing, coordinates."""

import pytest

from tofu_tf.errors import PlanInfeasibleError
from tofu_tf.search.topology import Topology


@pytest.mark.parametrize("n,ways", [(2, (2,)), (3, (3,)), (6, (3, 2)), (7, (7,)),
                                    (8, (2, 2, 2)), (12, (3, 2, 2)), (16, (2, 2, 2, 2))])
def test_default_factorises_any_device_count(n, ways):
    topology = Topology.default(n)
    assert topology.ways == ways and topology.num_devices == n


@pytest.mark.parametrize("bad", [0, 1, -4])
def test_too_few_devices_is_a_typed_error(bad):
    with pytest.raises(PlanInfeasibleError, match="at least 2"):
        Topology.default(bad)


def test_parse_and_coordinates():
    topology = Topology.parse("2@12e9x4@300e9")
    assert topology.ways == (2, 4) and topology.levels[1].bandwidth == 300e9
    assert [topology.coordinates(d) for d in (0, 3, 4, 7)] == [(0, 0), (0, 3), (1, 0), (1, 3)]
    assert all(topology.device(topology.coordinates(d)) == d for d in range(8))
    assert topology.common_level(1, 2) == 1 and topology.common_level(1, 5) == 0
    with pytest.raises(PlanInfeasibleError, match="cannot read"):
        Topology.parse("2xfour")


def test_hosts_cut_across_hosts_first_and_name_each_device():
    topology = Topology.hosts(2, 4, inter=(1e9, 1e-4), intra=(300e9, 1e-6))
    assert topology.ways == (2, 2, 2) and topology.num_devices == 8
    assert topology.levels[0].bandwidth == 1e9 and topology.levels[1].bandwidth == 300e9
    assert topology.num_hosts == 2
    names = topology.device_names("gpu")
    assert names[0] == "/job:worker/replica:0/task:0/device:GPU:0"
    assert names[3] == "/job:worker/replica:0/task:0/device:GPU:3"
    assert names[4] == "/job:worker/replica:0/task:1/device:GPU:0"
    assert len(set(names)) == 8
    # transfers between hosts cross level 0, within a host an inner level
    assert topology.common_level(0, 4) == 0 and topology.common_level(0, 3) == 1
    one_host = Topology.hosts(1, 6)
    assert one_host.ways == (3, 2) and one_host.host_levels == 0
    assert one_host.device_names()[5] == "/job:localhost/replica:0/task:0/device:CPU:5"
    assert Topology.parse("4x8").with_hosts().device_names()[9].endswith("task:1/device:CPU:1")
    with pytest.raises(PlanInfeasibleError):
        Topology.hosts(0, 4)


@pytest.mark.parametrize("model,lookahead", [("mlp", False), ("transformer", False),
                                             ("wresnet", False), ("transformer", True)])
def test_time_objective_never_predicts_slower_transfers_than_bytes(model, lookahead):
    """Whatever plans the bytes objective weighs (with the lookahead, one more), the time
    objective weighs too, by their predicted transfer time."""
    from tofu_tf.options import Objective, Options
    from tofu_tf.search.plan import make_plan
    from tests.search.test_search import graph_of
    graph = graph_of(model, "adam")
    topology = Topology.hosts(2, 4, inter=(1e9, 1e-4), intra=(300e9, 1e-6))
    by_bytes = make_plan(graph, topology, options=Options(objective=Objective.BYTES,
                                                          lookahead=lookahead))
    by_time = make_plan(graph, topology, options=Options(objective=Objective.TIME,
                                                         lookahead=lookahead))
    assert by_time.transfer_seconds <= by_bytes.transfer_seconds
    assert by_bytes.total_bytes <= by_time.total_bytes
    # the first level crosses the slow links: its bytes dominate the predicted time
    assert by_time.levels[0].seconds(8) >= by_time.levels[1].seconds(8)


def test_hosts_are_cut_by_prime_factors_too():
    topology = Topology.hosts(4, 8)
    assert topology.ways == (2, 2, 2, 2, 2) and topology.host_levels == 2
    assert topology.num_hosts == 4
    names = topology.device_names()
    assert names[8] == "/job:worker/replica:0/task:1/device:CPU:0"
    assert names[31] == "/job:worker/replica:0/task:3/device:CPU:7"
