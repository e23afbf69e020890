"""Combining partial results across devices, level by level, as the plan prices it.

An output produced Partial at a set of levels Λ is summed over each reduction group (the
devices that differ only at levels of Λ; they produced the same region D). Every device d
has a target box T_d: D cut, outermost level first, at each level of Λ by the tensor's
state there — Split(dim): the stored part; Replicated: a chunk on the largest dim (the
whole for one chunk when nothing can be chunked, as a tree does).

1. reduce-scatter, innermost level of Λ first: the k members that differ only at that level
   each keep the pieces destined to their own side and receive the others' copies of them:
   (k - 1) |R| bytes per member set, R the region the set is responsible for;
2. all-gather, outermost level first, at the levels whose state is Replicated: members
   exchange their pieces, (k - 1) |R| again.

Per level this is the plan's (k - 1) |domain| x (2 replicated | 1 split): a ring all-reduce
or reduce-scatter along the hierarchy, the outer links carrying each element once. A small
replicated partial result (partition.exchanges: a bias gradient, a norm's scale) is reduced
by exchange: at each level every member receives its partners' whole copies and combines
them, fewer messages and no slices for a few more bytes. On
logical CPU devices the pieces travel as plain cross-device edges (TensorFlow's Send/Recv);
sums run in a fixed member order, so replicas hold bit-identical values.
"""

from __future__ import annotations

from tensorflow.core.framework import types_pb2

from tofu_tf.errors import RewriteError
from tofu_tf.rewrite.nodedefs import Ref, str_attr, type_attr
from tofu_tf.rewrite.partition import (Box, all_reduces, exchanges, parse_state,
                                      reduce_target)
from tofu_tf.search.cost import box_volume


def reduce_all(em, t: str, op: str) -> dict[int, dict[Box, Ref]]:
    """Per device: {target box: reduced tensor} that the device holds after reducing."""
    levels, reducer = em.partial[t]
    levels = tuple(sorted(levels))
    states = [parse_state(s) for s in em.plan_states(t)]
    if all_reduces(em.use_v2, reducer, levels, states):
        return _all_reduce_v2(em, t, op, levels, reducer)
    if exchanges(levels, states, [value.box for value in em.produced[t]], em.itemsize(t)):
        return _exchange(em, t, op, levels, reducer)
    held: dict[int, dict[Box, Ref]] = {}
    targets: dict[int, Box | None] = {}
    for d in range(em.n):
        produced = em.produced[t][d].box
        targets[d] = reduce_target(produced, levels, states, em.parts.coordinates(d),
                                   em.parts.ways)
    # Every device starts with its (scaled) partial result of D, cut into the targets
    # of its group: pieces are keyed by the target's owner.
    pieces: dict[int, dict[int, Ref]] = {}
    for d in range(em.n):
        group = em.parts.group(d, levels)
        pieces[d] = {e: em._cut(em.produced[t][d], targets[e], d) for e in group
                     if targets[e] is not None}
    for level in reversed(levels):                         # reduce-scatter, inner first
        new: dict[int, dict[int, Ref]] = {}
        for d in range(em.n):
            members = em.parts.group(d, (level,))
            mine = {e for e in pieces[d] if em.parts.coordinates(e)[level]
                    == em.parts.coordinates(d)[level]}
            new[d] = {}
            for e in sorted(mine):
                terms = []
                for m in members:
                    terms.append(pieces[m][e])
                    em.send("reduce", t, op, pieces[m][e], m, d, targets[e])
                new[d][e] = _combine(em, t, terms, reducer, d)
        pieces = new
    for level in levels:                                   # all-gather where replicated
        if states[level].kind != "replicated":
            continue
        new = {d: dict(p) for d, p in pieces.items()}
        for d in range(em.n):
            boxes = {targets[e] for e in new[d]}
            for m in em.parts.group(d, (level,)):
                for e, tensor in pieces[m].items():
                    if e in new[d] or targets[e] in boxes:     # held, or an equal box
                        continue
                    # The copy is an Identity on d: the edge the ledger records is in the
                    # graph whether or not d's ops read this piece later.
                    em.send("reduce", t, op, tensor, m, d, targets[e])
                    new[d][e] = em.out.identity(
                        tensor, d, em._name(t.replace(":", "_") + "/gathered"))
                    boxes.add(targets[e])
        pieces = new
    for d in range(em.n):
        held[d] = {targets[e]: tensor for e, tensor in pieces[d].items()}
    return held


def _exchange(em, t: str, op: str, levels, reducer: str) -> dict[int, dict[Box, Ref]]:
    """A small partial result (partition.exchanges): at each level, innermost first, every
    member combines all members' current copies in member order (so replicas stay
    bit-identical), each copy it lacks arriving over one edge."""
    current = {d: em.produced[t][d].tensor for d in range(em.n)}
    for level in reversed(levels):
        new = {}
        for d in range(em.n):
            box = em.produced[t][d].box
            members = em.parts.group(d, (level,))
            for m in members:
                if m != d:
                    em.send("reduce", t, op, current[m], m, d, box)
            new[d] = _combine(em, t, [current[m] for m in members], reducer, d)
        current = new
    return {d: {em.produced[t][d].box: current[d]} for d in range(em.n)}


V2_MERGE = {"sum": "Add", "mean": "Add", "max": "Max", "min": "Min", "prod": "Mul"}


def _all_reduce_v2(em, t: str, op: str, levels, reducer: str) -> dict[int, dict]:
    """One CollectiveReduceV2 per reduction group (a ring all-reduce over its devices,
    NCCL on GPUs): 2 (g - 1) / g of the region per member, as the levels' sum prices it."""
    held: dict[int, dict] = {}
    done: set[int] = set()
    for d in range(em.n):
        if d in done:
            continue
        group = em.parts.group(d, levels)
        done.update(group)
        key = em.collective_keys(group)
        for m in group:
            value = em.produced[t][m]
            reduced = _collective_reduce(em, value.tensor, len(group), key, reducer, m,
                                         em._name(t.replace(":", "_") + "/all_reduce"))
            em.collective_ops.append(reduced.node)
            size = len(group)
            em.ledger.add("reduce", t, op, group[(group.index(m) - 1) % size], m,
                          2 * (size - 1) * box_volume(value.box) * em.itemsize(t) // size,
                          collective=True)
            held[m] = {value.box: reduced}
    return held


def _collective_reduce(em, tensor: Ref, size: int, key: tuple[int, int], reducer: str,
                       d: int, name: str) -> Ref:
    """A CollectiveReduceV2 member on device d (no ordering token: the graph runs in a
    Session or wrap_function, not in a tf.function)."""
    attrs = {"T": type_attr(tensor.dtype), "merge_op": str_attr(V2_MERGE[reducer]),
             "final_op": str_attr("Id"), "communication_hint": str_attr(em.communication_hint)}
    inputs = (tensor, *(em.out.const(v, types_pb2.DT_INT32, d, "collective")
                        for v in (size, *key)))
    return em.out.node("CollectiveReduceV2", name, d, inputs, attrs, [tensor.shape],
                       [tensor.dtype])[0]


COMBINE = {"max": "Maximum", "min": "Minimum", "prod": "Mul"}


def _combine(em, t: str, terms: list[Ref], reducer: str, d: int) -> Ref:
    """The terms combined on device d, in the given order."""
    if len(terms) == 1:
        return terms[0]
    name = em._name(t.replace(":", "_") + "/reduce")
    if reducer in ("sum", "mean"):
        return em.out.add_n(terms, d, name)
    if reducer not in COMBINE:
        raise RewriteError(f"no combiner for partial results reduced by '{reducer}'.",
                           node=t)
    result = terms[0]
    for term in terms[1:]:
        result = em.out.binary(COMBINE[reducer], result, term, d,
                               em._name(t.replace(":", "_") + "/" + COMBINE[reducer]))
    return em.out.identity(result, d, name)
