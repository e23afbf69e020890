"""Every transfer the emitted graph makes: kind, bytes, devices and the op that caused it.

Kinds:
- fetch:   an op reads a region of an input that its device does not store;
- convert: a produced output is stored in a different layout (an all-gather, a re-split);
- reduce:  partial results are combined (reduce-scatter, and the all-gather after it when
           the result is stored replicated);
- feed:    a fed placeholder's share goes to the device that stores it;
- result:  a fetched tensor is assembled on the first device.
Feed and result transfers are outside the step the plan prices (`step_bytes` leaves them
out); the step's bytes equal the plan's prediction (rewrite/pricing.py), per level.

A device reads a region it received before from its own copy, and records nothing. When
one piece (the same node) still goes to a device twice, TensorFlow sends it once: the later
entry is `shared` and moves nothing (`moved_bytes` counts what really crosses devices).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from tofu_tf.search.topology import coordinates

STEP_KINDS = ("fetch", "convert", "reduce")


@dataclass(frozen=True)
class Transfer:
    kind: str
    tensor: str
    op: str            # the op whose input, output or fetch caused it
    src: int
    dst: int
    bytes: int
    shared: bool = False       # served by an earlier identical transfer: moves nothing
    collective: bool = False   # this member's share of a collective (no graph edge)


@dataclass
class Ledger:
    transfers: list[Transfer] = field(default_factory=list)

    def add(self, kind: str, tensor: str, op: str, src: int, dst: int, num_bytes: int,
            shared: bool = False, collective: bool = False) -> None:
        if src != dst and num_bytes > 0:
            self.transfers.append(Transfer(kind, tensor, op, src, dst, int(num_bytes), shared,
                                           collective))

    def total(self, kinds=None) -> int:
        return sum(t.bytes for t in self.transfers if kinds is None or t.kind in kinds)

    @property
    def moved_bytes(self) -> int:
        """Bytes that really cross devices (shared entries move nothing)."""
        return sum(t.bytes for t in self.transfers if not t.shared)

    @property
    def edge_bytes(self) -> int:
        """Bytes on plain cross-device edges (collectives move theirs inside the op)."""
        return sum(t.bytes for t in self.transfers if not t.shared and not t.collective)

    @property
    def step_bytes(self) -> int:
        """Bytes the training step moves between devices (what the plan prices)."""
        return self.total(STEP_KINDS)

    def step_bytes_per_level(self, ways: tuple[int, ...]) -> tuple[int, ...]:
        """Step bytes per topology level (`step_transfers_by_level`)."""
        per_level = [0] * len(ways)
        for level, t in self.step_transfers_by_level(ways):
            per_level[level] += t.bytes
        return tuple(per_level)

    def step_transfers_by_level(self, ways: tuple[int, ...]) -> list[tuple[int, Transfer]]:
        """(level, transfer) per step transfer: each counts at the outermost level at
        which its two devices differ (the link it crosses)."""
        coords = [coordinates(d, ways) for d in range(math.prod(ways))]
        return [(next(i for i, (x, y) in enumerate(zip(coords[t.src], coords[t.dst]))
                      if x != y), t)
                for t in self.transfers if t.kind in STEP_KINDS]

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for t in self.transfers:
            out[t.kind] += t.bytes
        return dict(out)

    def largest(self, count: int = 10) -> list[Transfer]:
        return sorted(self.transfers, key=lambda t: -t.bytes)[:count]
