"""The typed errors of tofu_tf.

Every error says what went wrong, where (node name and op type when there is one),
what was expected, and how to fix it. Callers catch `TofuError` for all of them.

    TofuError
    ├── GraphImportError        the input graph cannot be turned into a planner Graph
    │   └── DynamicShapeError   a tensor has an unknown dimension
    ├── UnsupportedOpError      an op type has no description and cannot be kept whole
    ├── DescriptionError        a TDL description is malformed (raised when it is built)
    ├── RegistryError           an op type is registered twice, or looked up wrongly
    ├── PartitionError          a strategy or region cannot be derived or applied
    ├── PlanInfeasibleError     no plan satisfies the constraints (devices, memory)
    ├── PlanMismatchError       a given plan does not fit the graph it is applied to
    ├── RewriteError            the partitioned graph cannot be emitted or fails checks
    └── WorkerError             a worker of a cluster failed, or the cluster cannot start
"""

from __future__ import annotations

import re


class TofuError(Exception):
    """Base class of every error tofu_tf raises on purpose."""

    def __init__(self, message: str, *, node: str | None = None, op_type: str | None = None,
                 fix: str | None = None):
        self.node = node
        self.op_type = op_type
        self.fix = fix
        where = ""
        if node is not None:
            where = f"node '{node}'" + (f" ({op_type})" if op_type else "") + ": "
        elif op_type is not None:
            where = f"op type {op_type}: "
        text = where + message
        if fix:
            text += f" Fix: {fix}"
        super().__init__(text)

    def __reduce__(self):
        """Pickles with every attribute (an error raised in a worker process is re-raised
        as it was)."""
        return _rebuilt, (type(self), self.args, dict(self.__dict__))


def _rebuilt(cls, args, attributes) -> TofuError:
    error = Exception.__new__(cls)
    error.args = args
    error.__dict__.update(attributes)
    return error


class GraphImportError(TofuError):
    """The input GraphDef or function cannot become a planner Graph."""


class DynamicShapeError(GraphImportError):
    """A tensor of the graph has a dimension that is not known statically."""


class UnsupportedOpError(TofuError):
    """An op type has no semantics description and no opaque declaration."""


class DescriptionError(TofuError):
    """A TDL description is malformed; raised when the description is built."""


class RegistryError(TofuError):
    """An op type is registered twice, or a lookup asks for something that is not there."""


class PartitionError(TofuError):
    """A partition strategy or region cannot be derived or applied."""


class PlanInfeasibleError(TofuError):
    """No plan satisfies the constraints (device count, memory budget)."""

    def __init__(self, message: str, *, best_peak_bytes: int | None = None, best_plan=None,
                 **kwargs):
        super().__init__(message, **kwargs)
        self.best_peak_bytes = best_peak_bytes
        self.best_plan = best_plan


class PlanMismatchError(TofuError):
    """A plan passed to `optimize(plan=...)` was made for another graph or topology."""


class RewriteError(TofuError):
    """The partitioned graph cannot be emitted, or fails verification."""


class WorkerError(TofuError):
    """A worker process of a cluster is gone, failed a step, or cannot start."""


def tf_error_cause(message: str) -> tuple[str, str | None]:
    """(the first line that says what failed, the first node named) of a TensorFlow error
    message, which opens with headings ("Graph execution error:", "=====", "From ...:")."""
    lines = [line.strip() for line in message.splitlines()]
    causes = [line for line in lines if line and not line.endswith(":") and line.strip("= ")]
    node = re.search(r"\{\{node ([^}]+)\}\}", message)
    return (causes or [message.strip()])[0][:300], node.group(1) if node else None


class KeptWholeWarning(UserWarning):
    """Ops of types without a description are kept whole (not partitioned)."""
