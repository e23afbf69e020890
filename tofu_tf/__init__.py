"""tofu_tf: partition a TensorFlow training step across N devices, operator by operator."""

from tofu_tf.errors import (DescriptionError, DynamicShapeError, GraphImportError,
                            PartitionError, PlanInfeasibleError, RegistryError, RewriteError,
                            TofuError, UnsupportedOpError)
from tofu_tf.graph import Graph, Op, Role, Tensor, Variable

__all__ = [
    "DescriptionError", "DynamicShapeError", "Graph", "GraphImportError", "Op",
    "PartitionError", "PlanInfeasibleError", "RegistryError", "RewriteError", "Role",
    "Tensor", "TofuError", "UnsupportedOpError", "Variable",
]
