"""Exact checks of the search: one cut by integer programming, and all levels jointly.

`ilp_level` solves one cut by ILP (search/ilp.py: HiGHS over the DP's own choices and
byte vectors) and `ilp_search` every level of the recursion so; `joint_optimum` is the
least total bytes over all levels' states and choices at once (search/joint.py), a lower
bound of every recursive plan, and `recursion_under` reruns the recursion with level 1
fixed to the joint optimum's: where it meets the joint optimum, the recursion's gap is all
in level 1, chosen by its own cost without the levels below.
"""

from __future__ import annotations

import dataclasses
import functools

from tofu_tf.errors import PlanInfeasibleError
from tofu_tf.graph import Graph
from tofu_tf.op_semantics.catalog import OpEntry
from tofu_tf.options import Options, VariableStorage
from tofu_tf.search.ilp import (DEFAULT_TIME_LIMIT, IlpSolution, Linearisation,  # noqa: F401
                                ilp_minimum)
from tofu_tf.search.joint import (MAX_JOINT_CHOICES, JointMethod, JointModel,  # noqa: F401
                                  JointSolution, StateTree, joint_model, state_tree)
from tofu_tf.search.level import (LevelModel, LevelResult, fixed_result, result_of,
                                  solve_level)
from tofu_tf.search.recursive import SearchResult, lookahead, search, upper_fixed
from tofu_tf.search.topology import Topology


def ilp_level(model: LevelModel, time_limit: float = DEFAULT_TIME_LIMIT,
              form: Linearisation = Linearisation.MARGINAL) -> LevelResult:
    """The optimum of one cut by ILP, as a LevelResult with `exact=True`. Raises
    PlanInfeasibleError when HiGHS fails or does not prove optimality in time."""
    solution = ilp_minimum(model, time_limit, form)
    if not solution.optimal:
        raise PlanInfeasibleError(
            f"HiGHS did not prove the cut's ILP optimal within {time_limit:g} s "
            f"({solution.variables} variables, {solution.constraints} constraints).",
            fix="raise time_limit, or use level.solve_level (the exact DP).")
    return result_of(model, solution.assignment, True, solution.seconds)


def ilp_search(graph: Graph, topology: Topology,
               time_limit: float = DEFAULT_TIME_LIMIT) -> SearchResult:
    """The recursive search with every level solved by ILP."""
    return search(graph, topology, solver=lambda model: ilp_level(model, time_limit))


def recursion_under(graph: Graph, topology: Topology,
                    first_level: tuple[tuple[int, ...], dict[str, str]], *,
                    entries: dict[str, OpEntry] | None = None,
                    options: Options = Options()) -> SearchResult:
    """The recursion with level 1 fixed to `first_level` (group state indices into the
    replicable policy's level-1 domains, and op choice labels, as `JointModel.first_level`
    gives them); the levels below are solved as usual. Under the joint optimum's level 1
    it splits the recursion's gap into what level 1, fixed by its own cost alone, loses
    and what the deeper levels lose: at two levels it is the joint optimum."""
    states, labels = first_level
    solver = upper_fixed([functools.partial(fixed_result, assignment=states, labels=labels)],
                         solve_level)
    return _replicable_search(graph, topology, solver, entries, options)


def lookahead_search(graph: Graph, topology: Topology, *,
                     entries: dict[str, OpEntry] | None = None,
                     options: Options = Options()) -> SearchResult:
    """The recursion with each level but the last fixed by the joint optimum of it and
    the level below (recursive.lookahead), under the replicable policy: the candidate
    Options.lookahead adds where the joint problem of all levels is too large. Raises
    recursive.NoLookahead where level 1's two-level problem is too large too."""
    solver = lookahead(topology.ways, solve_level, options.joint_choices)
    return _replicable_search(graph, topology, solver, entries, options)


def _replicable_search(graph, topology, solver, entries, options) -> SearchResult:
    """One recursion by `solver` (a stateful solver serves one recursion: the replicable
    policy only, whatever `options` say)."""
    return search(graph, topology, solver=solver, entries=entries,
                  options=dataclasses.replace(options,
                                              variable_storage=VariableStorage.REPLICABLE))


def joint_optimum(graph: Graph, topology: Topology,
                  method: JointMethod = JointMethod.DP,
                  time_limit: float = DEFAULT_TIME_LIMIT,
                  max_joint_choices: int = MAX_JOINT_CHOICES,
                  options: Options = Options()) -> float:
    """min over all levels' states and choices of c_1 + k_1 c_2 + k_1 k_2 c_3 + ...
    (bytes plus repeated work, search/level.py): a lower bound of every recursive plan's
    objective."""
    joint = joint_model(graph, topology, max_joint_choices=max_joint_choices,
                        options=options, method=method)
    return joint.solve(method, time_limit).cost
