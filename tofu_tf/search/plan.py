"""The Plan: per level, each tensor's stored state and each op's choice, and its bytes.

A Plan is frozen and round-trips through JSON (`to_json` / `from_json`). `str(plan)` is a
readable summary: totals per level, the tensor groups that move the most bytes and the ops
that make them move. `make_plan(graph, topology)` runs the search.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Mapping

from absl import logging

from tofu_tf._gc import paused_gc
from tofu_tf.errors import PlanInfeasibleError, TofuError
from tofu_tf.graph import Graph
from tofu_tf.options import Options, Recompute
from tofu_tf.search.memory import single_device_peak
from tofu_tf.search.problem import SearchCache, viewed
from tofu_tf.search.recursive import SearchResult, deadline_of, search
from tofu_tf.search.topology import Level, Topology

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Transfer:
    """Bytes one op moves for one tensor at one level (per group of that level)."""
    op: str
    tensor: str
    bytes: float


@dataclass(frozen=True)
class LevelPlan:
    ways: int
    bandwidth: float
    latency: float
    groups: int                          # how many groups solve this level (1, k1, k1*k2 ...)
    group_states: Mapping[int, str]      # coarse tensor group -> "S(d)" | "R"
    choices: Mapping[str, str]           # op -> "o:var" | "r:var" | "replicate"
    bytes: float                         # one group's cut
    exact: bool
    transfers: tuple[Transfer, ...] = ()
    # One group's price of the computation its replicated ops repeat, in bytes
    # (search/level.py, Options.flop_bytes): what the search weighed against `bytes`.
    work: float = 0.0

    @property
    def total_bytes(self) -> float:
        return self.groups * self.bytes

    def seconds(self, num_devices: int) -> float:
        """Predicted transfer seconds over `num_devices` (SearchResult.transfer_seconds)."""
        return self.groups * (self.bytes / self.bandwidth
                              + len(self.transfers) * self.latency) / num_devices


@dataclass(frozen=True)
class Plan:
    topology: tuple[tuple[int, float, float], ...]      # (ways, bandwidth, latency) per level
    levels: tuple[LevelPlan, ...]
    num_ops: int
    num_groups: int
    search_seconds: float = field(compare=False)      # measures the run: not in ==, JSON
    groups: Mapping[str, int] = field(default_factory=dict)   # tensor -> coarse group
    op_types: Mapping[str, str] = field(default_factory=dict)
    variable_storage: str = "replicable"      # the storage policy of the winning recursion
    # Estimated peak bytes per device (search/memory.py: every device is bounded by part 0
    # of each cut, the largest) and of the unpartitioned step on one device.
    per_device_peak_bytes: tuple[int, ...] = ()
    single_device_peak_bytes: int = 0
    # Bytes the emitted step moves per level (the outermost level its two devices differ
    # at), priced from the per-device regions (rewrite/pricing.py); () until priced. The
    # levels' `bytes` above are the search's model: each level's cut inside its groups.
    predicted_per_level: tuple[int, ...] = ()
    # What the plan partitions is `step_graph(graph, plan)`: the step with its updates
    # moved early (search/reorder.py) and these forward ops recomputed (search/recompute.py).
    early_updates: bool = False
    recompute: tuple[str, ...] = ()
    # Pipeline stages (search/pipeline.py): op -> the stage whose devices run it; level 1
    # is then the stage level (its ways the stage count). Empty: no pipeline.
    stages: Mapping[str, int] = field(default_factory=dict)
    # The simulator's step time on the options' step profile (search/simulate.py), where
    # the search compared plans by it (pipeline stage counts); None: not predicted.
    step_seconds: float | None = field(default=None, compare=False)

    @property
    def num_devices(self) -> int:
        return math.prod(level.ways for level in self.levels)

    @property
    def bytes_per_level(self) -> tuple[float, ...]:
        return tuple(level.total_bytes for level in self.levels)

    @property
    def total_bytes(self) -> float:
        return float(sum(self.bytes_per_level))

    @property
    def predicted_bytes(self) -> int | None:
        """Bytes the emitted step moves (the ledger's step total); None until priced."""
        return sum(self.predicted_per_level) if self.predicted_per_level else None

    def with_prediction(self, per_level: tuple[int, ...]) -> "Plan":
        return dataclasses.replace(self, predicted_per_level=tuple(int(b) for b in per_level))

    @property
    def transfer_seconds(self) -> float:
        return sum(level.seconds(self.num_devices) for level in self.levels)

    @property
    def exact(self) -> bool:
        return all(level.exact for level in self.levels)

    def state(self, level: int, tensor: str) -> str:
        """The stored state of `tensor` at `level` (0-based): its group's state."""
        return self.levels[level].group_states[self.groups[tensor]]

    def sharding_spec(self, tensor: str, shape: tuple[int, ...]) -> tuple[int | None, ...]:
        """Per dim of `tensor` (of `shape`), the level whose cut splits it (None: no level
        does), as a DTensor layout states it: one mesh dim per level, each splitting at
        most one tensor dim evenly. A TofuError names the tensor where the plan's storage
        is not such a layout (a dim split at two levels, or a part of uneven size)."""
        spec: list[int | None] = [None] * len(shape)
        local = list(shape)
        for level, plan_level in enumerate(self.levels):
            state = self.state(level, tensor)
            if not state.startswith("S("):
                continue
            dim = int(state[2:-1])
            if spec[dim] is not None or local[dim] % plan_level.ways:
                why = (f"its dim {dim} is split at levels {spec[dim] + 1} and {level + 1}"
                       if spec[dim] is not None else
                       f"its dim {dim} ({local[dim]} at level {level + 1}) does not divide "
                       f"into {plan_level.ways} equal parts")
                raise TofuError(f"the plan stores it in no DTensor layout: {why}.",
                                node=tensor, fix="a layout has one mesh dim per tensor dim "
                                "and even parts: choose a topology and sizes that give them, "
                                "or keep tofu_tf's own placement.")
            spec[dim] = level
            local[dim] //= plan_level.ways
        return tuple(spec)

    @property
    def peak_bytes(self) -> int:
        """The largest per-device peak estimate."""
        return max(self.per_device_peak_bytes, default=0)

    def get_topology(self) -> Topology:
        return Topology(tuple(Level(k, b, a) for k, b, a in self.topology))

    # -- JSON ------------------------------------------------------------------------------
    def to_json(self) -> str:
        """The plan as JSON, byte-identical for the same graph and options: without
        `search_seconds`, which measures the run rather than describing the plan."""
        data = asdict(self)
        del data["search_seconds"]
        data["format"] = FORMAT_VERSION
        return json.dumps(data, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Plan":
        data = json.loads(text)
        data.pop("format", None)
        levels = tuple(LevelPlan(**{
            **lvl, "transfers": tuple(Transfer(**t) for t in lvl["transfers"]),
            "group_states": {int(g): s for g, s in lvl["group_states"].items()}})
            for lvl in data.pop("levels"))
        topology = tuple(tuple(level) for level in data.pop("topology"))
        peaks = tuple(data.pop("per_device_peak_bytes", ()))
        data["predicted_per_level"] = tuple(data.get("predicted_per_level", ()))
        data["recompute"] = tuple(data.get("recompute", ()))
        data.setdefault("search_seconds", 0.0)
        return Plan(topology=topology, levels=levels, per_device_peak_bytes=peaks, **data)

    # -- summary ---------------------------------------------------------------------------
    def heaviest_groups(self, count: int = 8) -> list[tuple[int, float, list[Transfer]]]:
        """(group, bytes over all levels, its transfers, largest first) for the top groups."""
        per_group: dict[int, list[Transfer]] = defaultdict(list)
        total: dict[int, float] = defaultdict(float)
        for level in self.levels:
            for t in level.transfers:
                g = self.groups.get(t.tensor, -1)
                per_group[g].append(Transfer(t.op, t.tensor, t.bytes * level.groups))
                total[g] += t.bytes * level.groups
        ranked = sorted(total, key=total.get, reverse=True)[:count]
        return [(g, total[g], sorted(per_group[g], key=lambda t: -t.bytes)) for g in ranked]

    def __str__(self) -> str:
        lines = [f"Plan for {self.num_devices} devices "
                 f"({'x'.join(str(lvl.ways) for lvl in self.levels)}): "
                 f"{human_bytes(self.total_bytes)} moved per step (search model"
                 + (f"; the emitted step moves {human_bytes(self.predicted_bytes)}"
                    if self.predicted_per_level else "") + f"), {self.num_ops} ops in "
                 f"{self.num_groups} groups, variables {self.variable_storage}, searched in "
                 f"{self.search_seconds:.2f} s"
                 + ("" if self.exact else " (DP fallback used: not proven optimal)")]
        if self.per_device_peak_bytes:
            lines.append(f"  memory: peak {human_bytes(self.peak_bytes)} per device "
                         f"(one device, unpartitioned: {human_bytes(self.single_device_peak_bytes)}"
                         f"; ideal 1/{self.num_devices}: "
                         f"{human_bytes(self.single_device_peak_bytes / self.num_devices)})")
        if self.step_seconds is not None:
            lines.append(f"  predicted step: {self.step_seconds:.4g} s (the simulator, "
                         "which chose this plan)")
        if self.stages:
            counts = [0] * self.levels[0].ways
            for stage in self.stages.values():
                counts[stage] += 1
            lines.append(f"  pipeline: {len(counts)} stages of "
                         f"{self.num_devices // len(counts)} devices, ops per stage "
                         + ", ".join(map(str, counts)))
        if self.early_updates or self.recompute:
            lines.append("  step rewrites: " + "; ".join(
                (["updates early, gradient sums running"] if self.early_updates else []) +
                ([f"{len(self.recompute)} forward ops recomputed in the backward pass"]
                 if self.recompute else [])))
        for i, level in enumerate(self.levels):
            lines.append(f"  level {i + 1}: {level.ways}-way cut x {level.groups} group(s): "
                         f"{human_bytes(level.total_bytes)}"
                         + (f" (emitted step: {human_bytes(self.predicted_per_level[i])})"
                            if self.predicted_per_level else "")
                         + (f"; repeated work priced as {human_bytes(level.groups * level.work)}"
                            if level.work else ""))
        lines.append("  heaviest tensor groups:")
        for g, total, transfers in self.heaviest_groups():
            top = transfers[0]
            why = (f"{top.op} ({self.op_types.get(top.op, '?')}, "
                   f"{self._choice(top.op)}) moves {human_bytes(top.bytes)} of {top.tensor} "
                   f"[{self._state(top.tensor)}]")
            lines.append(f"    {human_bytes(total):>10s}  group {g}: {why}"
                         + (f"; +{len(transfers) - 1} more" if len(transfers) > 1 else ""))
        return "\n".join(lines)

    def _choice(self, op: str) -> str:
        return "/".join(f"stage {self.stages[op]}" if i == 0 and op in self.stages
                        else level.choices.get(op, "?") for i, level in enumerate(self.levels))

    def _state(self, tensor: str) -> str:
        return "/".join(self.state(i, tensor) if tensor in self.groups else "?"
                        for i in range(len(self.levels)))


def human_bytes(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(num_bytes) < 1024 or unit == "GiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} GiB"


def plan_from_search(result: SearchResult, graph: Graph) -> Plan:
    levels = []
    for level, spec, groups in zip(result.levels, result.topology.levels, result.multipliers):
        group_states = {result.coarse.group_of[t]: str(s) for t, s in level.states.items()
                        if viewed(t) is None}
        choices = {op: c for op, c in level.choices.items() if viewed(op) is None}
        levels.append(LevelPlan(
            spec.ways, spec.bandwidth, spec.latency, groups, group_states, choices,
            level.bytes, level.exact, tuple(_transfer(graph, op, t, b)
                                            for op, t, b in level.breakdown), level.work))
    peak = result.memory.peak_bytes if result.memory is not None else 0
    single = result.unpartitioned or single_device_peak(graph)
    return Plan(tuple((lvl.ways, lvl.bandwidth, lvl.latency) for lvl in result.topology.levels),
                tuple(levels), len(graph), result.coarse.num_groups, result.seconds,
                dict(result.coarse.group_of), {op.name: op.type for op in graph},
                result.variable_storage.value, (peak,) * result.topology.num_devices,
                single.peak_bytes)


def _transfer(graph: Graph, op: str, tensor: str, moved: float) -> Transfer:
    """A search transfer in the graph's names: a view's (problem.with_views) is its
    tensor's, the view's assembly its producer's conversion."""
    seen = viewed(tensor)
    if seen is None:
        return Transfer(op, tensor, moved)
    return Transfer(graph.producer(seen).name if viewed(op) else op, seen, moved)


# Memory weights a budgeted search tries: bytes moved per byte stored on a device.
MIN_MEMORY_WEIGHT, MAX_MEMORY_WEIGHT, WEIGHT_STEPS = 2.0 ** -6, 2.0 ** 16, 6


def search_within_budget(graph: Graph, topology: Topology, options: Options) -> SearchResult:
    """Least bytes moved among plans that fit the budget: the plain optimum if it fits,
    else searches that also weigh the bytes each device stores, the weight bisected (in
    log scale) down to the smallest that still fits."""
    with SearchCache() as cache:
        return _within_budget(graph, topology, options, cache)


def _within_budget(graph: Graph, topology: Topology, options: Options,
                   cache: SearchCache) -> SearchResult:
    budget = options.memory_budget_bytes
    deadline = deadline_of(options)
    tried: list[SearchResult] = []

    def run(weight: float) -> SearchResult:
        result = search(graph, topology, options=options, memory_weight=weight, cache=cache,
                        deadline=deadline)
        logging.info("memory weight %g: peak %s per device (budget %s), %s moved", weight,
                     human_bytes(result.memory.peak_bytes), human_bytes(budget),
                     human_bytes(result.total_bytes))
        tried.append(result)
        return result

    def fits(result: SearchResult) -> bool:
        return result.memory.peak_bytes <= budget

    if not fits(run(0.0)) and fits(run(MAX_MEMORY_WEIGHT)):
        low, high = math.log2(MIN_MEMORY_WEIGHT), math.log2(MAX_MEMORY_WEIGHT)
        for _ in range(WEIGHT_STEPS):
            middle = (low + high) / 2
            low, high = (low, middle) if fits(run(2.0 ** middle)) else (middle, high)
    fitting = [r for r in tried if fits(r)]
    if not fitting:
        smallest = min(tried, key=lambda r: r.memory.peak_bytes)
        raise PlanInfeasibleError(
            f"no plan over {topology.num_devices} devices fits a memory budget of "
            f"{human_bytes(budget)} per device: the smallest estimated peak found is "
            f"{human_bytes(smallest.memory.peak_bytes)} (error.best_plan).",
            best_peak_bytes=smallest.memory.peak_bytes,
            best_plan=plan_from_search(smallest, graph),
            fix=f"raise the budget to at least {smallest.memory.peak_bytes} bytes, use "
                "more devices, or a smaller batch.")
    return min(fitting, key=lambda r: r.cost(options.objective))


def make_plan(graph: Graph, topology: Topology | None = None, *, num_devices: int | None = None,
              options: Options = Options()) -> Plan:
    """Search the plan of `graph` over `topology` (or num_devices) that moves the fewest
    bytes, repeated computation priced in bytes (`Options.flop_bytes`); with
    `options.memory_budget_bytes`, the least such plan found that fits."""
    topology = topology or Topology.default(num_devices)
    with paused_gc():      # the plan's memory figures walk the whole graph too
        if options.pipeline_stages == 0:
            return _stage_count_search(graph, topology, options)
        if options.pipeline_stages > 1:
            return _pipeline_plan(graph, topology, options)
        return _make_plan(graph, topology, options)


def _pipeline_plan(graph: Graph, topology: Topology, options: Options,
                   timed: bool = False) -> Plan:
    """The plan over one stage's devices, with the stage level in front (search/pipeline.py):
    each op's stage from the step the plan partitions, and each device's memory estimate
    (and step time: `timed`) from its own stage's ops."""
    from tofu_tf.search.pipeline import split_topology
    start = time.perf_counter()
    stage_level, inner = split_topology(topology, options.pipeline_stages)
    plan = _make_plan(graph, inner, options, timed)   # memory per stage (recursive._search)
    plan = _with_stage_level(plan, stage_level)
    return dataclasses.replace(plan, search_seconds=time.perf_counter() - start)


def _with_stage_level(plan, stage_level: Level):
    """`plan` (searched for one stage's devices, its `stages` those of the graph it
    partitions: `_searched_plan`) with the stage level prepended: every tensor stored R
    and every op a `replicate` there (each group would run all of it), the stages saying
    which group runs each op (partition.py keeps the others idle)."""
    groups = set(plan.groups.values())
    level = LevelPlan(stage_level.ways, stage_level.bandwidth, stage_level.latency, 1,
                      {g: "R" for g in sorted(groups)}, {}, 0.0, True)
    n = stage_level.ways * plan.num_devices
    peaks = plan.per_device_peak_bytes
    return dataclasses.replace(
        plan, topology=((stage_level.ways, stage_level.bandwidth, stage_level.latency),)
        + tuple(plan.topology), levels=(level,) + tuple(plan.levels),
        per_device_peak_bytes=(peaks[0],) * n if peaks else ())


def _stage_count_search(graph: Graph, topology: Topology, options: Options) -> Plan:
    """Options.pipeline_stages = 0: every stage count that cuts the devices into groups of
    two or more (1: no pipeline) planned as asked (budget, recomputation), and the plan
    predicted fastest on the step profile kept (ties: fewer stages); none fitting, the
    error of the count that came closest."""
    from tofu_tf.search.pipeline import stage_counts
    start = time.perf_counter()
    n = topology.num_devices
    planned, failures = [], []
    for count in [1] + stage_counts(n):
        counted = dataclasses.replace(options, pipeline_stages=count)
        try:
            plan = (_pipeline_plan(graph, topology, counted, timed=True) if count > 1
                    else _make_plan(graph, topology, counted, timed=True))
        except PlanInfeasibleError as e:
            logging.info("%d pipeline stage(s): %s", count, e)
            failures.append(e)
            continue
        logging.info("%d pipeline stage(s): peak %s, predicted step %.4f s", count,
                     human_bytes(plan.peak_bytes), plan.step_seconds)
        planned.append((plan.step_seconds, count, plan))
    if not planned:
        raise min(failures, key=lambda e: e.best_peak_bytes or math.inf)
    plan = min(planned, key=lambda p: p[:2])[2]
    return dataclasses.replace(plan, search_seconds=time.perf_counter() - start)


def _make_plan(graph: Graph, topology: Topology, options: Options,
               timed: bool = False) -> Plan:
    """`timed`: with the simulator's step time (Plan.step_seconds)."""
    if options.recompute is not Recompute.NONE or options.early_updates:
        return _transformed_plan(graph, topology, options, timed)
    start = time.perf_counter()
    if options.fastest_step:
        result = _fastest_step(graph, topology, options)
    elif options.memory_budget_bytes is None:
        result = search(graph, topology, options=options)
    else:
        result = search_within_budget(graph, topology, options)
    plan = _searched_plan(result, graph, options, timed)
    return dataclasses.replace(plan, search_seconds=time.perf_counter() - start)


def _searched_plan(result: SearchResult, graph: Graph, options: Options,
                   timed: bool) -> Plan:
    """The plan of a search of `graph`, with the stage of each op where the search planned
    one stage's devices of `options.pipeline_stages` (`_with_stage_level` adds the level),
    and with the simulator's step time where `timed`."""
    plan = plan_from_search(result, graph)
    stages = _stages(graph, options)
    if stages:
        plan = dataclasses.replace(plan, stages=stages)
    if timed:
        plan = dataclasses.replace(plan, step_seconds=_step_seconds(graph, result, options))
    return plan


def _stages(graph: Graph, options: Options) -> dict[str, int] | None:
    """op -> stage over `options.pipeline_stages` stages (search/pipeline.py; the search
    estimated each stage's memory by the same map), None without stages."""
    from tofu_tf.search.pipeline import assign_stages
    return (assign_stages(graph, options.pipeline_stages)
            if options.pipeline_stages > 1 else None)


def _step_seconds(graph: Graph, result: SearchResult, options: Options) -> float:
    """The simulator's step time of a search result on the options' step profile, as one
    stage's devices of `options.pipeline_stages` where there are several."""
    from tofu_tf.search.simulate import plan_step_time, step_profile
    return plan_step_time(graph, result, step_profile(options),
                          stages=_stages(graph, options)).seconds


# Memory weights `Options.fastest_step` searches at (0: the fewest bytes).
STEP_WEIGHTS = (0.0, 2.0 ** -6, 2.0 ** -2, 1.0, 4.0)


def _fastest_step(graph: Graph, topology: Topology, options: Options) -> SearchResult:
    """The plan predicted fastest on `options.step_profile` among the searches at
    STEP_WEIGHTS that fit the budget (none fitting: the budgeted search's answer)."""
    with SearchCache() as cache:
        return _fastest_with(graph, topology, options, cache)


def _fastest_with(graph: Graph, topology: Topology, options: Options,
                  cache: SearchCache) -> SearchResult:
    deadline = deadline_of(options)
    budget = options.memory_budget_bytes
    timed = []
    for weight in STEP_WEIGHTS:
        result = search(graph, topology, options=options, memory_weight=weight, cache=cache,
                        deadline=deadline)
        if budget is None or result.memory.peak_bytes <= budget:
            seconds = _step_seconds(graph, result, options)
            logging.info("memory weight %g: predicted step %.4f s, %s moved", weight, seconds,
                         human_bytes(result.total_bytes))
            timed.append((seconds, result.total_bytes, result))
    if not timed:
        return search_within_budget(graph, topology, options)
    return min(timed, key=lambda t: t[:2])[2]


def step_graph(graph: Graph, plan: Plan) -> Graph:
    """The graph `plan` partitions: `graph` with the plan's early updates
    (reorder.updates_early) and recomputed ops (recompute.recompute), in that order."""
    from tofu_tf.search.recompute import recompute
    from tofu_tf.search.reorder import updates_early
    if plan.early_updates:
        graph = updates_early(graph)
    return recompute(graph, plan.recompute) if plan.recompute else graph


def _transformed_plan(graph: Graph, topology: Topology, options: Options,
                      timed: bool = False) -> Plan:
    """The plan of `graph` rewritten to hold less (`Plan.early_updates`, `Plan.recompute`;
    `step_graph` rebuilds the graph it partitions). Recompute.AUTO: every mix of NONE,
    CHEAP and SEGMENTS recomputation, each with the updates as given and early, searched
    within the budget; of those that fit, the fastest by the simulator on
    `options.step_profile` (search/simulate.py; ties: the least recomputation); none
    fitting, the error names the smallest peak any of them reached."""
    from tofu_tf.op_semantics.catalog import catalog
    from tofu_tf.search.recompute import candidates, recompute
    from tofu_tf.search.reorder import updates_early
    start = time.perf_counter()
    mixes = [(options.early_updates, options.recompute)]
    if options.recompute is Recompute.AUTO:
        if options.memory_budget_bytes is None:
            raise TofuError("recompute=auto chooses by the memory budget, and none is set.",
                            fix="set Options.memory_budget_bytes, or name a policy.")
        mixes = [(early, policy) for policy in (Recompute.NONE, Recompute.CHEAP,
                                                Recompute.SEGMENTS)
                 for early in dict.fromkeys((options.early_updates, True))]
    plain = dataclasses.replace(options, recompute=Recompute.NONE, early_updates=False)
    fitting: list[tuple[float, int, Plan]] = []
    failures: list[tuple[PlanInfeasibleError, bool, frozenset[str]]] = []
    for i, (early, policy) in enumerate(mixes):
        reordered = updates_early(graph) if early else graph
        ops = candidates(reordered, catalog(reordered), policy)
        rewritten = recompute(reordered, ops)
        try:
            if len(mixes) == 1:
                plan = _make_plan(rewritten, topology, plain, timed)
                seconds = plan.step_seconds or 0.0
            else:
                result = search_within_budget(rewritten, topology, plain)
                plan = _searched_plan(result, rewritten, plain, timed=True)
                seconds = plan.step_seconds
        except PlanInfeasibleError as e:
            if e.best_peak_bytes is None:           # not a budget (a time limit): say so
                raise
            failures.append((e, early, ops))
            logging.info("updates early %s, recompute %s: %s", early, policy.value, e)
            continue
        logging.info("updates early %s, recompute %s: peak %s, predicted step %.4f s", early,
                     policy.value, human_bytes(plan.peak_bytes), seconds)
        fitting.append((seconds, i, dataclasses.replace(plan, early_updates=early,
                                                         recompute=tuple(sorted(ops)))))
    if fitting:
        _, _, plan = min(fitting, key=lambda f: f[:2])
        return dataclasses.replace(plan, search_seconds=time.perf_counter() - start)
    best, early, ops = min(failures, key=lambda f: f[0].best_peak_bytes)
    if best.best_plan is not None:
        best.best_plan = dataclasses.replace(best.best_plan, early_updates=early,
                                             recompute=tuple(sorted(ops)))
    if len(failures) == 1:
        raise best
    raise PlanInfeasibleError(
        f"no plan over {topology.num_devices} devices fits a memory budget of "
        f"{human_bytes(options.memory_budget_bytes)} per device, with or without "
        f"recomputation: the smallest estimated peak found is "
        f"{human_bytes(best.best_peak_bytes)} (error.best_plan).",
        best_peak_bytes=best.best_peak_bytes, best_plan=best.best_plan,
        fix=f"raise the budget to at least {best.best_peak_bytes} bytes, use more devices, "
            "or a smaller batch.")
