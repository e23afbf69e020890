"""Device profiles, and the cost of one op from its TDL description. No TensorFlow.

A `DeviceProfile` names a device's peak FLOP/s, memory and link bandwidths and overheads
(search/simulate.py predicts steps on them; `flop_bytes` is the search's price of repeated
computation, search/level.py). Per op, `op_flops` counts from the description: per output
element, one per arithmetic node, times the extent of every reduction around it (a Sum over
k of A*B: 2k); `op_bytes` its inputs and outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tofu_tf.errors import TofuError
from tofu_tf.graph import DTYPE_SIZES
from tofu_tf.op_semantics.registry import Semantics
from tofu_tf.op_semantics.tdl import Access, Apply, Const, Expr, Reduce, Var
from tofu_tf.options import Options


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    peak_flops: float                 # FLOP/s of one device at the training dtype
    memory_bandwidth: float           # bytes/s
    memory_bytes: int                 # capacity per device
    link_bandwidth: float             # bytes/s per device between devices (one host)
    link_latency: float               # seconds per transfer
    host_bandwidth: float             # bytes/s per device to host memory (swapping)
    op_overhead: float = 5e-6         # seconds per kernel (launch, executor)
    step_overhead: float = 0.0        # seconds per step (the session's own dispatch)
    efficiency: float = 0.6           # fraction of peak FLOP/s kernels reach
    cores: int | None = None          # devices share this many cores (logical CPUs)
    notes: str = ""

    @property
    def flop_bytes(self) -> float:
        """Bytes a device moves between devices in the time its kernels compute one flop:
        the search's price of repeated computation (level.py)."""
        return self.link_bandwidth / (self.peak_flops * self.efficiency)


GIB = 2 ** 30
PROFILES: dict[str, DeviceProfile] = {p.name: p for p in (
    DeviceProfile("paper_pcie_8gpu", 12.1e12, 547e9, 12 * GIB, 10e9, 10e-6, 10e9,
                  notes="8 x Titan-Xp-class GPUs (12 GB) on PCIe 3.0, fp32"),
    DeviceProfile("v100_nvlink_8", 15.7e12, 900e9, 16 * GIB, 130e9, 5e-6, 12e9,
                  notes="8 x V100 SXM2 16 GB, NVLink hybrid cube mesh, fp32"),
    DeviceProfile("a100_8", 156e12, 1555e9, 40 * GIB, 300e9, 3e-6, 25e9,
                  notes="8 x A100 40 GB, NVSwitch, TF32 tensor cores"),
    DeviceProfile("h100_8", 495e12, 3350e9, 80 * GIB, 450e9, 3e-6, 50e9,
                  notes="8 x H100 SXM 80 GB, NVLink 4, TF32 tensor cores"),
    DeviceProfile("h200_8", 401e12, 3694e9, 141 * 10 ** 9, 450e9, 3e-6, 55e9, op_overhead=7.5e-6,
                  efficiency=0.73,
                  notes="8 x H200 SXM 141 GB, NVLink 4, TF32; measured on one H200: peak and "
                        "host link by bench/gpu_kernels.py, efficiency, per-kernel overhead "
                        "and bandwidth fitted on kernels by bench/gpu_ops.py (results/"
                        "gpu_kernels.md, gpu_ops.md); the link between GPUs the datasheet's"),
    DeviceProfile("this_cpu", 120e9, 9.2e9, 24 * GIB, 10e9, 256e-6, 10e9, op_overhead=0.0,
                  step_overhead=235e-6, efficiency=1.0, cores=2,
                  notes="this 2-core machine, logical CPU devices, float32; peaks measured "
                        "and overheads fitted by bench/simulate.py (results/simulate.md)"),
)}


def step_profile(options: Options) -> DeviceProfile:
    """The device profile `options.step_profile` names (a TofuError naming the choices)."""
    if options.step_profile not in PROFILES:
        raise TofuError(f"no device profile named {options.step_profile!r}.",
                        fix=f"name one of {', '.join(sorted(PROFILES))}.")
    return PROFILES[options.step_profile]


def transfer_bytes(options: Options) -> float:
    """`options.transfer_bytes`, or where None its step profile's link latency x link
    bandwidth (whole bytes)."""
    if options.transfer_bytes is not None:
        return options.transfer_bytes
    profile = step_profile(options)
    return float(round(profile.link_latency * profile.link_bandwidth))


def flop_bytes(options: Options) -> float:
    """`options.flop_bytes`, or where None the exchange rate of its step profile."""
    if options.flop_bytes is not None:
        return options.flop_bytes
    return step_profile(options).flop_bytes


# -- per-op cost from the description ----------------------------------------------------

def _index_only(expr: Expr) -> bool:
    """Built from index variables and constants alone (a gate's condition, an offset)."""
    if isinstance(expr, (Var, Const)):
        return True
    return isinstance(expr, Apply) and all(_index_only(a) for a in expr.args)


def _density(cond: Expr) -> float:
    """The fraction of index points where an index-only condition holds: 1/s for a stride
    test `(e) mod s == 0` (transposed windows: strided gradients), 1 where not known."""
    if isinstance(cond, Apply) and cond.fn == "eq":
        for lhs, rhs in (cond.args, cond.args[::-1]):
            if (isinstance(rhs, Const) and rhs.value == 0 and isinstance(lhs, Apply)
                    and lhs.fn == "mod" and isinstance(lhs.args[1], Const)):
                return 1.0 / max(int(lhs.args[1].value), 1)
    return 1.0


def expr_flops(expr: Expr) -> float:
    """Arithmetic per evaluation of `expr` on values. Index arithmetic (inside accesses, in
    gates' conditions) is free; a reduction's terms count only where the index-only gates
    in them hold (a gated value is taken to be a factor of its term: the kernel skips the
    zero terms, as a strided convolution's input gradient does)."""
    if isinstance(expr, (Var, Const, Access)) or _index_only(expr):
        return 0.0
    if isinstance(expr, Apply):
        if expr.fn == "where" and _index_only(expr.args[0]):
            return expr_flops(expr.args[1])
        return 1.0 + sum(expr_flops(a) for a in expr.args)
    if isinstance(expr, Reduce):
        terms = math.prod(v.extent or 1 for v in expr.vars) * _gate_density(expr.body)
        return terms * (expr_flops(expr.body) + (0.0 if expr.reducer == "window" else 1.0))
    return 1.0


def _gate_density(expr: Expr) -> float:
    """The product of the densities of the index-only gates in `expr` (not inside accesses
    or nested reductions)."""
    if not isinstance(expr, Apply) or _index_only(expr):
        return 1.0
    density = _density(expr.args[0]) if expr.fn == "where" and _index_only(expr.args[0]) else 1.0
    return density * math.prod(_gate_density(a) for a in expr.args)


def op_flops(sem: Semantics) -> float:
    total = 0.0
    for compute, shape in zip(sem.computes, sem.output_shapes):
        elements = math.prod(shape)
        total += elements * (max(expr_flops(compute.body), 1.0) if compute is not None
                             else 1.0)
    return total


def op_bytes(sem: Semantics, dtypes: list[str]) -> float:
    shapes = [s for i, s in enumerate(sem.input_shapes) if i not in sem.meta_inputs]
    shapes += list(sem.output_shapes)
    itemsize = DTYPE_SIZES.get(dtypes[0], 4) if dtypes else 4
    return float(sum(math.prod(s) for s in shapes) * itemsize)
