"""tofu_tf: partition a TensorFlow training step across N devices, operator by operator."""

from tofu_tf.errors import (DescriptionError, DynamicShapeError, GraphImportError,
                            PartitionError, PlanInfeasibleError, PlanMismatchError, RegistryError,
                            RewriteError,
                            TofuError, UnsupportedOpError, WorkerError)
from tofu_tf.graph import Graph, Op, Role, Tensor, Variable
from tofu_tf.options import Objective, Options, Recompute, VariableStorage
from tofu_tf.search.plan import Plan
from tofu_tf.search.topology import Topology

__all__ = [
    "DescriptionError", "DynamicShapeError", "Graph", "GraphImportError", "Objective", "Op",
    "Options",
    "PartitionError", "Plan", "PlanInfeasibleError", "PlanMismatchError", "Recompute",
    "RegistryError", "RewriteError", "Role",
    "Tensor", "TofuError", "Topology", "UnsupportedOpError", "Variable", "VariableStorage",
    "WorkerError",
    "KerasTrainStep", "function", "optimize",
]


def __getattr__(name: str):
    """`optimize` and `function` import TensorFlow: loaded on first use, so the planner
    (`import tofu_tf`, `tofu_tf.search`) stays free of it."""
    if name == "optimize":
        from tofu_tf.api import optimize
        return optimize
    if name == "function":
        from tofu_tf.api import function
        return function
    if name == "KerasTrainStep":
        from tofu_tf.api import KerasTrainStep
        return KerasTrainStep
    raise AttributeError(f"module 'tofu_tf' has no attribute '{name}'")
