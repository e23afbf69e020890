"""Options of the planner: one frozen dataclass, a comment per field."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    # Tensors with fewer elements than this may be stored replicated; larger ones (except
    # variables, their gradients and optimizer slots) are always stored partitioned.
    replicate_below: int = 0
    # Largest table (entries) one elimination step of the DP may build before it falls back
    # to a beam restriction (the plan is then reported as not proven optimal).
    max_dp_table: int = 2 ** 22
    # States kept per variable by that fallback.
    dp_beam: int = 2
