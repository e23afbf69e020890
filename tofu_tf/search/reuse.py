"""Checks that a stored plan fits the graph it is applied to.

`optimize(..., plan=Plan.from_json(text))` skips the search. The plan names every op
(with its type), every tensor's coarse group and, per level, each op's strategy label; the
partition would quietly replicate an op the plan does not name. So before a plan is
used, `check_plan` compares it with the graph in the graph's order and raises
`PlanMismatchError` at the first difference: the device topology, an op missing from the
plan or of another type, an op the graph lacks, a tensor without a group, or a strategy
label the op's description cannot derive. Splits are positions in each op's index space,
so a plan made for other sizes of the same ops applies (its byte figures are then those of
the sizes it was made for).
"""

from __future__ import annotations

from typing import Mapping

from tofu_tf.errors import PlanMismatchError
from tofu_tf.graph import Graph
from tofu_tf.op_semantics.catalog import OpEntry
from tofu_tf.search.plan import Plan
from tofu_tf.search.problem import REPLICATE
from tofu_tf.search.topology import Topology

FIX = "plan this graph again (omit plan=), or pass the plan made for this graph."


def check_plan(plan: Plan, graph: Graph, topology: Topology,
               entries: Mapping[str, OpEntry]) -> None:
    """Raises `PlanMismatchError` at the first place `plan` does not fit `graph`."""
    ways = tuple(int(level[0]) for level in plan.topology)
    if ways != topology.ways:
        raise PlanMismatchError(
            f"the plan is for levels {'x'.join(map(str, ways))} ({plan.num_devices} "
            f"devices) and the topology is {'x'.join(map(str, topology.ways))}.",
            fix="pass the plan's topology (or none: the plan's is used), or " + FIX)
    for op in graph:
        planned = plan.op_types.get(op.name)
        if planned is None:
            raise PlanMismatchError("the op is not in the plan.", node=op.name,
                                    op_type=op.type, fix=FIX)
        if planned != op.type:
            raise PlanMismatchError(f"the plan has this op as a {planned}.", node=op.name,
                                    op_type=op.type, fix=FIX)
        for tensor in op.outputs:
            if tensor not in plan.groups:
                raise PlanMismatchError(f"output {tensor} has no group in the plan.",
                                        node=op.name, op_type=op.type, fix=FIX)
        labels = {s.label for s in entries[op.name].strategies} | {REPLICATE}
        for number, level in enumerate(plan.levels):
            label = level.choices.get(op.name, REPLICATE)
            if label not in labels:
                raise PlanMismatchError(
                    f"level {number} of the plan splits it as '{label}'; its description "
                    f"derives {sorted(labels)}.", node=op.name, op_type=op.type, fix=FIX)
    names = {op.name for op in graph}
    extra = [name for name in plan.op_types if name not in names]
    if extra:
        raise PlanMismatchError(f"the plan has {len(extra)} ops the graph lacks.",
                                node=extra[0], op_type=plan.op_types[extra[0]], fix=FIX)

