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
