"""Pausing Python's cyclic garbage collector around allocation-heavy stages.

Importing and searching a large graph allocate millions of small objects (tuples, specs,
dicts) that form no cycles; the collector's generation scans then cost about a third of the
search (WResNet-152: 5.1 s with it, 3.6 s without). Stages run inside `paused_gc()`; the
previous state is restored afterwards and the next collection reclaims any cycles.

TensorFlow's import leaves some 350,000 objects the collector tracks (its modules,
classes, op definitions), alive for the whole process; every full collection walks them
again (0.13 s each on this project's 2-core machine, one of them often falling at the end
of an import). The first stage that finds TensorFlow imported moves the objects alive then
to the permanent generation (`gc.freeze()`), which collections skip; what it holds is
freed by reference counting as before, only a cycle among those objects is never
collected. Forking after a freeze also keeps the child from touching the parent's pages
(the `gc.freeze` documentation's advice).
"""

from __future__ import annotations

import contextlib
import gc
import sys

_frozen = False


@contextlib.contextmanager
def paused_gc():
    _freeze_tensorflow()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _freeze_tensorflow() -> None:
    global _frozen
    if not _frozen and "tensorflow" in sys.modules:
        _frozen = True
        gc.freeze()
