"""The one topological order every stage uses."""

from __future__ import annotations

import heapq
from typing import Iterable, Sequence


def stable_topological_order(preds: Sequence[Iterable[int]]) -> list[int]:
    """Indices 0..n-1 (each with its predecessors' indices) in a topological order, ties
    broken by index: an order that is already topological is kept as it is. Indices on a
    cycle, and those after one, are left out (callers compare lengths)."""
    users: list[list[int]] = [[] for _ in preds]
    indegree = [0] * len(preds)
    for i, ps in enumerate(preds):
        ps = set(ps)
        indegree[i] = len(ps)
        for p in ps:
            users[p].append(i)
    ready = [i for i, n in enumerate(indegree) if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indegree[u] -= 1
            if indegree[u] == 0:
                heapq.heappush(ready, u)
    return order
