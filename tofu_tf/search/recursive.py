"""Recursive search over a Topology: one exact cut per level, outermost first.

Level 1 cuts the whole graph k1 ways (dp over the coarse graph). The problem inside one
level-1 group — every tensor shrunk to its part, every op replaced by its part's local op
— is the same kind of problem, cut k2 ways; the k1 groups are alike, so it is solved once
and reused. And so on down the levels. The plan's objective is

    total = c_1 + k_1 * c_2 + k_1 * k_2 * c_3 + ...

in bytes (c_l is the level-l cut's cost inside one group: the bytes it moves plus the
price of the computation its replicated ops repeat, search/level.py), and in time each
c_l's bytes move over level l's links. The first cut, which moves the least data, crosses
the slowest links.

Each level fixed by its own cost alone may leave costlier levels below. Where the joint
problem of all levels is small (search/joint.py, `Options.joint_choices`) the search also
plans its optimum; at three or more levels where it is not, with `Options.lookahead`, the
lookahead: each level fixed by the joint optimum of it and the level below. The cheapest
plan wins.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from absl import logging

from tofu_tf import _forking
from tofu_tf._gc import paused_gc
from tofu_tf.errors import PlanInfeasibleError, TofuError
from tofu_tf.graph import Graph
from tofu_tf.op_semantics.analysis import REPLICATED
from tofu_tf.op_semantics.catalog import OpEntry, catalog
from tofu_tf.options import Objective, Options, VariableStorage
from tofu_tf.search.coarsen import CoarseGraph, coarsen
from tofu_tf.search import joint
from tofu_tf.search.level import (LevelModel, LevelResult, fixed_result,  # noqa: F401
                                  level_models, solve_level, variable_tensors,
                                  views_result)
from tofu_tf.search.memory import PlanMemory, plan_memory, single_device_peak
from tofu_tf.search.pipeline import assign_stages
from tofu_tf.search.cost import tensor_states
from tofu_tf.search.problem import Problem, SearchCache, root_problem, sub_problem
from tofu_tf.search.topology import Topology


# Graphs from this many ops log each level's progress at INFO (else DEBUG), and search
# the two storage policies of VariableStorage.AUTO at once, in two processes.
LARGE_GRAPH_OPS = 2000


@dataclass(frozen=True)
class SearchResult:
    topology: Topology
    levels: tuple[LevelResult, ...]
    coarse: CoarseGraph
    seconds: float
    variable_storage: VariableStorage = VariableStorage.REPLICABLE
    # Whether some level stores a variable replicated that the partitioned policy would
    # have to split. If not, that policy's recursion would find this very plan.
    replicates_variables: bool = False
    memory: PlanMemory | None = None      # one device's estimate (search/memory.py)
    # The unpartitioned graph's estimate on one device, where the search made it (a forked
    # child has the time while the caller finishes its own policy); else None.
    unpartitioned: PlanMemory | None = None
    # Whether the plan is proven a joint optimum of all levels (search/joint.py), not
    # only each level's optimum under the levels above.
    joint: bool = False
    # The last level's model and result: what one device holds and runs (memory, time).
    last: tuple[LevelModel, LevelResult] | None = dataclasses.field(
        default=None, repr=False, compare=False)

    def with_memory(self, graph: Graph, stages: Mapping[str, int] | None = None
                    ) -> "SearchResult":
        """With its memory estimate; `stages`: the pipeline stages its topology is one
        stage's devices of (search/pipeline.py), each device holding its stage's ops."""
        if self.memory is not None or self.last is None:
            return self
        return dataclasses.replace(self, memory=plan_memory(
            graph, device_problem(*self.last, describe=False), stages=stages))

    @property
    def multipliers(self) -> tuple[int, ...]:
        """How many groups solve each level's problem (1, k1, k1*k2, ...)."""
        return tuple(math.prod(self.topology.ways[:i]) for i in range(len(self.levels)))

    @property
    def bytes_per_level(self) -> tuple[float, ...]:
        return tuple(m * level.bytes for m, level in zip(self.multipliers, self.levels))

    @property
    def total_bytes(self) -> float:
        return float(sum(self.bytes_per_level))

    @property
    def total_work(self) -> float:
        """The work term of the plan's choices, in bytes (search/level.py)."""
        return float(sum(m * level.work for m, level in zip(self.multipliers, self.levels)))

    @property
    def objective(self) -> float:
        """What the search minimises: bytes moved, plus the price of the computation
        replicated ops repeat and of each transfer's latency (search/level.py)."""
        return float(sum(m * level.cost for m, level in zip(self.multipliers, self.levels)))

    @property
    def transfer_seconds(self) -> float:
        """Predicted transfer time of a step (as search/simulate.py): per level, the bytes
        of all its groups spread over every device on that level's links, plus each
        transfer's latency likewise spread."""
        n = self.topology.num_devices
        return sum(m * (level.bytes / spec.bandwidth + len(level.breakdown) * spec.latency) / n
                   for level, spec, m in zip(self.levels, self.topology.levels,
                                             self.multipliers))

    def cost(self, objective: Objective) -> float:
        """What candidate plans are ranked by: the search's objective, or under
        Objective.TIME the predicted transfer time alone (the prices stay in each level's
        own search)."""
        return self.transfer_seconds if objective is Objective.TIME else self.objective


def deadline_of(options: Options) -> float | None:
    """The perf_counter time a search starting now must stop by (None: no limit)."""
    limit = options.search_time_limit_s
    return None if limit is None else time.perf_counter() + limit


def check_deadline(deadline: float | None, options: Options, where: str) -> None:
    if deadline is not None and time.perf_counter() > deadline:
        raise PlanInfeasibleError(
            f"the search passed its time limit of {options.search_time_limit_s:g} s "
            f"({where}).",
            fix="raise Options(search_time_limit_s), plan fewer devices, or pass a stored "
                "plan (optimize(plan=...)).")


def search(graph: Graph, topology: Topology, *, solver=None,
           entries: dict[str, OpEntry] | None = None, options: Options = Options(),
           memory_weight: float = 0.0, cache: SearchCache | None = None,
           deadline: float | None = None) -> SearchResult:
    """Solve every level with `solver(LevelModel) -> LevelResult` (default: exact DP,
    minimising bytes moved plus `memory_weight` x bytes stored per device).

    With `options.variable_storage` AUTO the recursion runs under both storage policies
    for variables and the cheaper total wins: the recursion fixes each level before the
    next, and which policy makes the inner levels cheaper depends on the model. `cache`:
    work to share with other searches of the same graph. `deadline` (perf_counter
    seconds; default: now + options.search_time_limit_s) is checked at every level."""
    # a cache made here is ended here (SearchCache.__exit__); a caller's, by the caller
    context = SearchCache() if cache is None else contextlib.nullcontext(cache)
    with paused_gc(), context as cache:
        return _search(graph, topology, solver, entries, options, memory_weight, cache,
                       deadline if deadline is not None else deadline_of(options))


def _search(graph, topology, solver, entries, options, memory_weight, cache,
            deadline) -> SearchResult:
    start = time.perf_counter()
    exact_dp = solver is None         # a caller's solver (a baseline) plans level by level
    solver = solver or functools.partial(solve_level, max_table=options.max_dp_table,
                                         beam=options.dp_beam, memory_weight=memory_weight)
    entries = entries if entries is not None else catalog(graph, strict=options.strict)
    coarse = coarsen(graph, entries)
    policies = ([VariableStorage.REPLICABLE, VariableStorage.PARTITIONED]
                if options.variable_storage is VariableStorage.AUTO
                else [options.variable_storage])
    # `topology` is one pipeline stage's devices: memory is each stage's own
    stages = (assign_stages(graph, options.pipeline_stages)
              if options.pipeline_stages > 1 else None)

    def run(policy: VariableStorage) -> SearchResult:
        return _recurse(graph, topology, entries, coarse, options, policy, solver, cache,
                        deadline)

    # More candidates than the recursion's (joint, lookahead, priced with views): for the
    # exact DP over several levels, where memory does not decide.
    candidates = exact_dp and len(topology.levels) > 1 and not memory_weight
    # With shared reads, the recursion's plan without them priced with them is two
    # candidates more (_repriced: its choices kept, or chosen again), which need nothing
    # of the policies' searches: where those run in two processes, one goes to each.
    repricing = []
    if candidates and options.shared_reads and options.joint_choices:
        plain = functools.cache(lambda: _upper_levels(
            graph, topology, entries, coarse, dataclasses.replace(options, shared_reads=False),
            policies[0], solver, cache, deadline))

        def reprice(keep: bool) -> SearchResult:
            return _repriced(graph, topology, entries, coarse, options, policies[0], plain(),
                             solver, cache, deadline, keeps=(keep,))
        repricing = [functools.partial(reprice, keep) for keep in (True, False)]
    if len(policies) == 2 and len(graph) >= LARGE_GRAPH_OPS and _forking.available():
        results, repriced = _both_policies(graph, coarse, run, estimate=bool(memory_weight),
                                           stages=stages, here=repricing[:1],
                                           there=repricing[1:])
    else:
        results = []
        for policy in policies:
            if results and policy is VariableStorage.PARTITIONED and \
                    not results[0].replicates_variables:
                break  # the replicable optimum is feasible and optimal for this policy too
            results.append(run(policy))
        repriced = [reprice() for reprice in repricing]
    objective = options.objective
    joint_plan = None
    if candidates:
        joint_plan = _joint(graph, topology, entries, coarse, options, solver, cache,
                            deadline)
        if joint_plan is not None:
            results.append(joint_plan)
        elif options.lookahead and len(topology.levels) > 2 and \
                len(graph) <= options.joint_choices:
            ahead = _lookahead(graph, topology, entries, coarse, options, solver, cache,
                               deadline)
            if ahead is not None:
                results.append(ahead)
    results.extend(repriced)
    if memory_weight:          # memory decides too: estimate every candidate
        results = [r.with_memory(graph, stages) for r in results]
        best = min(results, key=lambda r: r.objective + memory_weight * r.memory.peak_bytes)
    else:
        best = min(results, key=lambda r: r.cost(objective))   # ties: the recursion's
        if joint_plan is not None and joint_plan.joint and \
                best.objective <= joint_plan.objective:
            best = dataclasses.replace(best, joint=True)        # it is a joint optimum too
    if best.last is None:      # the forked child's plan won: rebuild its last level's model
        best = dataclasses.replace(best, last=_replay(
            graph, topology, entries, coarse, options, best.variable_storage, cache,
            best.levels))
    return dataclasses.replace(best.with_memory(graph, stages),
                               seconds=time.perf_counter() - start)


def _joint(graph, topology, entries, coarse, options, solver, cache, deadline
           ) -> SearchResult | None:
    """The plan of the joint optimum of all levels (search/joint.py), where that problem
    has at most `options.joint_choices` joint choices: every level but the last fixed to
    the joint optimum's states and choices, the last solved by `solver` (at least as good
    under them: so the plan moves exactly the joint optimum's bytes). None where it is
    larger or the joint DP would not be exact. Under either storage policy of AUTO the
    replicable one: its plans include the partitioned one's.

    With `options.shared_reads`, views (problem.with_views) add ops and groups, and the
    joint problem outgrows its bounds sooner: then the joint optimum without views fixes
    the groups of every level but the last, the views' states are chosen under them
    (level.views_result), and the plan, priced with views, is one more candidate."""
    if joint.least_joint_choices(graph, entries, topology.ways) > options.joint_choices:
        return None                 # past the limit with or without views
    storage = _storage(options)
    start = time.perf_counter()
    for tried in _view_tries(options):
        check_deadline(deadline, options, "before the joint search")
        ilp_seconds = options.joint_ilp_seconds
        if deadline is not None and ilp_seconds > 0:   # HiGHS stops by the search's limit
            ilp_seconds = min(ilp_seconds, max(deadline - time.perf_counter(), 1e-3))
        try:
            model, best = joint.optimum(functools.partial(
                joint.joint_model, graph, topology, entries=entries, coarse=coarse,
                options=tried, storage=storage, cache=cache,
                max_joint_choices=options.joint_choices), ilp_seconds)
            break
        except TofuError as err:     # too large, or neither the DP nor HiGHS exact
            logging.debug("no joint search (shared reads %s): %s", tried.shared_reads, err)
    else:
        return None
    fixed = model.fixed_levels(best.leaves)
    if tried is not options:                      # the joint optimum without views
        return _repriced(graph, topology, entries, coarse, options, storage, fixed, solver,
                         cache, deadline)
    solve = upper_fixed([functools.partial(fixed_result, assignment=states, labels=labels)
                         for states, labels in fixed], solver)
    result = _recurse(graph, topology, entries, coarse, options, storage, solve, cache,
                      deadline)
    if not math.isclose(result.objective, best.cost, rel_tol=1e-9, abs_tol=1e-6):
        raise PlanInfeasibleError(
            f"the plan under the joint optimum's levels costs {result.objective:.0f} B, "
            f"the joint optimum {best.cost:.0f} B; they must agree.",
            fix="report this; Options(joint_choices=0) plans by the recursion alone.")
    logging.debug("joint search: %.0f B in %.2f s", best.cost, time.perf_counter() - start)
    return dataclasses.replace(result, joint=True)


def _lookahead(graph, topology, entries, coarse, options, solver, cache, deadline
               ) -> SearchResult | None:
    """The lookahead plan (`lookahead`), or None where level 1's two-level problem is too
    large. With `options.shared_reads`, as `_joint`: where the views make it too large,
    the lookahead without views fixes every level but the last, and the plan is priced
    with them (`_repriced`)."""
    storage = _storage(options)
    for tried in _view_tries(options):
        ahead = lookahead(topology.ways, solver, options.joint_choices)
        try:
            if tried is options:
                return _recurse(graph, topology, entries, coarse, tried, storage, ahead,
                                cache, deadline)
            upper = _upper_levels(graph, topology, entries, coarse, tried, storage, ahead,
                                  cache, deadline)
        except NoLookahead as err:
            logging.debug("no lookahead (shared reads %s): %s", tried.shared_reads, err)
            continue
        return _repriced(graph, topology, entries, coarse, options, storage, upper, solver,
                         cache, deadline)
    return None


def _view_tries(options: Options) -> list[Options]:
    """The options a joint or lookahead search tries in turn: `options`, and with shared
    reads the same without views (their plans are then priced with views, `_repriced`)."""
    return [options] + ([dataclasses.replace(options, shared_reads=False)]
                        if options.shared_reads else [])


def _storage(options: Options) -> VariableStorage:
    """The storage policy a joint search plans under: under either of AUTO the
    replicable one, whose plans include the partitioned one's."""
    return (VariableStorage.PARTITIONED
            if options.variable_storage is VariableStorage.PARTITIONED
            else VariableStorage.REPLICABLE)


class NoLookahead(Exception):
    """Level 1's two-level problem is too large: the lookahead plan would be the
    recursion's."""


def lookahead(ways: tuple[int, ...], solver, max_joint_choices: int
              ) -> Callable[[LevelModel], LevelResult]:
    """A solver for one recursion that fixes each level but the last by the joint
    optimum of it and the level below (joint.joint_below over two levels): each choice
    priced by what it leaves one level down, where the joint problem of all levels is
    too large. Not the joint optimum of all levels (each window leaves out the levels
    below it), but it closes most of the recursion's gap (bench/results/search.md). A
    deeper level whose two-level problem is too large, and the last, by `solver`; raises
    NoLookahead where level 1's is."""
    levels = iter(range(len(ways)))

    def solve(model: LevelModel) -> LevelResult:
        level = next(levels)
        if level + 1 < len(ways):
            try:
                window = joint.joint_below(model, ways[level:level + 2], max_joint_choices)
                states, labels = window.first_level(window.solve().leaves)
                return fixed_result(model, states, labels)
            except TofuError as err:              # too large, or the DP not exact
                if level == 0:
                    raise NoLookahead(str(err)) from err
                logging.debug("no lookahead at level %d: %s", level + 1, err)
        return solver(model)
    return solve


def _repriced(graph, topology, entries, coarse, options, storage, upper, solver, cache,
              deadline, keeps: Sequence[bool] = (True, False)) -> SearchResult:
    """A plan of the search without views, priced with them (`options.shared_reads`): every
    level but the last in the states `upper` gives it (per level, the states and choices
    of the model without views), the views' states chosen under them
    (level.views_result), the last level solved by `solver`. Views bring each level's
    account closer to what the emitter moves and so move each level's optimum; but the
    recursion fixes a level by its own cost alone, without the levels below, and the
    upper levels the account without views chose may leave cheaper ones below (the tiny
    LSTM at 2x2x2: 346580 B against 362536 B with views throughout, both priced with
    views). The ops' choices there are kept, or chosen again by the views' account at
    their level alone; neither is always the cheaper in all (kept: the LSTM-4-4096 at
    2x2 1.7% less, a bias gradient's sum not reading a gradient gathered at level 1;
    chosen again: the tiny WResNet at 2x4, bytes alone, 1.1% less), so both are priced
    and the cheaper is the plan (of those `keeps` names)."""
    plans = [_recurse(graph, topology, entries, coarse, options, storage, upper_fixed(
        [functools.partial(views_result, assignment=states, labels=labels if keep else {})
         for states, labels in upper], solver), cache, deadline) for keep in keeps]
    return min(plans, key=lambda r: r.cost(options.objective))


def upper_fixed(upper: Sequence[Callable[[LevelModel], LevelResult]], solver
                ) -> Callable[[LevelModel], LevelResult]:
    """A solver for one recursion: level i by `upper[i]` (each a function of the level's
    model, fixing what an outer search chose), every level past them by `solver`."""
    fixes = iter(upper)

    def solve(model: LevelModel) -> LevelResult:
        fix = next(fixes, None)
        return solver(model) if fix is None else fix(model)
    return solve


def _replay(graph, topology, entries, coarse, options, policy, cache, levels
            ) -> tuple[LevelModel, LevelResult]:
    """The last level's model under the chosen `levels` (no level is solved again)."""
    models = level_models(graph, topology, entries, coarse, options, policy, cache)
    model = next(models)
    for result in levels[:-1]:
        model = models.send(result)
    return model, levels[-1]


def _both_policies(graph: Graph, coarse: CoarseGraph, run, estimate: bool, stages=None,
                   here: Sequence[Callable[[], SearchResult]] = (),
                   there: Sequence[Callable[[], SearchResult]] = ()
                   ) -> tuple[list[SearchResult], list[SearchResult]]:
    """The replicable policy here while a forked process searches the partitioned one
    from the same catalog and coarse graph; then the searches `here` here, and `there`
    in the child after its policy: (the policies' results, those of `here` and `there`
    in order). The partitioned policy's result counts where the replicable plan
    replicates a variable. The child's results come back without their last level's
    model (rebuilt here if one wins), the partitioned one with its memory estimate only
    when memory decides (`estimate`), else made here for the winner; and with the
    unpartitioned graph's estimate (both policies' results get it). The child computes
    overlaps with NumPy (`_forking`: same answers)."""
    def portable(result: SearchResult) -> SearchResult:
        return dataclasses.replace(result, coarse=None, last=None)

    def child() -> tuple[SearchResult, list[SearchResult]]:
        result = run(VariableStorage.PARTITIONED)
        if estimate:
            result = result.with_memory(graph, stages)
        result = dataclasses.replace(portable(result),
                                     unpartitioned=single_device_peak(graph))
        return result, [portable(search()) for search in there]

    def fallback() -> tuple[SearchResult, list[SearchResult]]:
        return run(VariableStorage.PARTITIONED), [search() for search in there]

    with _forking.Forked(child) as forked:
        first = run(VariableStorage.REPLICABLE)
        mine = [search() for search in here]
        if not first.replicates_variables and not there:
            return [first], mine
        first = first.with_memory(graph, stages)   # while the child finishes (it may not win)
        second, theirs = forked.result(fallback=fallback)
        first = dataclasses.replace(first, unpartitioned=second.unpartitioned)
        policies = [first] + ([dataclasses.replace(second, coarse=coarse)]
                              if first.replicates_variables else [])
        return policies, mine + [dataclasses.replace(r, coarse=coarse) for r in theirs]


def _upper_levels(graph, topology, entries, coarse, options, policy, solver,
                  cache: SearchCache, deadline: float | None = None
                  ) -> list[tuple[tuple[int, ...], dict[str, str]]]:
    """Every level but the last of the recursion's plan, as `upper_fixed` takes them (per
    level, the groups' states and the ops' choices); the last level is not built."""
    models, upper = level_models(graph, topology, entries, coarse, options, policy, cache), []
    model = next(models)
    for index in range(len(topology.levels) - 1):
        check_deadline(deadline, options, f"before level {index + 1} of "
                                          f"{len(topology.levels)} of the plan without views")
        result = solver(model)
        upper.append((result.assignment, result.choices))
        if index + 2 < len(topology.levels):
            model = models.send(result)
    return upper


def _recurse(graph, topology, entries, coarse, options, policy, solver,
             cache: SearchCache, deadline: float | None = None) -> SearchResult:
    start = time.perf_counter()
    results, replicates = [], False
    models = level_models(graph, topology, entries, coarse, options, policy, cache)
    model = next(models)
    while True:
        check_deadline(deadline, options, f"before level {len(results) + 1} of "
                                          f"{len(topology.levels)}, {policy.value} variables")
        results.append(solver(model))
        logging.log(logging.INFO if len(graph) >= LARGE_GRAPH_OPS else logging.DEBUG,
                    "level %d/%d (%d-way, %s variables): %d groups, %.0f bytes per group, "
                    "%.2f s", len(results), len(topology.levels), model.problem.k,
                    policy.value, len(model.domains), results[-1].bytes,
                    time.perf_counter() - start)
        replicates = replicates or _replicates_variables(model, results[-1], options)
        try:
            model = models.send(results[-1])
        except StopIteration:
            break
    return SearchResult(topology, tuple(results), coarse, time.perf_counter() - start, policy,
                        replicates, last=(model, results[-1]))


def device_problem(model: LevelModel, result: LevelResult, describe: bool = True) -> Problem:
    """What one device (part 0 of every cut) holds and runs under the last level's result:
    the problem inside its part, for a cut into one (`describe` False: what it holds, the
    ops' shapes only)."""
    return sub_problem(model.problem, result.states, result.choices, 1, describe=describe)


def _replicates_variables(model: LevelModel, result: LevelResult, options: Options) -> bool:
    """A replicable tensor stored R where the partitioned policy would not allow R."""
    problem = model.problem
    for tensor in problem.replicable:
        if result.states.get(tensor) == REPLICATED:
            spec = problem.tensors[tensor]
            if REPLICATED not in tensor_states(spec.shape, problem.k, options.replicate_below):
                return True
    return False
