"""Per-device peak memory of a schedule of ops, by buffer liveness. No TensorFlow.

Both memory estimates are this one model over different inputs: `rewrite/memory.py` feeds
it the nodes of a GraphDef (partitioned or not), `search/memory.py` the ops of a plan.

The model, and what it assumes:
- schedule: the nodes run one at a time, in the order given;
- allocator: an output is a fresh buffer of its static size, allocated when its node runs
  and freed after the last node that reads it (or a view of it); fetched tensors live to
  the end. No fragmentation, no allocator rounding;
- views: some kernels return a view of an input instead of a new buffer (`ALIASING`:
  Identity, Reshape, ReadVariableOp ...; a Slice along dim 0 at an aligned offset), and
  element-wise kernels write into an input buffer when they are its last reader and it is
  not a variable, a feed or a fetch (`FORWARDING`, TensorFlow's
  `forward_input_or_allocate_output`);
- scratch: CPU convolution gradients also hold an im2col buffer while they run
  (`conv_grad_scratch`, TensorFlow's own sizing rule); other kernels' workspace (and
  cuDNN's on GPUs) is not modelled;
- persistent: variables, constants and fed tensors are resident for the whole step;
- communication: with `shared_memory` (logical CPU devices in one process) a tensor read on
  another device is that same buffer; otherwise (GPUs) the reading device allocates a
  receive buffer at its first read, and the producer's buffer lives until every reading
  device has received it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

# Kernels whose output 0 is a view of input 0.
ALIASING = frozenset({
    "Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "PreventGradient",
    "ReadVariableOp", "EnsureShape", "Snapshot", "CheckNumerics"})

# Element-wise kernels that write output 0 into an input buffer they read last.
FORWARDING = frozenset({
    "Abs", "Neg", "Sqrt", "Rsqrt", "Square", "Exp", "Expm1", "Log", "Log1p", "Sigmoid",
    "Tanh", "Relu", "Relu6", "Elu", "Selu", "Softplus", "Softsign", "Reciprocal", "Inv",
    "Sign", "Floor", "Ceil", "Round", "Rint", "Erf", "Cos", "Sin", "LeakyRelu", "Gelu",
    "AddV2", "Add", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "MulNoNan", "Maximum",
    "Minimum", "Pow", "SquaredDifference", "FloorDiv", "FloorMod", "BiasAdd",
    "SigmoidGrad", "TanhGrad", "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad",
    "SoftplusGrad", "SoftsignGrad", "RsqrtGrad", "SqrtGrad", "ReciprocalGrad", "InvGrad",
    "LeakyReluGrad", "AddN", "Select", "SelectV2", "ClipByValue"})

# The working set TensorFlow's CPU convolution gradients (Conv2DCustomBackprop{Input,
# Filter}) size their im2col buffer to: a whole number of per-image work units that
# covers it ("the L3 cache"), whatever the batch.
CONV_GRAD_WORKING_SET = 30 << 20

# TensorFlow's EIGEN_MAX_ALIGN_BYTES: a dim-0 slice is a view only at this alignment.
ALIGN_BYTES = 64


def slice_is_view(shape: Sequence[int], begin: Sequence[int], size: Sequence[int],
                  itemsize: int) -> bool:
    """Whether TensorFlow's Slice kernel returns a view: every dim but the first taken
    whole, and the slice starting (and, for a vector, ending) on an aligned address."""
    size = [n - b if s == -1 else s for n, b, s in zip(shape, begin, size)]
    if list(size) == list(shape):
        return True
    if not shape or any(b != 0 or s != n for n, b, s in
                        zip(shape[1:], begin[1:], size[1:])):
        return False
    if len(shape) == 1:
        return (begin[0] * itemsize) % ALIGN_BYTES == 0 and \
            (size[0] * itemsize) % ALIGN_BYTES == 0
    row = itemsize
    for n in shape[1:]:
        row *= n
    return shape[0] > 0 and row % ALIGN_BYTES == 0


def split_is_view(shape: Sequence[int], sizes: Sequence[int], axis: int,
                  itemsize: int) -> bool:
    """Whether TensorFlow's Split/SplitV kernel returns views: along dim 0, every piece a
    slice that `slice_is_view` (one piece: the input itself)."""
    if len(sizes) == 1:
        return True
    if axis % max(len(shape), 1) != 0:
        return False
    start = 0
    for size in sizes:
        if not slice_is_view(shape, [start] + [0] * (len(shape) - 1),
                             [size, *shape[1:]], itemsize):
            return False
        start += size
    return True


def conv_grad_scratch(filter_shape: Sequence[int], out_backprop_spatial: Sequence[int],
                      itemsize: int) -> int:
    """Bytes of the im2col buffer a CPU Conv2DBackpropInput / Conv2DBackpropFilter
    allocates while it runs (filter HWIO; the output gradient's spatial dims)."""
    *window, in_depth, out_depth = filter_shape
    image = 1
    for n in out_backprop_spatial:
        image *= n
    patch = in_depth
    for n in window:
        patch *= n
    work = image * patch + image * out_depth + patch * out_depth
    if work == 0:
        return 0
    shards = -(-(CONV_GRAD_WORKING_SET // itemsize) // work)
    return shards * image * patch * itemsize


@dataclass(frozen=True)
class Node:
    """One op of the schedule on one device."""
    name: str
    device: str
    inputs: tuple[str, ...]                       # tensors read (data inputs)
    outputs: tuple[tuple[str, int, str], ...]     # (tensor, bytes, dtype)
    persistent_bytes: int = 0       # resident for the whole step (a variable's buffer)
    persistent: bool = False        # outputs are resident (constants, feeds, handles)
    view_of: int | None = None      # the outputs are views of this input
    forwards: tuple[int, ...] = ()  # output 0 may reuse one of these inputs' buffers
    scratch_bytes: int = 0          # kernel workspace, live only while the node runs


@dataclass(frozen=True)
class DeviceMemory:
    device: str
    persistent_bytes: int            # variables, constants, feeds
    transient_peak_bytes: int        # the step's own buffers at their peak
    peak_op: str                     # the node at which that peak is reached
    # With `explain`: the largest buffers live at the peak, (first tensor, bytes).
    peak_buffers: tuple[tuple[str, int], ...] = ()

    @property
    def peak_bytes(self) -> int:
        return self.persistent_bytes + self.transient_peak_bytes


@dataclass
class _Buffer:
    device: str
    bytes: int
    dtype: str
    pending: int = 0                 # reads (and sends) still to come
    keep: bool = False               # persistent or fetched: never freed
    members: list = field(default_factory=list)


def peaks(nodes: Sequence[Node], fetched: Iterable[str] = (), shared_memory: bool = True,
          explain: int = 0) -> dict[str, DeviceMemory]:
    """Per device: persistent bytes and the peak of the transient ones (module docstring);
    with `explain`, that many of the largest buffers live at each device's peak."""
    fetched = set(fetched)
    reads: dict[tuple[str, str], int] = {}            # (tensor, device) -> number of reads
    for node in nodes:
        for t in node.inputs:
            reads[(t, node.device)] = reads.get((t, node.device), 0) + 1
    readers: dict[str, set[str]] = {}
    for t, device in reads:
        readers.setdefault(t, set()).add(device)

    producer: dict[str, tuple[_Buffer, str]] = {}     # tensor -> (buffer, device)
    received: dict[tuple[str, str], _Buffer] = {}     # (tensor, device) -> receive buffer
    persistent: dict[str, int] = {}
    live: dict[str, int] = {}
    peak: dict[str, tuple[int, str]] = {}
    alive: dict[int, _Buffer] = {}                    # with explain: id -> live buffer
    snapshot: dict[str, list] = {}

    def pending_of(t: str, device: str) -> int:
        """Reads of `t` its producer's buffer still waits for."""
        if shared_memory:
            return sum(reads.get((t, d), 0) for d in readers.get(t, ()))
        return reads.get((t, device), 0) + len(readers.get(t, set()) - {device})

    def join(buffer: _Buffer, t: str, device: str) -> None:
        buffer.members.append(t)
        buffer.pending += pending_of(t, device)
        buffer.keep = buffer.keep or t in fetched
        producer[t] = (buffer, device)

    def allocate(buffer: _Buffer) -> _Buffer:
        live[buffer.device] += buffer.bytes
        if explain:
            alive[id(buffer)] = buffer
        return buffer

    def free(buffer: _Buffer) -> None:
        live[buffer.device] -= buffer.bytes
        alive.pop(id(buffer), None)

    def release(buffer: _Buffer, count: int) -> None:
        buffer.pending -= count
        if buffer.pending == 0 and not buffer.keep:
            free(buffer)

    for node in nodes:
        here = node.device
        persistent[here] = persistent.get(here, 0) + node.persistent_bytes
        live.setdefault(here, 0)
        views: list[_Buffer] = []                     # the buffer each input reads
        for t in node.inputs:
            buffer, source = producer[t]
            if not shared_memory and source != here:
                key = (t, here)
                if key not in received:
                    received[key] = allocate(_Buffer(here, buffer.bytes, buffer.dtype,
                                                     reads[key], t in fetched, [t]))
                    release(buffer, 1)                # this device's send is done
                buffer = received[key]
            views.append(buffer)
        read_counts: dict[int, int] = {}
        for buffer in views:
            read_counts[id(buffer)] = read_counts.get(id(buffer), 0) + 1
        for index, (t, size, dtype) in enumerate(node.outputs):
            if node.persistent:
                persistent[here] += size
                join(_Buffer(here, size, dtype, keep=True), t, here)
                continue
            reuse = None
            if node.view_of is not None:
                reuse = views[node.view_of]
            elif index == 0:
                for i in node.forwards:
                    b = views[i]
                    if (not b.keep and b.device == here and b.bytes == size
                            and b.dtype == dtype and b.pending == read_counts[id(b)]):
                        reuse = b
                        break
            if reuse is not None:
                join(reuse, t, here)
                continue
            join(allocate(_Buffer(here, size, dtype)), t, here)
        live[here] += node.scratch_bytes
        if live[here] > peak.get(here, (-1, ""))[0]:
            peak[here] = (live[here], node.name)
            if explain:
                held = [(b.members[0], b.bytes) for b in alive.values() if b.device == here]
                if node.scratch_bytes:
                    held.append((node.name + " (scratch)", node.scratch_bytes))
                snapshot[here] = sorted(held, key=lambda h: -h[1])[:explain]
        live[here] -= node.scratch_bytes
        for t, size, _ in node.outputs:               # outputs nobody reads
            buffer, _ = producer[t]
            if buffer.pending == 0 and not buffer.keep and buffer.members[-1] == t \
                    and len(buffer.members) == 1:
                free(buffer)
        for buffer in views:
            release(buffer, 1)
    devices = sorted(set(persistent) | set(peak))
    return {d: DeviceMemory(d, persistent.get(d, 0), peak.get(d, (0, ""))[0],
                            peak.get(d, (0, ""))[1], tuple(snapshot.get(d, ())))
            for d in devices}
