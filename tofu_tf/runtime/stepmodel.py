"""Step time of a GraphDef on logical CPU devices: a model of its nodes, calibrated from
TensorFlow's own step stats.

What a step on N logical CPU devices sharing C cores costs, node by node of the graph the
emitter wrote (or the unpartitioned graph, N = 1):

- a node's kernel: `fixed + per_byte x bytes + per_flop x flops`, a law per op type (per
  op family, `family`, for types seen too rarely): bytes are its inputs' and outputs'
  (from the graph's static shapes), flops TensorFlow's own count for the op
  (`ops.get_stats_for_node_def`, registered for matmuls, convolutions and some
  element-wise ops; 0 elsewhere). The laws are fitted by non-negative least squares on
  measured kernel times (`fit_kernels`), so each type's throughput and fixed cost come
  from this machine, not from a peak figure.
- the executor: `node_overhead` per node (scheduling, allocation), and per cross-device
  edge `edge_cost` of CPU (the rendezvous: its consumer's device receives it once) and
  `edge_latency` of waiting before the consumer may start; per step `step_overhead` (the
  session's dispatch, feeds and fetches).
- the schedule (`schedule`): TensorFlow's executor runs every device's nodes on one pool of
  inter-op threads, as many as cores, each taking the first ready node in the GraphDef's
  order (the emitter's); a kernel timed alone (`time_kernels`, per `kernel_key`) takes
  that time instead of its law, and keeps `busy_cores` cores busy (measured: its time
  with one copy per core at once over its time alone; Eigen's kernels run on the intra-op
  threads). While the running kernels ask for more cores than there are, each runs
  slower in proportion: the 8 logical devices contend for the host's cores there.

The laws are fitted on traced steps (unpartitioned and partitioned), each kernel's sample
its share of the step (`kernel_shares`: each moment of its run, at most one core's worth
while more kernels than cores ran), then the executor's constants on whole-step wall times
(`fit_executor`); calibration and evaluation take different configs (bench/simulate.py).
What the laws miss, measured there: a kernel's time is not a function of its bytes and
flops alone. TensorFlow's own CPU kernels reach 59 GFLOP/s on an LSTM's 1.07 GFLOP MatMul
(64 rows) and 234 GFLOP/s on a Transformer's of the same flops (2048 rows); a
convolution's input gradient 1.2 to 48 GFLOP/s at one flop count (slowest with a
3x3x1024x1024 filter on a 2x2 map); so laws fitted on some shapes miss others, and
kernels are timed alone where they can be.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import heapq
import timeit
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

FAMILIES = ("conv", "matmul", "reduce", "movement", "source", "update", "elementwise")

_FAMILY_OF = {
    **dict.fromkeys(("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D",
                     "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                     "DepthwiseConv2dNativeBackpropFilter", "AvgPool", "MaxPool",
                     "AvgPoolGrad", "MaxPoolGrad"), "conv"),
    **dict.fromkeys(("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"),
                    "matmul"),
    **dict.fromkeys(("Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "ArgMax", "ArgMin",
                     "BiasAddGrad", "AddN", "Softmax", "LogSoftmax",
                     "SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits",
                     "FusedBatchNormV3", "FusedBatchNormGradV3", "UnsortedSegmentSum",
                     "Cumsum", "Cumprod", "TopKV2"), "reduce"),
    **dict.fromkeys(("Slice", "StridedSlice", "StridedSliceGrad", "ConcatV2", "Pad", "PadV2",
                     "MirrorPad", "Transpose", "Tile", "GatherV2", "ResourceGather",
                     "Fill", "Pack", "Unpack", "Split", "SplitV", "ZerosLike", "OnesLike",
                     "BroadcastTo", "Reverse", "ReverseV2"), "movement"),
    **dict.fromkeys(("Const", "VarHandleOp", "ReadVariableOp", "NoOp", "Placeholder",
                     "Identity", "Reshape", "Shape", "ShapeN", "ExpandDims", "Squeeze",
                     "StopGradient", "Size", "Rank"), "source"),
}


def family(op_type: str) -> str:
    if op_type in _FAMILY_OF:
        return _FAMILY_OF[op_type]
    if op_type.startswith(("ResourceApply", "Assign")):
        return "update"
    return "elementwise"


@dataclass(frozen=True)
class Node:
    name: str
    op_type: str
    device: int
    family: str
    bytes: float                         # inputs' and outputs' bytes
    flops: float
    key: str = ""                        # kernels of one key run alike (`kernel_key`)


@dataclass(frozen=True)
class StepGraph:
    """What the model needs of a GraphDef: its nodes in topological order (the order the
    GraphDef lists them, where that is one) and, per node, its predecessors (data and
    control inputs) with whether each edge crosses devices."""
    nodes: tuple[Node, ...]
    preds: tuple[tuple[tuple[int, bool], ...], ...]  # per node: (predecessor, crosses)
    devices: int
    edges: int                   # cross-device data edges: one per (tensor, device)
    # Per node: the cross-device edges it is the first reader of on its device (its
    # device receives them for it); empty: each crossing predecessor counts.
    receives: tuple[int, ...] = ()

    def received(self, i: int) -> int:
        if self.receives:
            return self.receives[i]
        return sum(1 for _, crosses in self.preds[i] if crosses)


@dataclass(frozen=True)
class Kernels:
    """Per op type, and per family for the other types of a family: (fixed seconds,
    seconds per byte, seconds per flop)."""
    coefficients: Mapping[str, tuple[float, float, float]]
    # Kernel key -> seconds of that kernel run alone (`time_kernels`); it replaces the law.
    timed: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # Kernel key -> the cores that kernel keeps busy run alone (`busy_cores`: from its
    # time with as many copies at once as there are cores); 1 where not measured.
    cores: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def busy(self, node: Node) -> float:
        return self.cores.get(node.key, 1.0)

    def seconds(self, node: Node) -> float:
        """The node's kernel seconds run alone: timed, or its law."""
        if node.key in self.timed:
            return self.timed[node.key]
        law = self.coefficients.get(node.op_type) or self.coefficients.get(node.family)
        fixed, per_byte, per_flop = law or (0.0, 0.0, 0.0)
        return fixed + per_byte * node.bytes + per_flop * node.flops


@dataclass(frozen=True)
class Executor:
    node_overhead: float = 1e-6      # seconds per node
    edge_cost: float = 5e-6          # CPU seconds per cross-device edge
    edge_latency: float = 10e-6      # seconds a cross-device edge delays its consumer
    cores: int = 2                   # and as many inter-op threads (TensorFlow's default)
    step_overhead: float = 0.0       # seconds per step: the session's dispatch, feeds, fetches


@dataclass(frozen=True)
class Prediction:
    seconds: float
    work_bound: float
    path_bound: float


def predict(step: StepGraph, kernels: Kernels, executor: Executor) -> Prediction:
    seconds = [kernels.seconds(node) for node in step.nodes]
    busy = [kernels.busy(node) for node in step.nodes]
    return Prediction(schedule(step, seconds, busy, executor) + executor.step_overhead,
                      work_bound(step, seconds, busy, executor),
                      path_bound(step, seconds, executor))


def schedule(step: StepGraph, kernel: Sequence[float], busy: Sequence[float],
             executor: Executor) -> float:
    """Seconds until the last node of `step` finishes, run as TensorFlow's executor runs
    it on `executor.cores` cores: as many inter-op threads, each taking the first ready
    node in the graph's order (every device's nodes share them); a node first spends the
    executor's overhead and its receives' cost (one core), then its kernel (`kernel`
    seconds run alone, keeping `busy` cores busy). While the running nodes ask for more
    cores than there are, each runs slower in proportion. A cross-device edge's consumer
    is ready `edge_latency` after its producer finished."""
    cores = executor.cores
    overhead = [executor.node_overhead + executor.edge_cost * step.received(i)
                for i in range(len(step.nodes))]
    users: list[list[tuple[int, bool]]] = [[] for _ in step.nodes]
    waiting = [len(preds) for preds in step.preds]
    for i, preds in enumerate(step.preds):
        for p, crosses in preds:
            users[p].append((i, crosses))
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    later: list[tuple[float, int]] = []      # (ready time, node): waiting on a latency
    ready_at = [0.0] * len(step.nodes)
    running: list[list] = []                 # [node, overhead left, kernel left]
    now, left = 0.0, len(step.nodes)
    while left:
        while later and later[0][0] <= now:
            heapq.heappush(ready, heapq.heappop(later)[1])
        while ready and len(running) < cores:
            i = heapq.heappop(ready)
            running.append([i, overhead[i], kernel[i]])
        if not running:
            now = later[0][0]
            continue
        demand = sum(1.0 if job[1] > 0 else busy[job[0]] for job in running)
        rate = min(1.0, cores / demand)
        step_seconds = min(job[1] if job[1] > 0 else job[2] for job in running) / rate
        if later:
            step_seconds = min(step_seconds, later[0][0] - now)
        now += step_seconds
        progress = step_seconds * rate
        still = []
        for job in running:
            if job[1] > 0:
                job[1] = job[1] - progress if job[1] - progress > 1e-15 else 0.0
                still.append(job)
            elif job[2] - progress > 1e-15:
                job[2] -= progress
                still.append(job)
            else:
                left -= 1
                for user, crosses in users[job[0]]:
                    at = now + executor.edge_latency if crosses else now
                    if at > ready_at[user]:
                        ready_at[user] = at
                    waiting[user] -= 1
                    if not waiting[user]:
                        if ready_at[user] > now:
                            heapq.heappush(later, (ready_at[user], user))
                        else:
                            heapq.heappush(ready, user)
        running = still
    return now


def work_bound(step: StepGraph, kernel: Sequence[float], busy: Sequence[float],
               executor: Executor) -> float:
    """The cores' busy time over their number: no schedule finishes sooner."""
    return (sum(k * b for k, b in zip(kernel, busy)) + len(step.nodes) * executor.node_overhead
            + step.edges * executor.edge_cost) / executor.cores


def path_bound(step: StepGraph, kernel: Sequence[float], executor: Executor) -> float:
    """The longest chain: each node after its predecessors (cross-device ones after the
    edge's latency), its kernel and the executor's overhead."""
    finish = [0.0] * len(step.nodes)
    latency, overhead = executor.edge_latency, executor.node_overhead
    for i, preds in enumerate(step.preds):
        ready = 0.0
        for p, crosses in preds:
            t = finish[p] + latency if crosses else finish[p]
            if t > ready:
                ready = t
        finish[i] = ready + kernel[i] + overhead
    return max(finish, default=0.0)


# -- from TensorFlow ------------------------------------------------------------------------

def step_graph(graph_def, fetches: Sequence[str] = ()) -> StepGraph:
    """The model's view of a GraphDef (shapes and flops through TensorFlow): the nodes a
    run of `fetches` (tensor or op names; none: every node) executes."""
    import tensorflow as tf
    from tensorflow.python.framework import ops as tf_ops

    from tofu_tf._tf_graph import LazyGraph
    graph = LazyGraph(graph_def)
    by_name = {node.name: node for node in graph_def.node}
    order = _topological(graph_def, {f.split(":")[0] for f in fetches})
    devices = {name: i for i, name in enumerate(sorted({by_name[n].device for n in order}))}
    index = {name: i for i, name in enumerate(order)}
    nodes, preds, edges, receives = [], [], set(), []
    for name in order:
        node_def = by_name[name]
        op = graph.get_operation_by_name(name)
        size = sum(_bytes(t) for t in list(op.inputs) + list(op.outputs))
        try:               # on a copy: the registry's reads add attributes (transpose_a)
            flops = tf_ops.get_stats_for_node_def(graph, copy.deepcopy(node_def),
                                                  "flops").value or 0
        except (ValueError, TypeError, tf.errors.OpError):
            flops = 0
        nodes.append(Node(name, node_def.op, devices[node_def.device],
                          family(node_def.op), float(size), float(flops),
                          kernel_key(op, by_name)))
        mine, first = [], 0
        for text in node_def.input:
            source = text.lstrip("^").split(":")[0]
            crosses = by_name[source].device != node_def.device
            mine.append((index[source], crosses))
            if crosses and not text.startswith("^") and \
                    (text, node_def.device) not in edges:
                edges.add((text, node_def.device))
                first += 1
        preds.append(tuple(mine))
        receives.append(first)
    return StepGraph(tuple(nodes), tuple(preds), len(devices), len(edges), tuple(receives))


def kernel_key(op, by_name) -> str:
    """What decides a kernel's time: the op type, its attributes (TensorFlow's own, not the
    placement), its inputs' dtypes and shapes, and the values of small constant inputs
    (a Reshape's shape, a gradient's input sizes)."""
    node_def = by_name[op.name]
    parts = [node_def.op]
    for tensor in op.inputs:
        parts.append(f"{tensor.dtype.name}{tensor.shape}")
        producer = by_name.get(tensor.op.name)
        if producer is not None and producer.op == "Const" and \
                tensor.shape.num_elements() is not None and tensor.shape.num_elements() <= 16:
            parts.append(producer.attr["value"].tensor.SerializeToString().hex())
    for name in sorted(node_def.attr):
        if not name.startswith("_"):
            parts.append(f"{name}={node_def.attr[name].SerializeToString().hex()}")
    digest = hashlib.sha1("|".join(parts[1:]).encode()).hexdigest()[:16]
    return f"{node_def.op}:{digest}"


def time_kernels(graph_def, nodes: Sequence[Node], repeats: int = 5,
                 copies: int = 1) -> dict[str, float]:
    """Kernel key -> median seconds of one node of that key run alone: the op on one CPU
    device, its inputs constants (random floats, zeros elsewhere, the graph's own small
    constants), no constant folding, less the median of the step that runs only the
    constants. Ops without inputs (sources, fed placeholders) and ops that read or write
    variables (resource or reference inputs) are not timed. `copies`: that many copies
    of the node, each on its own inputs, run at once (the step's time: `busy_cores`)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2

    from tofu_tf._tf_graph import LazyGraph
    by_name = {node.name: node for node in graph_def.node}
    graph = LazyGraph(graph_def)
    config = config_pb2.ConfigProto(device_count={"CPU": 1})
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = config_pb2.OptimizerOptions.L0
    config.graph_options.optimizer_options.do_constant_folding = False
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    for node in nodes:
        if not node.key or node.key in out:
            continue
        op = graph.get_operation_by_name(node.name)
        if not op.inputs or op.type.startswith("Placeholder") or \
                any(t.dtype in (tf.resource, tf.variant) or t.dtype._is_ref_dtype  # noqa: SLF001
               or not t.shape.is_fully_defined() for t in op.inputs):
            continue
        values = []
        for tensor in op.inputs:
            producer = by_name.get(tensor.op.name)
            shape, dtype = tensor.shape.as_list(), tensor.dtype
            if producer is not None and producer.op == "Const":
                value = tf.make_ndarray(producer.attr["value"].tensor)
            elif dtype.is_floating:
                value = rng.standard_normal(shape).astype(dtype.as_numpy_dtype)
            else:
                value = np.zeros(shape, dtype.as_numpy_dtype)
            values.append((value, dtype))
        alone = tf.Graph()
        with alone.as_default():         # each copy its own inputs, as kernels of a step
            inputs = [[tf.constant(value, dtype=dtype, name=f"input{c}_{i}")
                       for i, (value, dtype) in enumerate(values)] for c in range(copies)]
            with tf.control_dependencies([t.op for mine in inputs for t in mine]):
                tf.raw_ops.NoOp(name="empty")     # the same step less the kernels
        definition = alone.as_graph_def()
        group = definition.node.add(name="kernel", op="NoOp")
        for copy_index, mine in enumerate(inputs):
            kernel = definition.node.add()
            kernel.CopyFrom(by_name[op.name])
            kernel.name, kernel.device = f"kernel{copy_index}", ""
            del kernel.input[:]
            kernel.input.extend(t.op.name for t in mine)
            group.input.append(f"^{kernel.name}")
        timed = tf.Graph()
        with timed.as_default():
            tf.graph_util.import_graph_def(definition, name="")
        try:
            empty, alone_seconds = _median_runs(timed, config, repeats)
        except (tf.errors.OpError, ValueError):      # inputs the zeros do not fit
            continue
        out[node.key] = max(alone_seconds - empty, 0.0)
    return out


def busy_cores(alone: Mapping[str, float], together: Mapping[str, float],
               cores: int) -> dict[str, float]:
    """Kernel key -> the cores a kernel keeps busy run alone, from its seconds alone and
    with `cores` copies at once (`time_kernels(copies=cores)`): copies that each keep b
    cores busy ask for cores x b, so they take b x their time alone (1 <= b <= cores)."""
    return {key: float(np.clip(together[key] / alone[key], 1.0, cores))
            for key in alone.keys() & together.keys() if alone[key] > 0}


def _median_runs(graph, config, repeats: int) -> tuple[float, float]:
    """Median seconds of running `graph`'s op "empty", then its op "kernel" (each of the
    `repeats` measurements runs it often enough to take about 2 ms: a kernel of a few
    microseconds is not lost in the timer's and the session's noise)."""
    import tensorflow as tf
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        runs = [session.make_callable(graph.get_operation_by_name(target))
                for target in ("empty", "kernel")]
        for run in runs:
            run()
        number = max(1, min(1000, int(2e-3 / min(timeit.repeat(runs[1], repeat=3,
                                                                number=1)))))
        empty, kernel = (float(np.median(timeit.repeat(run, repeat=repeats, number=number)))
                         / number for run in runs)
    return empty, kernel


def _bytes(tensor) -> int:
    if tensor.dtype.is_numpy_compatible and tensor.shape.is_fully_defined() and \
            tensor.dtype.size:
        return int(np.prod(tensor.shape.as_list(), dtype=np.int64)) * tensor.dtype.size
    return 0


def _topological(graph_def, wanted: set[str]) -> list[str]:
    """Names of the nodes `wanted` need (all without any), producers first, otherwise in
    the GraphDef's order."""
    by_name = {node.name: node for node in graph_def.node}
    keep = set(by_name) if not wanted else set()
    stack = list(wanted)
    while stack:
        name = stack.pop()
        if name not in keep:
            keep.add(name)
            stack += [t.lstrip("^").split(":")[0] for t in by_name[name].input]
    indegree = {name: 0 for name in keep}
    users = defaultdict(list)
    for name in keep:
        for text in by_name[name].input:
            indegree[name] += 1
            users[text.lstrip("^").split(":")[0]].append(name)
    position = {node.name: i for i, node in enumerate(graph_def.node)}
    ready = [position[name] for name in keep if indegree[name] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        name = graph_def.node[heapq.heappop(ready)].name
        order.append(name)
        for user in users[name]:
            indegree[user] -= 1
            if indegree[user] == 0:
                heapq.heappush(ready, position[user])
    return order


def _kernel_spans(step_stats):
    """(node name, kernel start, kernel end) in microseconds, every node of a traced step
    once (`profile.device_rows`)."""
    from tofu_tf.runtime.profile import device_rows
    for dev in device_rows(step_stats):
        for ns in dev.node_stats:
            yield (ns.node_name, ns.all_start_micros + ns.op_start_rel_micros,
                   ns.all_start_micros + ns.op_end_rel_micros)


def kernel_times(step_stats) -> dict[str, float]:
    """Node name -> its kernel seconds in a traced step (TensorFlow's own Send and Recv
    nodes too, which no GraphDef names; entries of one name add up)."""
    out: dict[str, float] = defaultdict(float)
    for name, start, end in _kernel_spans(step_stats):
        out[name] += (end - start) * 1e-6
    return dict(out)


def kernel_shares(step_stats, cores: int = 1) -> dict[str, float]:
    """Node name -> its kernel's share of a traced step's time: each moment of its run
    times `cores` over the number of kernels running then, at most 1 (every device's
    kernels share the host's cores): what it would have taken with a core of its own, as
    `schedule` runs kernels (a kernel that ran with fewer others than cores keeps its wall
    time). With `cores` 1 the shares of kernels that ran at once add up to the time they
    kept the host busy, where their wall times (`kernel_times`) add up to a multiple of
    it."""
    names, events = [], []
    for name, start, end in _kernel_spans(step_stats):
        if end > start:                                   # else: no time to share
            events += [(start, 1, len(names)), (end, -1, len(names))]
        names.append(name)
    events.sort()                       # at one moment, ends before starts
    shares = [0.0] * len(names)
    running: set[int] = set()
    last = 0
    for moment, kind, index in events:
        if running and moment > last:
            share = (moment - last) * 1e-6 * min(1.0, cores / len(running))
            for other in running:
                shares[other] += share
        last = moment
        if kind > 0:
            running.add(index)
        else:
            running.discard(index)
    out: dict[str, float] = defaultdict(float)
    for name, share in zip(names, shares):
        out[name] += share
    return dict(out)


def traced_seconds(step_stats) -> float:
    """Wall seconds of a traced step: its first kernel's start to its last one's end."""
    spans = list(_kernel_spans(step_stats))
    if not spans:
        return 0.0
    return (max(end for _, _, end in spans) - min(start for _, start, _ in spans)) * 1e-6


# -- calibration ----------------------------------------------------------------------------

def fit_kernels(samples: Sequence[tuple[Node, float]], min_samples: int = 3) -> Kernels:
    """A law per family, and per op type with at least `min_samples` samples: NNLS of
    measured kernel seconds on (1, bytes, flops), each sample weighted by 1 / (its seconds
    + 1 us) so that the many small kernels and the few large ones both count (relative
    error). A type's law keeps its family's fixed cost and fits its own throughput: a type
    seen at one size only (an LSTM's gates) cannot tell the two apart, and one law per
    family would not do either (on this CPU a convolution's input gradient runs at a
    fortieth of its forward's FLOP/s)."""
    families, types = defaultdict(list), defaultdict(list)
    for node, seconds in samples:
        families[node.family].append((node, seconds))
        types[node.op_type].append((node, seconds))
    laws = {name: _law(rows) for name, rows in families.items()}
    for name, rows in types.items():
        if len(rows) >= min_samples:
            fixed = laws[rows[0][0].family][0]
            laws[name] = (fixed,) + _law([(n, max(t - fixed, 0.0)) for n, t in rows],
                                         with_fixed=False)
    return Kernels(laws)


def _law(rows, with_fixed: bool = True) -> tuple[float, ...]:
    from scipy.optimize import nnls
    a = np.array([([1.0] if with_fixed else []) + [n.bytes, n.flops] for n, _ in rows])
    b = np.array([s for _, s in rows])
    scale = np.maximum(a.max(axis=0), 1e-30)
    weight = 1.0 / (b + 1e-6)
    solution, _ = nnls((a / scale) * weight[:, None], b * weight)
    return tuple(float(v) for v in solution / scale)


def fit_executor(steps: Sequence[tuple[StepGraph, float]], kernels: Kernels, cores: int,
                 grid: int = 13, passes: int = 3) -> Executor:
    """The executor's constants minimising the mean of log(1 + |relative error|) over
    `steps` ((graph, measured seconds); every step counts, a large miss less than in
    proportion): per node, per edge and edge latency on a log grid from 0.1 to 100 us, one
    at a time with the others held (up to `passes` rounds, until none moves; each try
    schedules every step), and for each the step's overhead from 0 to 300 us."""
    values = [float(v) for v in np.logspace(-7, -4, grid)]
    per_step = np.arange(0.0, 310e-6, 25e-6)
    measured = np.array([m for _, m in steps])
    work = [([kernels.seconds(n) for n in step.nodes], [kernels.busy(n) for n in step.nodes])
            for step, _ in steps]
    tried: dict[tuple[float, float, float], tuple[float, float]] = {}

    def error(point: tuple[float, float, float]) -> tuple[float, float]:
        """(error, step overhead) at (node overhead, edge cost, edge latency)."""
        if point not in tried:
            executor = Executor(*point, cores)
            base = np.array([schedule(step, k, b, executor)
                             for (step, _), (k, b) in zip(steps, work)])
            errors = np.log1p(np.abs((base[None, :] + per_step[:, None]) / measured[None, :]
                                     - 1)).mean(axis=1)
            best = int(np.argmin(errors))
            tried[point] = float(errors[best]), float(per_step[best])
        return tried[point]

    # from the grid's points nearest 1 us per node, 5.6 us per receive, 10 us latency
    point = tuple(min(values, key=lambda v: abs(np.log(v / p))) for p in (1e-6, 5.6e-6, 1e-5))
    for _ in range(passes):
        before = point
        for axis in range(3):
            point = min((point[:axis] + (v,) + point[axis + 1:] for v in values), key=error)
        if point == before:
            break
    return Executor(*point, cores, *error(point)[1:])


@dataclass
class Calibration:
    """Kernel laws and executor constants, as bench/results/simulate.json stores them."""
    kernels: Kernels
    executor: Executor

    def to_json(self) -> dict:
        return {"kernels": {k: list(v) for k, v in self.kernels.coefficients.items()},
                "timed": dict(sorted(self.kernels.timed.items())),
                "busy_cores": dict(sorted(self.kernels.cores.items())),
                "executor": dataclasses.asdict(self.executor)}

    @staticmethod
    def from_json(data: dict) -> "Calibration":
        return Calibration(Kernels({k: tuple(v) for k, v in data["kernels"].items()},
                                   data.get("timed", {}), data.get("busy_cores", {})),
                           Executor(**data["executor"]))


__all__ = ["FAMILIES", "Calibration", "Executor", "Kernels", "Node", "Prediction",
           "StepGraph", "family", "fit_executor", "fit_kernels", "kernel_shares", "kernel_times",
           "predict", "traced_seconds",
           "step_graph"]
