"""Combining partial results across devices, level by level, as the plan prices it.

An output produced Partial at a set of levels Λ is summed over each reduction group (the
devices that differ only at levels of Λ; they produced the same region D). Where the op
ran replicated at levels inside Λ's outermost (partition.replica_levels: the copies there
are equal), those levels join the cut and each copy reduces only its slice. Every device d
has a target box T_d: D cut, outermost level first, at each of these levels by the
tensor's state there — Split(dim): what the side stores of D (the box cut evenly where
that is not one range); Replicated: a chunk on the largest dim (the whole for one chunk
when nothing can be chunked, as a tree does). Where an op split on another dim above
produced past its group's part along dim, D's slabs would not be one range per side:
the reduction then runs once per range the outer levels cut along dim
(partition.reduce_regions), so every reduced element lands where it is stored.

1. reduce-scatter, innermost level first: the k members that differ only at a level of Λ
   each keep the pieces destined to their own side and receive the others' copies of them:
   (k - 1) |R| bytes per member set, R the region the set is responsible for; at a replica
   level each member keeps its own side's pieces of its copy, moving nothing;
2. all-gather, outermost level first, at the levels whose state is Replicated: members
   exchange their pieces, (k - 1) |R| again.

Per level of Λ this is the plan's (k - 1) |domain| x (2 replicated | 1 split): a ring
all-reduce or reduce-scatter along the hierarchy, the outer links carrying each element
once; at a Replicated replica level, the (k - 1) |stored part| the search prices where the
op produces a reduced output replicated (search/problem.py, ProblemOp.reduced). A small
replicated partial result (partition.exchanges: a bias gradient, a norm's scale) is reduced
by exchange, level by level (partition.exchange_rounds): fewer messages and no slices. With
V2 collectives (partition.all_reduces) each reduction group all-reduces its members' slices
in one CollectiveReduceV2 (a flat ring over all its levels), gathered as above. On
logical CPU devices the pieces travel as plain cross-device edges (TensorFlow's Send/Recv);
sums run in a fixed member order, so replicas hold bit-identical values.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorflow.core.framework import types_pb2

from tofu_tf.errors import RewriteError
from tofu_tf.rewrite.nodedefs import Ref, str_attr, type_attr
from tofu_tf.rewrite.partition import (Box, all_reduces, contains, exchange_rounds,
                                      exchanges, parse_state, reduce_regions, reduce_target,
                                      replica_levels)
from tofu_tf.search.cost import box_volume


def reduce_all(em, t: str, op: str) -> dict[int, dict[Box, Ref]]:
    """Per device: {target box: reduced tensor} that the device holds after reducing."""
    levels, reducer = em.partial[t]
    levels = tuple(sorted(levels))
    states = [parse_state(s) for s in em.plan_states(t)]
    boxes = [value and value.box for value in em.produced[t]]
    replicas = replica_levels(em.parts, levels, boxes)
    active = em.active(t)
    # collectives reduce numbers: booleans are combined by logical ops (_combine)
    if em.graph.tensors[t].dtype != "bool" and all_reduces(em.use_v2, reducer, levels,
                                                          states):
        targets = _targets(em, t, [box if d in active else None
                                   for d, box in enumerate(boxes)], replicas, states)
        pieces = _all_reduce_v2(em, t, op, levels, reducer, targets)
        return _gathered(em, t, op, pieces, replicas, states, targets)
    if exchanges(levels, states, boxes, em.itemsize(t), replicas):
        return _exchange(em, t, op, levels, reducer, replicas)
    cut = tuple(sorted(levels + replicas))
    held: dict[int, dict[Box, Ref]] = {}
    for within in reduce_regions(boxes, cut, states, em.parts.ways,
                                 em.graph.tensors[t].shape):
        for d, pieces in _reduce(em, t, op, within, cut, levels, reducer, states).items():
            held.setdefault(d, {}).update(pieces)
    return held


def _reduce(em, t: str, op: str, boxes, cut, levels, reducer: str, states
            ) -> dict[int, dict[Box, Ref]]:
    """One reduction (partition.reduce_regions) of the produced `boxes` (per device):
    the reduce-scatter over `cut`, then the all-gather."""
    coordinates = em.parts.coordinates
    active = [d for d in em.active(t) if boxes[d] is not None]
    targets = _targets(em, t, [box if d in active else None for d, box in enumerate(boxes)],
                       cut, states)
    # Every device starts with its (scaled) partial result of D, cut into the targets of
    # its group: pieces are (owners, box, tensor), a run of owners whose targets tile one
    # box sharing a piece.
    pieces: dict[int, list[tuple[tuple[int, ...], Box, Ref]]] = {}
    for d in active:
        owners = tuple(e for e in em.parts.group(d, cut) if targets[e] is not None)
        produced = em.produced[t][d]
        pieces[d] = [(run, _union(run, targets), em._cut(produced, _union(run, targets), d))
                     for run in _runs(owners, targets, [[(owners, boxes[d], None)]])]
    for level in reversed(cut):                            # reduce-scatter, inner first
        new = {}
        for d in active:
            members = em.parts.group(d, (level,)) if level in levels else (d,)
            mine = tuple(e for owners, _, _ in pieces[d] for e in owners
                         if coordinates(e)[level] == coordinates(d)[level])
            new[d] = []
            for run in _runs(mine, targets, [pieces[m] for m in members]):
                box = _union(run, targets)
                terms = []
                for m in members:       # a replica level: d's own copy of its side
                    part = _part(em, pieces[m], box, m)
                    if m != d:
                        em.send("reduce", t, op, part, m, d, box)
                    terms.append(part)
                new[d].append((run, box, _combine(em, t, terms, reducer, d)))
        pieces = new
    return _gathered(em, t, op, pieces, cut, states, targets)


def _targets(em, t: str, boxes, cut, states) -> dict[int, Box | None]:
    """Each device's share (partition.reduce_target) of its produced box over `cut`
    (None where it has none)."""
    return {d: None if box is None else reduce_target(
        box, cut, states, em.parts.coordinates(d), em.parts.ways, em.graph.tensors[t].shape)
        for d, box in enumerate(boxes)}


def _gathered(em, t: str, op: str, pieces, levels, states, targets
              ) -> dict[int, dict[Box, Ref]]:
    """Per device {box: tensor} after the all-gather at the `levels` whose state is
    Replicated, outermost first."""
    for level in levels:
        if states[level].kind == "replicated":
            pieces = {d: _gather(em, t, op, pieces, d, level, targets) for d in pieces}
    return {d: {box: tensor for _, box, tensor in held} for d, held in pieces.items()}


@dataclass(frozen=True)
class _Held:
    tensor: Ref
    box: Box


def _union(owners, targets) -> Box | None:
    """The box the owners' targets tile exactly (they are disjoint), or None."""
    boxes = [targets[e] for e in owners]
    if not boxes:
        return None
    bound = tuple((min(b[k][0] for b in boxes), max(b[k][1] for b in boxes))
                  for k in range(len(boxes[0])))
    return bound if sum(map(box_volume, boxes)) == box_volume(bound) else None


def _runs(owners, targets, member_pieces) -> list[tuple[int, ...]]:
    """The owners as one run when their targets tile a box that one piece of every member
    holds, else one run each."""
    box = _union(owners, targets) if owners else None
    if box is not None and all(any(contains(held, box) for _, held, _ in pieces)
                               for pieces in member_pieces):
        return [tuple(owners)]
    return [(e,) for e in owners]


def _part(em, pieces, box: Box, m: int) -> Ref:
    """`box` cut on device m from the piece of m's that holds it."""
    held = next((tensor, b) for _, b, tensor in pieces if contains(b, box))
    return em._cut(_Held(*held), box, m)


def _gather(em, t: str, op: str, pieces, d: int, level: int, targets):
    """d's pieces after the all-gather at `level`: each member's pieces of owners d lacks
    (by distinct box) arrive, and pieces that tile a box are concatenated on d. A piece
    left alone arrives in an Identity on d: the edge the ledger records is in the graph
    whether or not d's ops read it later."""
    held = list(pieces[d])
    have = {e for owners, _, _ in held for e in owners}
    boxes = {box for _, box, _ in held}
    arrived = []
    for m in em.parts.group(d, (level,)):
        if m == d:
            continue
        for owners, box, tensor in pieces.get(m, ()):
            for run in ([owners] if not set(owners) & have else
                        [(e,) for e in owners if e not in have]):
                part_box = box if run == owners else targets[run[0]]
                if part_box in boxes:                       # an equal box: held already
                    continue
                part = tensor if part_box == box else em._cut(_Held(tensor, box), part_box, m)
                em.send("reduce", t, op, part, m, d, part_box)
                arrived.append((run, part_box, part))
                have.update(run)
                boxes.add(part_box)
    merged = _concatenated(em, t, held + arrived, d)
    local = {id(p) for p in held}
    return [piece if id(piece) in local or piece[2].node not in {a[2].node for a in arrived}
            else (piece[0], piece[1], em.out.identity(piece[2], d, em._name(
                t.replace(":", "_") + "/gathered")))
            for piece in merged]


def _concatenated(em, t: str, pieces, d: int):
    """Pieces that tile a box two by two (adjacent along one dim, equal in the others)
    joined by a Concat on d, until no two do."""
    pieces = list(pieces)
    joined = True
    while joined:
        joined = False
        for i, j in ((i, j) for i in range(len(pieces)) for j in range(len(pieces)) if i != j):
            axis = _adjacent(pieces[i][1], pieces[j][1])
            if axis is None:
                continue
            (oa, ba, ta), (ob, bb, tb) = pieces[i], pieces[j]
            box = tuple((ba[k][0], bb[k][1]) if k == axis else ba[k] for k in range(len(ba)))
            tensor = em.out.concat([ta, tb], axis, d, em._name(t.replace(":", "_") + "/concat"))
            pieces = [p for k, p in enumerate(pieces) if k not in (i, j)] + \
                [(oa + ob, box, tensor)]
            joined = True
            break
    return pieces


def _adjacent(a: Box, b: Box) -> int | None:
    """The dim along which box b continues box a (equal elsewhere), or None."""
    diff = [k for k in range(len(a)) if a[k] != b[k]]
    if len(diff) == 1 and a[diff[0]][1] == b[diff[0]][0]:
        return diff[0]
    return None


def _exchange(em, t: str, op: str, levels, reducer: str,
              replicas: tuple[int, ...] = ()) -> dict[int, dict[Box, Ref]]:
    """A small partial result (partition.exchanges), in the rounds of
    `partition.exchange_rounds`: the receivers hold the result, and readers fetch it from
    there as they would a stored region. Values combine in member order, so the two
    members of a swapping pair hold bit-identical results."""
    produced = em.produced[t]
    values = {d: produced[d].tensor for d in em.active(t)}
    for steps in exchange_rounds(em.parts, t, levels, replicas, em.active(t)):
        new = {}
        for e, group in steps:
            for m in group:
                if m != e:
                    em.send("reduce", t, op, values[m], m, e, produced[m].box)
            new[e] = _combine(em, t, [values[m] for m in group], reducer, e)
        values = new
    return {e: {produced[e].box: value} for e, value in values.items()}


V2_MERGE = {"sum": "Add", "mean": "Add", "max": "Max", "min": "Min", "prod": "Mul"}


def _all_reduce_v2(em, t: str, op: str, levels, reducer: str, targets) -> dict[int, list]:
    """One CollectiveReduceV2 per reduction group (a ring all-reduce over its devices,
    NCCL on GPUs) of its members' `targets` (their copy's slice at the replica levels,
    partition.replica_levels; the whole region without any): 2 (g - 1) / g of it per
    member, as the levels' sum prices it. Per device, its pieces for `_gathered`."""
    pieces: dict[int, list] = {}
    done: set[int] = set()
    for d in em.active(t):
        if d in done or targets[d] is None:
            continue
        group = em.parts.group(d, levels)
        done.update(group)
        key = em.collective_keys(group)
        size = len(group)
        for m in group:
            value = em._cut(em.produced[t][m], targets[m], m)
            reduced = _collective_reduce(em, value, size, key, reducer, m,
                                         em._name(t.replace(":", "_") + "/all_reduce"))
            em.collective_ops.append(reduced.node)
            em.ledger.add("reduce", t, op, group[(group.index(m) - 1) % size], m,
                          2 * (size - 1) * box_volume(targets[m]) * em.itemsize(t) // size,
                          collective=True)
            pieces[m] = [((m,), targets[m], reduced)]
    return pieces


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
# Booleans (tf.reduce_all / reduce_any: a min / max): Minimum and Maximum take no bool.
LOGICAL = {"max": "LogicalOr", "min": "LogicalAnd"}


def _combine(em, t: str, terms: list[Ref], reducer: str, d: int) -> Ref:
    """The terms combined on device d, in the given order."""
    if len(terms) == 1:
        return terms[0]
    name = em._name(t.replace(":", "_") + "/reduce")
    if reducer in ("sum", "mean"):
        return em.out.add_n(terms, d, name)
    logical = em.graph.tensors[t].dtype == "bool"
    combiner = (LOGICAL if logical else COMBINE).get(reducer)
    if combiner is None:
        raise RewriteError(f"no combiner for partial results reduced by '{reducer}'.",
                           node=t)
    result = terms[0]
    for term in terms[1:]:
        step = em._name(t.replace(":", "_") + "/" + combiner)
        result = (em.out.node(combiner, step, d, (result, term), {}, [result.shape],
                              [result.dtype])[0] if logical
                  else em.out.binary(combiner, result, term, d, step))
    return em.out.identity(result, d, name)
