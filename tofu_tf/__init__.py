"""tofu_tf: partition a TensorFlow training step across N devices, operator by operator."""

import os
import sys

# TensorFlow 2.21's oneDNN CPU kernels give some local shapes of a split op wrong numbers:
# Conv2DBackpropFilter with a 1x1 filter, stride 2 and fewer than 8 input channels (a
# shortcut convolution's filter gradient with its input channels split) returns an input
# channel's gradient tens of percent off, the same wrong value every run, in oneDNN's AVX2
# kernels (CPUs without AVX-512, or ONEDNN_MAX_CPU_ISA=AVX2; its AVX-512 and SSE4.1
# kernels are right). tests/robustness/test_onednn.py reproduces it. The root cause is
# oneDNN's, not TensorFlow's: its AVX2 1x1 backward-weights kernel (jit_1x1:avx2) with
# stride > 1 first copies the source to unit stride ("rtus") and, for NHWC input with
# fewer input channels than its channel block (8), writes past that workspace:
# https://github.com/uxlfoundation/oneDNN/issues/6035 (wrong diff_weights, and a hang or
# a segmentation fault by thread count: the heap corruption once suspected here; none
# was seen in 2000 runs through TensorFlow). Unless the user chose otherwise, use
# TensorFlow's own kernels; this only takes effect when tofu_tf is imported before
# TensorFlow. Imported after, `optimize` and `function` raise a KernelConfigError naming
# the fix (api.check_kernels).
if "tensorflow" not in sys.modules:
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from tofu_tf.errors import (DescriptionError, DynamicShapeError, GraphImportError,
                            KernelConfigError, PartitionError, PlanInfeasibleError, PlanMismatchError, RegistryError,
                            RewriteError,
                            TofuError, UnsupportedOpError, WorkerError)
from tofu_tf.graph import Graph, Op, Role, Tensor, Variable
from tofu_tf.options import Objective, Options, Recompute, VariableStorage
from tofu_tf.search.plan import Plan
from tofu_tf.search.topology import Topology

__all__ = [
    "DescriptionError", "DynamicShapeError", "Graph", "GraphImportError", "KernelConfigError",
    "Objective", "Op",
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
