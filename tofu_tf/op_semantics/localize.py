"""How one part of a split op runs with the op's own kernel.

`localize(sem, strategy, k, part)` returns a `LocalOp`: which slice of each input the part
fetches, what padding is added around it (a halo reaching past the tensor's edge reads the
description's fill value), the attrs and constant inputs of the local op, and the crop
that turns the local op's outputs into the part's share. The rewriter emits exactly this,
the validator runs exactly this, and the cost model counts bytes from exactly this.

The default keeps the op type, attrs and constants, and fetches the derived regions. An op
type whose local kernel needs more (a VALID convolution over an explicitly padded halo, a
Reshape to the local shape) registers a `localize=` hook next to its description; a hook
may narrow input slices, never widen them past the derived regions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from tofu_tf.errors import PartitionError
from tofu_tf.op_semantics.analysis import Strategy, clamp_slices, replicated_regions
from tofu_tf.op_semantics.registry import Semantics, description

Slices = tuple[tuple[int, int], ...]          # half-open [start, stop) per dim


@dataclass(frozen=True)
class LocalOp:
    """What part `part` of a k-way split runs."""
    op_type: str
    attrs: Mapping[str, Any]
    input_slices: tuple[Slices | None, ...]     # clamped slice to fetch; None: meta/unused
    input_pads: tuple[Slices | None, ...]       # (before, after) per dim around the slice
    input_fills: tuple[float | None, ...]
    const_inputs: Mapping[int, np.ndarray]      # local value of each meta input
    output_slices: tuple[Slices, ...]           # the part's share of each output (global)
    output_crops: tuple[Slices | None, ...]     # crop of the local result to that share
    output_scales: tuple[float, ...]            # factor before combining a Partial output

    def local_input_shape(self, index: int) -> tuple[int, ...] | None:
        sl, pad = self.input_slices[index], self.input_pads[index]
        if sl is None:
            return None
        pad = pad if pad is not None else ((0, 0),) * len(sl)
        return tuple(b - a + p0 + p1 for (a, b), (p0, p1) in zip(sl, pad))


@dataclass(frozen=True)
class LocalContext:
    """What a localize hook may read."""
    sem: Semantics
    strategy: Strategy | None
    k: int
    part: int
    requested: tuple[Slices | None, ...]        # unclamped regions per input

    @property
    def part_range(self) -> tuple[int, int]:
        return self.strategy.part(self.k, self.part)

    def output_shape(self, index: int) -> tuple[int, ...]:
        """The shape of the part's share of output `index`."""
        return tuple(b - a for a, b in _output_slices(self.sem, self.strategy, self.k,
                                                      self.part)[index])


def _output_slices(sem: Semantics, strategy: Strategy | None, k: int, part: int
                   ) -> tuple[Slices, ...]:
    out = []
    for i, shape in enumerate(sem.output_shapes):
        full = [(0, d) for d in shape]
        if strategy is not None and strategy.outputs[i].kind == "split":
            lo, hi = strategy.part(k, part)
            full[strategy.outputs[i].dim] = (lo, hi + 1)
        out.append(tuple(full))
    return tuple(out)


def _pads(requested: Slices, clamped: Slices) -> Slices:
    return tuple((ca - ra, rb - cb) for (ra, rb), (ca, cb) in zip(requested, clamped))


def default_local_op(sem: Semantics, strategy: Strategy | None, k: int, part: int
                     ) -> tuple[LocalOp, tuple[Slices | None, ...]]:
    """The local op before any hook: same kernel, derived regions; and the unclamped
    regions per input (a hook's `LocalContext.requested`)."""
    if strategy is not None:
        regions = strategy.inputs
        lo, hi = strategy.part(k, part)
    else:
        regions, lo, hi = replicated_regions(sem), 0, 0
    n_in = len(regions)
    requested, slices = [None] * n_in, [None] * n_in
    pads, fills = [None] * n_in, [None] * n_in
    for i, (region, shape) in enumerate(zip(regions, sem.input_shapes)):
        if region.kind != "data":
            continue
        req = requested[i] = region.requested(lo, hi, shape)
        clamped = slices[i] = clamp_slices(req, shape)
        fill = fills[i] = region.fill
        pads[i] = _pads(req, clamped) if fill is not None else ((0, 0),) * len(shape)
    n_out = len(sem.output_shapes)
    scales = (1.0,) * n_out
    if strategy is not None and strategy.outputs:
        scales = tuple((hi - lo + 1) / strategy.extent if state.reducer == "mean" else 1.0
                       for state in strategy.outputs)
    local = LocalOp(sem.op_type, dict(sem.attrs), tuple(slices), tuple(pads), tuple(fills),
                    {}, _output_slices(sem, strategy, k, part), (None,) * n_out, scales)
    return local, tuple(requested)


def localize(sem: Semantics, strategy: Strategy | None, k: int, part: int) -> LocalOp:
    """The local op of part `part` (strategy None: an unsplit copy of the op)."""
    local, requested = default_local_op(sem, strategy, k, part)
    desc = description(sem.op_type)
    hook = desc.localize if desc is not None else None
    if hook is not None:
        derived = local.input_slices          # tuples: the hook cannot change them in place
        local = hook(LocalContext(sem, strategy, k, part, requested), local)
        _check_narrowed(sem, local.input_slices, derived)
    return local


def _check_narrowed(sem: Semantics, slices, derived) -> None:
    for i, (got, allowed) in enumerate(zip(slices, derived)):
        if got is None or allowed is None:
            continue
        for (a, b), (lo, hi) in zip(got, allowed):
            if b > a and (a < lo or b > hi):
                raise PartitionError(
                    f"the localize hook widened input {i} to [{a}, {b}) beyond the derived "
                    f"[{lo}, {hi}).", node=sem.op_name, op_type=sem.op_type,
                    fix="widen the region in the TDL description instead.")


_FIELDS = frozenset(field.name for field in dataclasses.fields(LocalOp))


def replace(local: LocalOp, **changes: Any) -> LocalOp:
    """dataclasses.replace, for hooks (without re-running the frozen __init__: a hook
    runs per part of every strategy at every level)."""
    unknown = set(changes) - _FIELDS
    if unknown:
        raise TypeError(f"LocalOp has no field(s) {', '.join(sorted(unknown))}")
    copy = object.__new__(LocalOp)
    copy.__dict__.update(local.__dict__, **changes)
    return copy
