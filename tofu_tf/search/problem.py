"""One level's partition problem: ops with their choices, tensors with their states.

Level 1 is the planner graph itself. Level l+1 is the problem inside one group of level l
(part 0, the largest): every tensor shrinks to its part-0 shape under its chosen state,
every op becomes its part-0 local op (`localize`: local shapes, halos, local attrs),
re-described so its strategies are derived afresh. An op input then reads its local
region at an offset `delta` into the stored tensor's part; what lies outside the stored
part was delivered by an outer level and costs nothing here.

A `Choice` is one strategy of an op at a k-way cut, or `replicate` (every part computes
the whole op): per data input the k boxes it reads (tensor coordinates, clamped), per
output the produced state and k boxes. `cost_vectors` turns choices into bytes per stored
state of each touched tensor (formulas in cost.py), batched through one `overlaps` call.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from tofu_tf.graph import DTYPE_SIZES
from tofu_tf.op_semantics.analysis import REPLICATED, OutputState, Strategy, clamp_slices
from tofu_tf.op_semantics.localize import LocalOp, localize
from tofu_tf.op_semantics.memo import SemanticsMemo
from tofu_tf.op_semantics.registry import Semantics
from tofu_tf.search.cost import (ALL_REDUCE_FACTOR, REDUCE_SCATTER_FACTOR, Box, box_volume,
                                 overlaps, partners, tensor_states, union_volume)

REPLICATE = "replicate"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    # Of a view of a part of its tensor (with_views): that part, all the view stores and
    # moves (_entries).
    footprint: Box | None = None

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES.get(self.dtype, 4)


@dataclass
class ProblemOp:
    """An op at one level: its (local) semantics and how its inputs map onto tensors."""
    name: str
    sem: Semantics
    strategies: tuple[Strategy, ...]
    inputs: tuple[str, ...]                          # tensor per semantics input
    outputs: tuple[str, ...]                         # tensor per output (updates: the variable)
    input_offsets: tuple[tuple[int, ...], ...]       # local input coord + delta = tensor coord
    key: int | None = None                           # semantics signature id (None: unique)
    # Per output: whether an outer level produced it Partial. Where this level produces it
    # Replicated, the outer reduction left one copy in the group, cut among its parts
    # (rewrite/collectives.py, partition.replica_levels): storing it R gathers it here.
    reduced: tuple[bool, ...] = ()
    # Per input: the box (tensor coords) of the local input that holds data, including
    # what an outer level delivered from outside the stored part (None: the whole tensor).
    windows: tuple[Box | None, ...] = ()
    # Interned id of (key, input_offsets, windows, reduced): what the op's geometry holds
    # besides k and its tensors' kinds (None: no key, the op is unique).
    template: int | None = None


@dataclass(frozen=True)
class Choice:
    """One way to run an op at a k-way cut."""
    label: str                                       # "o:i", "r:k" or "replicate"
    strategy: Strategy | None
    input_boxes: tuple[tuple[Box, ...] | None, ...]  # per input, k boxes (tensor coords)
    produced: tuple[OutputState, ...]                # per output
    output_boxes: tuple[tuple[Box, ...], ...]        # per output, k boxes (tensor coords)
    # Per input: elements the parts read of what an outer level delivered, beyond the one
    # copy that level already counted (see `_finish`); 0 at the first level.
    input_extra: tuple[int, ...] = ()


@dataclass
class SearchCache:
    """Work shared by every problem of one search (all levels, both storage policies):
    choices and cost vectors by geometry, local ops by (signature, choice, k)."""
    choices: dict = field(default_factory=dict)
    vectors: dict = field(default_factory=dict)
    local_ops: dict = field(default_factory=dict)
    parts: dict = field(default_factory=dict)        # (signature, label, k) -> k LocalOps
    kinds: dict = field(default_factory=dict)        # (shape, states, footprint) -> id
    stored: dict = field(default_factory=dict)       # tensor_states' args -> (states, kind)
    root: tuple | None = None          # (graph, root ops, root tensors, with_views of them)
    geometries: dict = field(default_factory=dict)   # geometry -> id
    templates: dict = field(default_factory=dict)    # template value -> id
    locals: dict = field(default_factory=dict)       # (geometry, label) -> next level's op
    patterns: dict = field(default_factory=dict)     # op -> (coarse graph, its groups, ranks)
    semantics: SemanticsMemo = field(default_factory=SemanticsMemo)
    models: dict = field(default_factory=dict)       # level 1's models (level.level_models)
    entries: dict = field(default_factory=dict)      # cost_vectors' entries, by _keyed

    def __enter__(self) -> "SearchCache":
        return self

    def __exit__(self, *exc_info) -> None:
        """Drops level 1's models, which refer back to this cache through their
        problems: what the searches made is then freed by reference counting as its
        last reference goes, not left in a cycle for a collection that walks all of it
        (ResNet-50's search leaves some 430,000 objects there: a 0.14 s collection)."""
        self.models.clear()


@dataclass
class Problem:
    """All ops and tensors of one level, and the k of its cut.

    Every tensor with a dim of size >= k is stored split, except those in `replicable`
    (the variables with their gradients and optimizer slots: replicating them is data
    parallelism) and those with fewer than `replicate_below` elements."""
    k: int
    ops: list[ProblemOp]
    tensors: dict[str, TensorSpec]
    replicable: frozenset[str] = frozenset()
    replicate_below: int = 0
    choices: dict[str, list[Choice]] = field(default_factory=dict)
    cache: "SearchCache" = field(default_factory=lambda: SearchCache())
    geometries: dict[str, int | None] = field(default_factory=dict)   # op -> geometry id
    # Views (`with_views`, Options.shared_reads): the tensors the readers of a tensor that
    # two or more ops read take it from, which may also be G(d) (cost.tensor_states); per
    # view the key that ties it to others in one group (coarsen.with_views).
    views: Mapping[str, tuple] = field(default_factory=dict)
    _stored: dict = field(default_factory=dict, repr=False)  # tensor -> (states, kind id)

    def states(self, tensor: str) -> tuple[OutputState, ...]:
        """Its stored states; a view's are its tensor's, and G(d) where R is not one."""
        return (self._stored.get(tensor) or self._store(tensor))[0]

    def kind(self, tensor: str) -> int:
        """What a choice's boxes and vectors depend on of a tensor — its shape and states —
        as an id (equal ids, equal kinds) that is cheap to hash in geometry keys."""
        return (self._stored.get(tensor) or self._store(tensor))[1]

    def _store(self, tensor: str) -> tuple[tuple[OutputState, ...], int]:
        """(its states, its kind), worked out once per search for what they depend on."""
        view = tensor in self.views
        replicable = (viewed(tensor) if view else tensor) in self.replicable
        spec = self.tensors[tensor]
        shape, footprint = spec.shape, spec.footprint
        replicate_below = None if replicable else self.replicate_below
        key = (shape, self.k, replicate_below, view, footprint)
        found = self.cache.stored.get(key)
        if found is None:
            states = tensor_states(shape, self.k, replicate_below, view)
            kinds = self.cache.kinds
            found = self.cache.stored[key] = (
                states, kinds.setdefault((shape, states, footprint), len(kinds)))
        self._stored[tensor] = found
        return found


def clamp_box(box: Box, shape: tuple[int, ...], delta: tuple[int, ...],
              clamp_to: Box | None = None) -> Box:
    """`box` shifted by `delta` and clamped to [0, n) per dim — or to `clamp_to` — never
    inverted."""
    limits = clamp_to or tuple((0, n) for n in shape)
    out = []
    for (a, b), (lo, hi), d in zip(box, limits, delta):   # min/max by comparisons: hot
        start, stop = a + d, b + d
        start = lo if start < lo else (hi if start > hi else start)
        stop = lo if stop < lo else (hi if stop > hi else stop)
        out.append((start, start if stop < start else stop))
    return tuple(out)


def opaque_local(sem: Semantics) -> LocalOp:
    """An opaque op runs whole on every part: it reads every input entirely."""
    n_in, n_out = len(sem.input_shapes), len(sem.output_shapes)
    return LocalOp(sem.op_type, dict(sem.attrs),
                   tuple(tuple((0, n) for n in shape) for shape in sem.input_shapes),
                   tuple(tuple((0, 0) for _ in shape) for shape in sem.input_shapes),
                   (None,) * n_in, {}, tuple(tuple((0, n) for n in shape)
                                             for shape in sem.output_shapes),
                   (None,) * n_out, (1.0,) * n_out)


def _parts(problem: Problem, op: ProblemOp, strategy: Strategy | None) -> list[LocalOp]:
    """The k local ops of a strategy (shared by ops of one signature)."""
    k = problem.k
    if op.sem.is_opaque:
        return [opaque_local(op.sem)] * k
    key = None if op.key is None else (op.key, None if strategy is None else
                                       (strategy.kind, strategy.var), k)
    parts = problem.cache.parts.get(key) if key is not None else None
    if parts is None:
        parts = [localize(op.sem, strategy, k, p) for p in range(k)]
        if key is not None:
            problem.cache.parts[key] = parts
    return parts


def make_choice(problem: Problem, op: ProblemOp, strategy: Strategy | None) -> Choice:
    """The choice's boxes. A local op's slices lie inside its own shapes (localize clamps
    them), so where a tensor has the op's shape, at offset 0 and with no window, they are
    the boxes as they are; and boxes clamped to a window inside the tensor need no second
    clamp and fetch nothing from outside."""
    locals_ = _parts(problem, op, strategy)
    tensors, windows, in_shapes = problem.tensors, op.windows, op.sem.input_shapes
    input_boxes, extra = [], []
    for i, tensor in enumerate(op.inputs):
        spec = tensors.get(tensor)
        if locals_[0].input_slices[i] is None or spec is None:
            input_boxes.append(None)
            extra.append(0)
            continue
        shape, delta = spec.shape, op.input_offsets[i]
        window = windows[i] if i < len(windows) else None
        if window is None:
            if in_shapes[i] == shape and not any(delta):
                input_boxes.append(tuple([local.input_slices[i] for local in locals_]))
            else:
                input_boxes.append(tuple([clamp_box(local.input_slices[i], shape, delta)
                                          for local in locals_]))
            extra.append(0)
            continue
        needs = [clamp_box(local.input_slices[i], shape, delta, clamp_to=window)
                 for local in locals_]
        if _inside(window, shape):
            input_boxes.append(tuple(needs))
            extra.append(0)
        else:
            input_boxes.append(tuple([clamp_slices(box, shape) for box in needs]))
            extra.append(fetch_extra(needs, window, shape))
    produced, output_boxes = [], []
    out_shapes = op.sem.output_shapes
    for o, tensor in enumerate(op.outputs):
        state = strategy.outputs[o] if strategy is not None else REPLICATED
        produced.append(state)
        shape = problem.tensors[tensor].shape
        if out_shapes[o] == shape:
            output_boxes.append(tuple([local.output_slices[o] for local in locals_]))
        else:
            zero = (0,) * len(shape)
            output_boxes.append(tuple([clamp_box(local.output_slices[o], shape, zero)
                                       for local in locals_]))
    label = REPLICATE if strategy is None else strategy.label
    return Choice(label, strategy, tuple(input_boxes), tuple(produced), tuple(output_boxes),
                  tuple(extra))


def _inside(box: Box, shape: tuple[int, ...]) -> bool:
    for (a, b), n in zip(box, shape):
        if a < 0 or b > n:
            return False
    return True


def fetch_extra(needs, window: Box | None, shape) -> int:
    """Elements the parts read from outside the stored part (`needs` clamped to the
    window only) beyond the one copy of it an outer level delivered: of the window's
    outside, or of the union of the needs where they do not cover the window (a strided
    read leaves gaps), so never less than 0."""
    if window is None or _inside(window, shape):     # so are the needs: none outside
        return 0
    outside = sum(box_volume(b) - box_volume(clamp_slices(b, shape)) for b in needs
                  if not _inside(b, shape))
    if not outside:            # every need inside the tensor: the two unions are equal
        return 0
    read = union_volume(needs)
    if read == box_volume(window):
        return outside - (read - box_volume(clamp_slices(window, shape)))
    return outside - read + union_volume([clamp_slices(b, shape) for b in needs])


def _whole(shape) -> Box:
    return tuple((0, n) for n in shape)


def geometry(problem: Problem, op: ProblemOp) -> int | None:
    """Ops with equal geometry have equal choices and cost vectors (up to tensor names).
    The geometry — k, signature, offsets, windows, reductions above, tensor kinds — is
    interned as an id, so later keys hash an int."""
    geo = problem.geometries.get(op.name, False)
    if geo is False:
        geo = problem.geometries[op.name] = _geometry(problem, op)
    return geo


def _geometry(problem: Problem, op: ProblemOp) -> int | None:
    if op.key is None:
        return None
    template = op.template if op.template is not None else template_id(
        problem.cache, op.key, op.input_offsets, op.windows, op.reduced)
    kind = problem.kind
    value = (problem.k, template, tuple([kind(t) for t in op.inputs]),
             tuple([kind(t) for t in op.outputs]))
    ids = problem.cache.geometries
    return ids.setdefault(value, len(ids))


def template_id(cache: SearchCache, key, offsets, windows, reduced=()) -> int:
    ids = cache.templates
    return ids.setdefault((key, offsets, windows, reduced), len(ids))


def may_replicate(problem: Problem, op: ProblemOp, has_strategies: bool) -> bool:
    """Whether `replicate` is a choice: no strategy at this k, or every output may be
    stored replicated (so running the op whole costs no memory the plan forbids)."""
    return (not has_strategies or all(REPLICATED in problem.states(t) for t in op.outputs)
            or _view_of_a_view(op))


def _view_of_a_view(op: ProblemOp) -> bool:
    """A view of a part read from the view of all of it (with_views): it may run whole
    where that one is whole, storing its part's view as the plain view is."""
    return viewed(op.name) is not None and viewed(op.inputs[0]) is not None


def build_choices(problem: Problem) -> None:
    """Every op's choices: its valid strategies at this k. An op runs whole on every part
    (replicate) only when it has no strategy at this k, or it is opaque, or every tensor
    it produces may be stored replicated. Equal geometries share one list."""
    memo = problem.cache.choices
    for op in problem.ops:
        key = geometry(problem, op)
        if key is not None and key in memo:
            problem.choices[op.name] = memo[key]
            continue
        strategies = [s for s in op.strategies if s.valid_for(problem.k)]
        choices = [make_choice(problem, op, s) for s in strategies]
        if may_replicate(problem, op, bool(choices)):
            choices.append(make_choice(problem, op, None))
        problem.choices[op.name] = choices
        if key is not None:
            memo[key] = choices


@dataclass
class _Batch:
    """Boxes of every (op, choice, tensor) entry, for one `overlaps` call: one flat list
    of coordinates, each box padded to `rank` ((0, 1), size 1 past a tensor's rank), made
    one [entries, k, rank, 2] array in `run` (a flat list converts an order of magnitude
    faster than nested ones)."""
    rank: int
    k: int
    coords: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    count: int = 0

    def add(self, boxes: tuple[Box, ...], shape: tuple[int, ...]) -> int:
        coords, rank = self.coords, self.rank
        for box in boxes:
            for pair in box:
                coords.extend(pair)
            if len(box) < rank:
                coords.extend((0, 1) * (rank - len(box)))
        self.sizes.extend(shape)
        if len(shape) < rank:
            self.sizes.extend((1,) * (rank - len(shape)))
        self.count += 1
        return self.count - 1

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        """(overlap volumes, transfer pairs) of every box: cost.overlaps, cost.partners."""
        if not self.count:
            return np.zeros((0, 1), dtype=np.int64), np.zeros((0, 1), dtype=np.int64)
        boxes = np.array(self.coords, dtype=np.int64).reshape(self.count, self.k, self.rank, 2)
        shapes = np.array(self.sizes, dtype=np.int64).reshape(self.count, self.rank)
        return overlaps(boxes, shapes, self.k), partners(boxes, shapes, self.k)



@dataclass(frozen=True)
class _Columns:
    """A tensor's `overlaps` columns in `Problem.states` order (D: replicated; a G(d)
    keeps dim d), and per state what `_finish` weighs it by."""
    cols: np.ndarray
    assembled: np.ndarray             # the columns of what each part ends up holding:
    #                                   D for R and G(d), else as cols
    whole: np.ndarray                 # 1 where every part holds all of it once read: R, G
    reduce_factors: np.ndarray        # a Partial output's reduction, per stored state

    @staticmethod
    def of(problem: Problem, tensor: str, rank: int) -> "_Columns":
        states = problem.states(tensor)
        cols = np.array([rank if s.kind == "replicated" else s.dim for s in states],
                        dtype=np.intp)
        whole = np.array([1 if s.kind == "replicated" or s.gathered else 0 for s in states],
                         dtype=np.int64)
        return _Columns(cols, np.where(whole > 0, rank, cols), whole,
                        np.where(whole > 0, ALL_REDUCE_FACTOR, REDUCE_SCATTER_FACTOR))


class OpVectors(Mapping):
    """op -> per choice [(tensor, bytes per stored state of that tensor)]: the cost
    vectors. Ops of one geometry share one positional list (`positional`), which also
    holds each vector's transfers per state; tensor names are resolved on first access."""

    def __init__(self, problem: Problem, unique: dict[str, list]):
        self.problem = problem
        self.ops = {op.name: op for op in problem.ops}
        self._unique = unique               # ops without a geometry: their own vectors
        self._named: dict[str, list] = {}

    def positional(self, op: str
                   ) -> list[list[tuple[tuple[str, int], np.ndarray, np.ndarray]]]:
        """Per choice [(("in"|"out", index), bytes per state, transfers per state)],
        shared by its geometry."""
        key = self.problem.geometries[op]
        return self._unique[op] if key is None else self.problem.cache.vectors[key]

    def __getitem__(self, op: str):
        named = self._named.get(op)
        if named is None:
            problem_op = self.ops[op]
            named = self._named[op] = [
                [(tensor_at(problem_op, position), vector) for position, vector, _ in entries]
                for entries in self.positional(op)]
        return named

    def transfers(self, op: str) -> list[list[tuple[str, np.ndarray]]]:
        """Per choice [(tensor, transfers per state)], as `self[op]` holds bytes."""
        problem_op = self.ops[op]
        return [[(tensor_at(problem_op, position), count) for position, _, count in entries]
                for entries in self.positional(op)]

    def __iter__(self):
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)


def cost_vectors(problem: Problem) -> OpVectors:
    """Every op's cost vectors. Equal geometries are computed once, and so is each
    distinct entry (`_keyed`: of ResNet-50's about 3800 per level, some 450), across the
    search (both remembered in the search cache); all new boxes go through one `overlaps`
    call."""
    finished, memo = problem.cache.vectors, problem.cache.entries
    keyed: dict = {}             # geometry key or op name (no geometry) -> per choice keys
    pending: dict = {}           # entry key -> entry, for `_finish_entries`
    for op in problem.ops:
        key = geometry(problem, op)
        pending_key = op.name if key is None else key
        if key not in finished and pending_key not in keyed:
            keyed[pending_key] = [_keyed(problem, _entries(problem, op, choice), memo, pending)
                                  for choice in problem.choices[op.name]]
    _finish_entries(problem, pending, memo)
    unique = {}
    for key, per_choice in keyed.items():
        vectors = [[(position, *memo[entry]) for position, entry in row]
                   for row in per_choice]
        (unique if isinstance(key, str) else finished)[key] = vectors
    return OpVectors(problem, unique)


def tensor_at(op: ProblemOp, position: tuple[str, int]) -> str:
    kind, index = position
    return op.inputs[index] if kind == "in" else op.outputs[index]


def _keyed(problem: Problem, entries: list[tuple], memo: dict, pending: dict
           ) -> list[tuple[tuple[str, int], tuple]]:
    """(position, key) per `_entries` entry: the key holds all `_finish` reads of it —
    its kind, boxes and detail, and its tensor's kind (shape, states, footprint) and item
    size at this k — so entries of many ops and shapes share one; those not in `memo`
    are added to `pending`."""
    row = []
    for entry in entries:
        kind, position, spec, boxes, detail = entry
        key = (kind, boxes, detail, problem.kind(spec.name), spec.itemsize, problem.k)
        if key not in memo:
            pending.setdefault(key, entry)
        row.append((position, key))
    return row


def _finish_entries(problem: Problem, pending: dict, memo: dict) -> None:
    """memo[key] = (bytes, transfers) per state of each pending entry: its boxes through
    one `overlaps` call, then `_finish`."""
    if not pending:
        return
    rank = max([len(t.shape) for t in problem.tensors.values()] + [1])
    batch = _Batch(rank, problem.k)
    staged = {key: _stage(entry, batch) for key, entry in pending.items()}
    volumes, pairs = batch.run()
    columns: dict[str, _Columns] = {}
    for key, entry in staged.items():
        memo[key] = _finish(problem, entry, volumes, pairs, rank, columns)


def _entries(problem, op, choice) -> list[tuple]:
    """(kind, position, tensor spec, boxes, detail) per tensor the choice moves, before
    `_stage` puts the boxes in a batch: a fetch's boxes and extra elements; a split
    output's (domain on every part, produced boxes) and elements outside the domain; a
    Partial output's (local output elements, outside); a replicated one's outside."""
    entries = []
    for i, boxes in enumerate(choice.input_boxes):
        if boxes is not None:
            extra = choice.input_extra[i] if i < len(choice.input_extra) else 0
            entries.append(("fetch", ("in", i), problem.tensors[op.inputs[i]], boxes, extra))
    for o, state in enumerate(choice.produced):
        spec = problem.tensors[op.outputs[o]]
        produced = choice.output_boxes[o]
        domain = _domain(produced, spec.shape)
        if state.kind == "partial":    # the group reduces all it produced (collectives.py)
            entries.append(("partial", ("out", o), spec, None,
                            (math.prod(op.sem.output_shapes[o]),
                             math.prod(spec.shape) - box_volume(domain))))
            continue
        whole = math.prod(spec.shape)
        if spec.footprint is not None:     # a view of a part stores and moves that part
            whole, domain = box_volume(spec.footprint), _meet(domain, spec.footprint)
            produced = tuple(_meet(box, spec.footprint) for box in produced)
        if state.kind == "split":
            entries.append(("convert", ("out", o), spec, ((domain,) * problem.k, produced),
                            whole - box_volume(domain)))
        else:           # a reduced output comes whole from outside (ProblemOp.reduced)
            reduced = o < len(op.reduced) and op.reduced[o]
            entries.append(("replicated", ("out", o), spec, None,
                            whole - (0 if reduced else box_volume(domain))))
    return entries


def _stage(entry: tuple, batch: _Batch) -> tuple:
    """An `_entries` entry as `_finish` takes it: its boxes added to `batch` as rows."""
    kind, position, spec, boxes, detail = entry
    if kind == "fetch":
        return kind, position, spec, batch.add(boxes, spec.shape), detail
    if kind == "convert":
        held, produced = boxes
        return (kind, position, spec, batch.add(held, spec.shape),
                (batch.add(produced, spec.shape), detail))
    return kind, position, spec, None, ((None, detail) if kind == "replicated" else detail)


def entry_vectors(problem: Problem, op: ProblemOp, choices: list[Choice], memo: dict
                  ) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per choice, per entry `cost_vectors` makes for it (in its order), (bytes,
    transfers) per state of the entry's tensor, as `cost_vectors` computes them; each
    distinct entry once across calls (`memo`, keyed by `_keyed`)."""
    pending: dict = {}
    keyed = [_keyed(problem, _entries(problem, op, choice), memo, pending)
             for choice in choices]
    _finish_entries(problem, pending, memo)
    return [[memo[key] for _, key in row] for row in keyed]


def _part_footprint(footprint: Box | None, shape: tuple[int, ...]) -> Box | None:
    """A view's footprint inside part 0 of the given shape (whose coordinates are the
    tensor's); None where that is all of part 0."""
    if footprint is None:
        return None
    whole = tuple((0, n) for n in shape)
    box = _meet(footprint, whole)
    return None if box == whole else box


def _meet(a: Box, b: Box) -> Box:
    """The intersection of two boxes (empty: a zero extent)."""
    return tuple((max(a0, b0), max(a0, b0, min(a1, b1))) for (a0, a1), (b0, b1) in zip(a, b))


def _domain(boxes: tuple[Box, ...], shape: tuple[int, ...]) -> Box:
    """The hull of the produced boxes: what this level's op produces of the tensor."""
    if not boxes or not boxes[0]:
        return tuple((0, n) for n in shape)
    return tuple((min([a for a, _ in pairs]), max([b for _, b in pairs]))
                 for pairs in zip(*boxes))


def _finish(problem, entry, volumes, pairs, rank, columns) -> tuple[np.ndarray, np.ndarray]:
    """(bytes per stored state, transfers per stored state). Bytes: elements an
    outer level delivered (outside the stored part) are counted there once per group;
    every further copy an inner device needs is counted here, so the levels add up to the
    bytes each device really receives:
    fetch  += extra copies of delivered input elements (the same for every state);
    convert, partial, replicated state += (k - 1) x the stored elements produced outside
    the group (all of them for an output an outer level reduced: ProblemOp.reduced).
    A Partial output reduces all the op's local output, the part other groups store too.
    A G(d) state (a view: with_views) is assembled whole on every part, once, from what
    the parts produced, as the emitter's readers take it: its conversion is R's (a
    Partial one reduces as for R, an all-reduce), its reads fetch nothing more, and the
    next level cuts it whole (level_models); it is stored as Split(d) (memory only). A
    view of a part (TensorSpec.footprint) stores and converts that part alone: its
    readers fetch nothing else, and the emitter sends them nothing else.
    Transfers, as the emitter makes them: a fetch, the (receiver, holder) pairs whose
    regions meet (cost.partners; none from R); a split output, the (producer, keeper)
    pairs; a Partial one, the ring's k (k - 1) messages per pass (two for R); at least one
    wherever bytes move."""
    kind, _, spec, first, second = entry
    found = columns.get(spec.name)
    if found is None:
        found = columns[spec.name] = _Columns.of(problem, spec.name, rank)
    cols, k = found.cols, problem.k
    if kind == "fetch":
        row = volumes[first]
        moved = spec.itemsize * (row[rank] - np.where(found.whole > 0, row[rank], row[cols])
                                 + second)
        count = pairs[first][cols] * (1 - found.whole)
    elif kind == "partial":                      # second: |domain|, outside
        produced, outside = second
        moved = spec.itemsize * (k - 1) * (produced * found.reduce_factors
                                           + found.whole * outside)
        count = k * (k - 1) * found.reduce_factors
    else:
        produced_index, outside = second
        copies = found.whole * ((k - 1) * outside)
        if kind == "replicated":                 # every part produced the whole domain
            moved = spec.itemsize * copies
            count = np.zeros(len(cols), dtype=np.int64)
        else:
            held = volumes[first][found.assembled]      # sum_p |H_p(X) ∩ domain|
            moved = spec.itemsize * (held - volumes[produced_index][found.assembled] + copies)
            count = pairs[produced_index][found.assembled]
    return moved, np.where(moved > 0, np.maximum(count, 1), 0)


# -- building problems ---------------------------------------------------------------------

def searched(op, entry) -> bool:
    """Whether a graph op is one of the problem's (root_problem): it has semantics, and
    outputs with shapes or inputs."""
    return entry.semantics is not None and bool(entry.semantics.output_shapes or op.inputs)


def root_problem(graph, entries, k: int, replicable=frozenset(),
                 replicate_below: int = 0, cache: SearchCache | None = None,
                 group_of: Mapping[str, int] | None = None) -> Problem:
    """Level 1: the planner graph's ops (catalog entries) and tensors; given the coarse
    groups (`group_of`), with the views of `with_views`. Every policy's root shares one
    list of ops and tensors through the cache."""
    cache = cache or SearchCache()
    if cache.root is None or cache.root[0] is not graph:
        tensors = {name: TensorSpec(name, t.shape, t.dtype)
                   for name, t in graph.tensors.items()}
        ops = []
        for op in graph:
            entry = entries[op.name]
            if not searched(op, entry):
                continue
            outputs = tuple(op.outputs) + tuple(op.inputs[c.alias]
                                                for c in entry.semantics.updates)
            offsets = tuple((0,) * len(tensors[t].shape) for t in op.inputs)
            template = None if entry.signature is None else template_id(
                cache, entry.signature, offsets, ())
            ops.append(ProblemOp(op.name, entry.semantics, entry.strategies,
                                 tuple(op.inputs), outputs, offsets, entry.signature,
                                 template=template))
        cache.root = (graph, ops, tensors, None)
    _, ops, tensors, viewed = cache.root
    if group_of is not None:
        if viewed is None:
            viewed = with_views(graph, ops, tensors, cache, group_of)
            cache.root = cache.root[:3] + (viewed,)
        ops, tensors, names = viewed
        return Problem(k, ops, tensors, frozenset(replicable), replicate_below, cache=cache,
                       views=names)
    return Problem(k, ops, tensors, frozenset(replicable), replicate_below, cache=cache)


VIEW = "/read"           # a view op's name: its tensor's + VIEW (no graph op has a ':')
SIBLING_VIEWS = 3        # inputs of one op from one coarse group read directly from this many


def view_of(tensor: str, part: int = 0) -> str:
    """The view tensor of `tensor` (`with_views`); `part` n > 0: its n-th view of a part
    of it."""
    return f"{tensor}{VIEW}{part or ''}:0"


def viewed(name: str) -> str | None:
    """The tensor a view op or view tensor stands for; None for the graph's own."""
    head = (name[:-2] if name.endswith(":0") else name).rstrip("0123456789")
    return head[:-len(VIEW)] if head.endswith(VIEW) and ":" in head else None


def with_views(graph, ops: list[ProblemOp], tensors: dict[str, TensorSpec],
               cache: SearchCache, group_of: Mapping[str, int]
               ) -> tuple[list[ProblemOp], dict[str, TensorSpec], dict[str, tuple]]:
    """(ops, tensors, view tensors) where a tensor two or more ops read (not a resource)
    is read through a view: an Identity op of the search only, whose output the readers
    take it from. The emitter sends a region a device lacks once, whoever reads it; a
    view's states price that: the view stored as the tensor is (its Identity moves
    nothing), each reader fetches its own region; or the view G(d): assembled whole on
    every part once, the readers fetch nothing more (cost.tensor_states). A view is a
    group of its own (coarsen.with_views) unless many views of the tensors of one coarse
    group are read alike (by ops of the same signatures, at the same inputs: the steps of
    an RNN), which share one; an op that reads `SIBLING_VIEWS` or more tensors of one
    coarse group (a Pack of the steps) reads them directly, as one group; a tensor only
    one op reads through a view has none. Two or more ops that each read the same part of
    a tensor only (a strided or sliced read: the shortcut convolution of a residual block
    and its filter gradient) read it through a view of their own, whose G(d) assembles
    that part alone (its TensorSpec.footprint), as the emitter sends it. Plans leave
    views out (plan_from_search). Per view: (its tensor's coarse group, how it is read),
    the key coarsen ties by."""
    readers = collections.Counter(t for op in ops for t in set(op.inputs))
    candidates = {t for t, n in readers.items()
                  if n > 1 and not graph.tensors[t].is_resource and tensors[t].shape}
    through: dict[str, list[str]] = {}               # op -> its inputs read through views
    for op in ops:
        mine = [t for t in dict.fromkeys(op.inputs) if t in candidates]
        per_group = collections.Counter(group_of[t] for t in mine)
        through[op.name] = [t for t in mine if per_group[group_of[t]] < SIBLING_VIEWS]
    footprint = _read_footprints(ops, through, tensors)
    # (tensor, footprint) -> its readers: two or more reading one part of a tensor read
    # it through a view of that part; the rest, two or more, through a view of it all
    classes = collections.defaultdict(list)
    for op in ops:
        for t in through[op.name]:
            classes[t, footprint[op.name, t]].append(op)
    whole = collections.defaultdict(list)
    for (t, box), readers_of in list(classes.items()):
        if box is None or len(readers_of) < 2:
            whole[t] += classes.pop((t, box))
    read_from, views, footprints = {}, {}, {}        # (op, t) -> view; view -> key, box
    parts = collections.Counter()
    for t, box in sorted(classes, key=str):
        parts[t] += 1
        views[view_of(t, parts[t])] = (t, box)
    for t in sorted(t for t, readers_of in whole.items() if len(readers_of) > 1):
        views[view_of(t)] = (t, None)
    for view, (t, box) in views.items():
        group = classes[t, box] if box is not None else whole[t]
        for op in group:
            read_from[op.name, t] = view
        views[view] = (group_of[t], tuple(sorted(
            [(op.key if op.key is not None else op.name, op.inputs.index(t)) for op in group],
            key=str)))
        if box is not None:
            footprints[view] = box
    if not views:
        return ops, tensors, {}
    out_tensors, out_ops, made = dict(tensors), [], set()

    def make(view: str, t: str) -> None:
        """The view's Identity (a view of a part reads the view of all of it, if any: a
        whole one serves it too), once, before its first reader."""
        if view in made:
            return
        made.add(view)
        source = t
        if footprints.get(view) is not None and view_of(t) in views:
            make(view_of(t), t)
            source = view_of(t)
        spec = tensors[t]
        out_tensors[view] = TensorSpec(view, spec.shape, spec.dtype, footprints.get(view))
        sem, strategies, key = cache.semantics.get(
            view[:-2], "Identity", {}, [spec.shape], [spec.dtype], [spec.shape],
            [spec.dtype])
        offsets = ((0,) * len(spec.shape),)
        out_ops.append(ProblemOp(view[:-2], sem, strategies, (source,), (view,), offsets, key,
                                 template=template_id(cache, key, offsets, ())))

    for op in ops:
        reads = {t: read_from[op.name, t] for t in through[op.name] if (op.name, t) in read_from}
        for t, view in reads.items():
            make(view, t)
        if reads:
            op = dataclasses.replace(op, inputs=tuple(reads.get(t, t) for t in op.inputs))
        out_ops.append(op)
    return out_ops, out_tensors, views


def _read_footprints(ops: list[ProblemOp], through: Mapping[str, list[str]],
                     tensors: Mapping[str, TensorSpec]) -> dict[tuple[str, str], Box | None]:
    """Per (op, tensor) read through a view: what the op reads of it, run whole (every
    split of the op reads inside it) — None where that is all of it, or nothing (a read of
    its shape alone)."""
    out = {}
    for op in ops:
        if not through[op.name]:
            continue
        local = opaque_local(op.sem) if op.sem.is_opaque else localize(op.sem, None, 1, 0)
        for t in through[op.name]:
            i, shape = op.inputs.index(t), tensors[t].shape
            box = local.input_slices[i]
            box = None if box is None else clamp_box(box, shape, op.input_offsets[i])
            out[op.name, t] = None if box == tuple((0, n) for n in shape) else box
    return out


def sub_problem(problem: Problem, states, choices, k: int, *, describe: bool = True
                ) -> Problem:
    """The problem inside part 0 of this level, for the next level's k-way cut (k = 1:
    what one device runs, whose ops are not analysed for strategies: none splits).
    `describe` False (k = 1 only): each local op keeps only its shapes (and which inputs
    are meta), all a memory estimate reads — not its computation."""
    if not describe and k != 1:
        raise ValueError("only a device problem (k = 1) may skip describing its ops")
    tensors = {}
    for name, spec in problem.tensors.items():
        state = states.get(name)
        if state is not None and state.kind == "split" and not state.gathered:
            shape = part0_shape(spec.shape, state, problem.k)
            spec = TensorSpec(name, shape, spec.dtype, _part_footprint(spec.footprint, shape))
        tensors[name] = spec
    cache = problem.cache
    made, geometries = cache.locals, problem.geometries
    detail = ANALYSE if k > 1 else (DESCRIBE if describe else SHAPES)
    ops = []
    for op in problem.ops:
        label = choices[op.name]
        geometry_id = geometries.get(op.name)
        local = made.get((geometry_id, label, detail)) if geometry_id is not None else None
        if local is None:
            local = _local_problem_op(problem, op, label, tensors, cache.semantics,
                                      cache.local_ops, detail)
            if geometry_id is not None:
                made[(geometry_id, label, detail)] = local
            ops.append(local)
        else:        # equal geometry and choice: equal local op, up to the tensor names
            ops.append(ProblemOp(op.name, local.sem, local.strategies, op.inputs, op.outputs,
                                 local.input_offsets, local.key, local.reduced,
                                 local.windows, local.template))
    return Problem(k, ops, tensors, problem.replicable, problem.replicate_below, cache=cache,
                   views=problem.views)


def part0_shape(shape, state, k: int) -> tuple[int, ...]:
    if state is None or state.kind != "split":
        return shape
    out = list(shape)
    out[state.dim] = -(-shape[state.dim] // k)          # part 0 is the largest
    return tuple(out)


# How much of a local op a sub-problem makes: its strategies (a cut follows), its
# semantics (what one device runs), or its shapes only (what one device holds).
ANALYSE, DESCRIBE, SHAPES = "analyse", "describe", "shapes"


def _local_problem_op(problem: Problem, op: ProblemOp, label: str, tensors,
                      memo: SemanticsMemo, local_memo: dict, detail: str) -> ProblemOp:
    """Part 0's local op, re-described (as far as `detail`) so the next level derives its
    own strategies."""
    key = (op.key, label, problem.k, detail) if op.key is not None else None
    choice = next((c for c in problem.choices[op.name] if c.label == label), None)
    reduced = _reduced(op, choice)
    if key is None or key not in local_memo:
        built = _describe_local(problem, op, label, tensors, memo, detail)
        if key is None:
            sem, strategies, shifts, sig = built
            return ProblemOp(op.name, sem, strategies, op.inputs, op.outputs,
                             _shifted(op.input_offsets, shifts), sig,
                             reduced, _windows(problem, op, choice))
        local_memo[key] = built
    # Ops of one signature share the local semantics (its op_name is the first one's).
    sem, strategies, shifts, sig = local_memo[key]
    offsets, windows = _shifted(op.input_offsets, shifts), _windows(problem, op, choice)
    template = None if sig is None else template_id(problem.cache, sig, offsets, windows,
                                                    reduced)
    return ProblemOp(op.name, sem, strategies, op.inputs, op.outputs, offsets, sig, reduced,
                     windows, template)


def _windows(problem: Problem, op: ProblemOp, choice: Choice) -> tuple[Box | None, ...]:
    """Per input: part 0's data region of its local input under `choice`, in tensor
    coords (the next level's part-0 coords are the same)."""
    windows = []
    for i, tensor in enumerate(op.inputs):
        boxes = choice.input_boxes[i]
        if boxes is None:
            windows.append(None)
            continue
        local = _parts(problem, op, choice.strategy)[0]
        window = op.windows[i] if i < len(op.windows) and op.windows[i] is not None \
            else _whole(problem.tensors[tensor].shape)
        windows.append(clamp_box(local.input_slices[i], (), op.input_offsets[i],
                                 clamp_to=window))
    return tuple(windows)


def _reduced(op: ProblemOp, choice: Choice | None) -> tuple[bool, ...]:
    """ProblemOp.reduced for the next level: Partial here or at an outer level."""
    if choice is None:
        return op.reduced
    flags = tuple((o < len(op.reduced) and op.reduced[o]) or state.kind == "partial"
                  for o, state in enumerate(choice.produced))
    return flags if any(flags) else ()


def _shifted(offsets, shifts) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(d + s for d, s in zip(delta, shift))
                 for delta, shift in zip(offsets, shifts))


def _describe_local(problem: Problem, op: ProblemOp, label: str, tensors, memo,
                    detail: str):
    """(semantics, strategies, input shifts, signature) of part 0's local op (no
    strategies unless `detail` is ANALYSE; SHAPES: a shapes-only semantics)."""
    strategy = next((c.strategy for c in problem.choices[op.name] if c.label == label), None)
    local = _parts(problem, op, strategy)[0]          # made for the choice (make_choice)
    in_shapes = [local.local_input_shape(i) or shape
                 for i, shape in enumerate(op.sem.input_shapes)]
    out_shapes = [tuple(b - a for a, b in (crop or share)) for share, crop in
                  zip(local.output_slices, local.output_crops)]
    shifts = tuple(_offset(local, i, len(shape)) for i, shape in enumerate(op.sem.input_shapes))
    if op.sem.is_opaque:
        sem = _opaque_semantics(op, in_shapes, out_shapes, op.sem.opaque_reason)
        return sem, (), shifts, None
    if detail == SHAPES:         # the op's own meta inputs; no computation
        sem = _whole_semantics(op, in_shapes, out_shapes, None, op.sem.meta_inputs,
                               op.sem.num_outputs)
        return sem, (), shifts, None
    dtypes_in = [tensors[t].dtype for t in op.inputs]
    dtypes_out = [tensors[t].dtype for t in op.outputs]
    n_real = op.sem.num_outputs if op.sem.num_outputs is not None else len(out_shapes)
    constants = {**op.sem.constants, **local.const_inputs}
    try:
        sem, strategies, sig = memo.get(op.name, local.op_type, local.attrs, in_shapes,
                                        dtypes_in, out_shapes[:n_real], dtypes_out[:n_real],
                                        constants, strategies=detail == ANALYSE)
    except Exception as err:  # a local op the descriptions cannot take: keep it whole
        sem = _opaque_semantics(op, in_shapes, out_shapes, f"local op not describable: {err}")
        return sem, (), shifts, None
    if sem.is_opaque:
        return _opaque_semantics(op, in_shapes, out_shapes, sem.opaque_reason), (), shifts, sig
    return sem, strategies or (), shifts, sig


def _offset(local: LocalOp, index: int, rank: int) -> tuple[int, ...]:
    """Where the local input starts in the op's input coordinates (start - pad)."""
    slices, pads = local.input_slices[index], local.input_pads[index]
    if slices is None:
        return (0,) * rank
    pads = pads if pads is not None else ((0, 0),) * len(slices)
    return tuple(a - p0 for (a, _), (p0, _) in zip(slices, pads))


def _opaque_semantics(op: ProblemOp, in_shapes, out_shapes, reason: str) -> Semantics:
    return _whole_semantics(op, in_shapes, out_shapes, reason, frozenset(), len(out_shapes))


def _whole_semantics(op: ProblemOp, in_shapes, out_shapes, reason: str | None, meta_inputs,
                     num_outputs: int | None) -> Semantics:
    """The local op's shapes without a computation (every output whole)."""
    return Semantics(op.name, op.sem.op_type, tuple(tuple(s) for s in in_shapes),
                     tuple(tuple(s) for s in out_shapes), (None,) * len(out_shapes),
                     meta_inputs, reason, op.sem.attrs, num_outputs)
