"""Describe and analyse each distinct op signature once.

Real graphs repeat themselves: the 24 layers of a Transformer, the steps of an unrolled
RNN, the blocks of a ResNet. `SemanticsMemo` keys an op instance by its signature (type,
attrs, shapes, dtypes, constant inputs) and returns the shared Semantics (renamed for the
op) and strategies.
"""

from __future__ import annotations

import itertools

from tofu_tf.op_semantics.analysis import Strategy, analyze
from tofu_tf.op_semantics.registry import Semantics, describe, signature


_IDS = itertools.count()      # signature ids, unique in the process


class SemanticsMemo:
    def __init__(self):
        self._entries: dict[tuple, tuple[Semantics, tuple[Strategy, ...], int]] = {}
        self.hits = 0
        self.misses = 0

    def get(self, name: str, op_type: str, attrs, input_shapes, input_dtypes,
            output_shapes, output_dtypes, constants=None, *, strategies: bool = True
            ) -> tuple[Semantics, tuple[Strategy, ...] | None, int]:
        """(semantics named `name`, strategies, signature id). Equal ids mean equal
        signatures (ids are unique across memos); an int is cheap to hash in later keys.
        `strategies=False` (what a device runs whole needs no split): None in their place
        unless they are known already; analysed when a later call asks."""
        key = signature(op_type, attrs, input_shapes, input_dtypes, output_shapes,
                        output_dtypes, constants)
        cached = self._entries.get(key)
        if cached is None:
            self.misses += 1
            sem = describe(name, op_type, attrs, input_shapes, input_dtypes, output_shapes,
                           output_dtypes, constants)
            cached = self._entries[key] = (sem, analyze(sem) if strategies else None,
                                           next(_IDS))
        else:
            self.hits += 1
            if strategies and cached[1] is None:
                cached = self._entries[key] = (cached[0], analyze(cached[0]), cached[2])
        sem, found, ident = cached
        if sem.op_name != name:
            sem = _renamed(sem, name, attrs)
        return sem, found, ident


def _renamed(sem: Semantics, name: str, attrs) -> Semantics:
    """`dataclasses.replace(sem, op_name=name, attrs=dict(attrs))`, without re-running the
    frozen dataclass's __init__ (a Semantics per op of every catalog)."""
    copy = object.__new__(Semantics)
    copy.__dict__.update(sem.__dict__, op_name=name, attrs=dict(attrs))
    return copy
