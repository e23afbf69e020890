"""Device topologies: a sequence of levels, each splitting every group k ways.

A Topology of levels (k1, b1), (k2, b2), ... has k1*k2*... devices. Level 1 is the
outermost cut: it splits all devices into k1 groups and its transfers cross the slowest
links (bandwidth b1, latency a1); level 2 splits each group k2 ways, and so on. A device
is numbered row-major by its coordinates (p1, p2, ...), p1 most significant, so the
devices of one level-1 group are contiguous.

`Topology.default(n)` factorises n into primes (largest first: the first cut, which
moves the least data in a recursive plan, gets the largest fan-out) on one uniform
machine; `Topology.parse("2x4")` reads an explicit shape, optionally with bandwidths
(`"2@12.5e9x4@300e9"`, bytes/s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tofu_tf.errors import PlanInfeasibleError

# Default link figures for levels that do not state them (one host, PCIe 3.0 x16):
DEFAULT_BANDWIDTH = 12.0e9     # bytes per second
DEFAULT_LATENCY = 10.0e-6      # seconds per transfer
# ... and between hosts (100 Gb/s Ethernet or InfiniBand EDR):
DEFAULT_INTER_HOST = (12.5e9, 20.0e-6)


@dataclass(frozen=True)
class Level:
    """One cut of the device hierarchy."""
    ways: int
    bandwidth: float = DEFAULT_BANDWIDTH     # bytes per second across this level's links
    latency: float = DEFAULT_LATENCY         # seconds per collective or transfer
    name: str = ""

    def __str__(self) -> str:
        return f"{self.ways}" + (f"({self.name})" if self.name else "")


def prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    if n > 1:
        factors.append(n)
    return factors


def coordinates(device: int, ways: tuple[int, ...]) -> tuple[int, ...]:
    """(p1, p2, ...) of a device index over levels of `ways`, p1 most significant."""
    coords = []
    for k in reversed(ways):
        device, p = divmod(device, k)
        coords.append(p)
    return tuple(reversed(coords))


def coordinates_index(coords: tuple[int, ...], ways: tuple[int, ...]) -> int:
    """The row-major index of `coords` over levels of `ways` (inverse of `coordinates`)."""
    index = 0
    for p, k in zip(coords, ways):
        index = index * k + p
    return index


@dataclass(frozen=True)
class Topology:
    levels: tuple[Level, ...]
    # How many leading levels cut across hosts: their coordinates pick the host (the
    # task of job `worker`), the rest the device within it. 0: one host.
    host_levels: int = 0

    def __post_init__(self):
        if not self.levels or any(level.ways < 2 for level in self.levels):
            raise PlanInfeasibleError(
                f"a topology needs at least one level and every level at least 2 ways, "
                f"got {[lvl.ways for lvl in self.levels]}.",
                fix="use Topology.default(n) for n >= 2 devices.")

    @staticmethod
    def default(num_devices: int, bandwidth: float = DEFAULT_BANDWIDTH,
                latency: float = DEFAULT_LATENCY) -> "Topology":
        if not isinstance(num_devices, int) or num_devices < 2:
            raise PlanInfeasibleError(
                f"num_devices={num_devices!r}: partitioning needs at least 2 devices.",
                fix="pass num_devices >= 2 (with 1 device, run the graph unchanged).")
        ways = sorted(prime_factors(num_devices), reverse=True)
        return Topology(tuple(Level(k, bandwidth, latency) for k in ways))

    @staticmethod
    def hosts(hosts: int, devices_per_host: int, *,
              inter: tuple[float, float] = DEFAULT_INTER_HOST,
              intra: tuple[float, float] = (DEFAULT_BANDWIDTH, DEFAULT_LATENCY)
              ) -> "Topology":
        """`hosts` machines of `devices_per_host` devices: the first cuts across the hosts
        (links of `inter` = (bytes/s, seconds per transfer)), then the devices of one host,
        each count cut by its prime factors, largest first (links of `intra`). Prime cuts
        leave the recursion the most freedom (each level picks its own dims)."""
        for n, what in ((hosts, "hosts"), (devices_per_host, "devices per host")):
            if not isinstance(n, int) or n < 1:
                raise PlanInfeasibleError(f"{what}={n!r} is not a positive count.",
                                          fix="pass whole numbers, e.g. hosts(2, 4).")
        levels = [Level(k, *inter, name="hosts")
                  for k in sorted(prime_factors(hosts), reverse=True)]
        host_levels = len(levels)
        levels += [Level(k, *intra, name="devices")
                   for k in sorted(prime_factors(devices_per_host), reverse=True)]
        return Topology(tuple(levels), host_levels=host_levels)

    def with_hosts(self, host_levels: int = 1) -> "Topology":
        """This topology with its first `host_levels` levels across hosts."""
        if not 0 <= host_levels <= len(self.levels):
            raise PlanInfeasibleError(
                f"{host_levels} host levels in a topology of {len(self.levels)} levels.",
                fix="mark at most as many levels as the topology has.")
        return Topology(self.levels, host_levels)

    @property
    def num_hosts(self) -> int:
        return math.prod(level.ways for level in self.levels[:self.host_levels])

    def device_names(self, kind: str = "CPU", job: str = "worker") -> tuple[str, ...]:
        """One TensorFlow device name per device index: on one host
        `/job:localhost/replica:0/task:0/device:KIND:i`; across hosts
        `/job:JOB/replica:0/task:HOST/device:KIND:LOCAL`."""
        kind = kind.upper()
        if not self.host_levels:
            return tuple(f"/job:localhost/replica:0/task:0/device:{kind}:{d}"
                         for d in range(self.num_devices))
        local_ways = self.ways[self.host_levels:]
        names = []
        for d in range(self.num_devices):
            coords = self.coordinates(d)
            host = coordinates_index(coords[:self.host_levels], self.ways[:self.host_levels])
            local = coordinates_index(coords[self.host_levels:], local_ways)
            names.append(f"/job:{job}/replica:0/task:{host}/device:{kind}:{local}")
        return tuple(names)

    @staticmethod
    def parse(text: str) -> "Topology":
        """'2x4' or '2@12e9x4@300e9' (ways@bandwidth per level, outermost first)."""
        levels = []
        for item in text.lower().replace(" ", "").split("x"):
            ways, _, bandwidth = item.partition("@")
            try:
                levels.append(Level(int(ways), float(bandwidth) if bandwidth
                                    else DEFAULT_BANDWIDTH))
            except ValueError:
                raise PlanInfeasibleError(f"cannot read topology '{text}'.",
                                          fix="write levels as WAYS[@BYTES_PER_S] joined "
                                              "by 'x', e.g. '2x4' or '2@12e9x4@300e9'.") from None
        return Topology(tuple(levels))

    @property
    def num_devices(self) -> int:
        return math.prod(level.ways for level in self.levels)

    @property
    def ways(self) -> tuple[int, ...]:
        return tuple(level.ways for level in self.levels)

    def coordinates(self, device: int) -> tuple[int, ...]:
        """(p1, p2, ...) of a device index, p1 most significant."""
        return coordinates(device, self.ways)

    def device(self, coordinates: tuple[int, ...]) -> int:
        return coordinates_index(coordinates, self.ways)

    def common_level(self, a: int, b: int) -> int:
        """The level whose links a transfer between devices a and b crosses (0-based):
        the first level at which their coordinates differ."""
        for level, (pa, pb) in enumerate(zip(self.coordinates(a), self.coordinates(b))):
            if pa != pb:
                return level
        return len(self.levels)

    def __str__(self) -> str:
        return "x".join(str(level) for level in self.levels)


def check_fits(graph, topology: Topology) -> None:
    """Raises `PlanInfeasibleError` when even the graph's largest tensor has fewer elements
    than the topology has devices: no plan could give every device a part of anything."""
    sizes = {name: math.prod(t.shape) for name, t in graph.tensors.items()
             if not t.is_resource}
    if not sizes:
        return
    largest = max(sizes, key=lambda name: (sizes[name], name))
    if sizes[largest] < topology.num_devices:
        op = graph.producer(largest)
        raise PlanInfeasibleError(
            f"its output {largest} of shape {list(graph.tensors[largest].shape)} is the "
            f"largest tensor of the graph and has {sizes[largest]} elements, fewer than the "
            f"{topology.num_devices} devices: some devices would hold nothing at all.",
            node=op.name, op_type=op.type,
            fix=f"use at most {max(sizes[largest], 1)} devices, or a larger batch or model.")
