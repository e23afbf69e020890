"""Options of the planner: one frozen dataclass, a comment per field."""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass

from tofu_tf.errors import TofuError

_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def parse_bytes(text: str) -> int:
    """'12GiB', '16 GB', '512MiB', '1e9' -> bytes."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text or "")
    unit = match and match.group(2).lower()
    try:
        value = float(match.group(1)) if match else None
    except ValueError:
        value = None
    if value is None or unit not in _UNITS or value <= 0:
        raise TofuError(f"cannot read '{text}' as a number of bytes.",
                        fix="write e.g. 12GiB, 16GB, 512MiB or 1e9.")
    return int(value * _UNITS[unit])


class Collectives(enum.Enum):
    """How the emitted graph combines partial results across devices."""
    AUTO = "auto"                # V2 collectives (NCCL hint) on GPUs, edges on CPUs
    EDGES = "edges"              # slices and sums over plain cross-device edges (Send/Recv)
    V2 = "v2"                    # CollectiveReduceV2 all-reduce where the result is replicated


class VariableStorage(enum.Enum):
    """How the search may store variables (with their gradients and optimizer slots)."""
    AUTO = "auto"                # solve under both policies below, keep the cheaper plan
    REPLICABLE = "replicable"    # replicated or split, per level (data parallelism reachable)
    PARTITIONED = "partitioned"  # always split, like every other large tensor (Tofu's policy)


class Objective(enum.Enum):
    """What the search minimises over the levels of a topology."""
    BYTES = "bytes"              # bytes moved, every link alike
    TIME = "time"                # transfer seconds: each level's bytes over its links (α-β)


class Recompute(enum.Enum):
    """Which forward ops run again in the backward pass instead of keeping their results
    (tofu_tf/search/recompute.py says what each policy picks)."""
    NONE = "none"
    CHEAP = "cheap"              # ops without reductions: element-wise, normalisations
    SEGMENTS = "segments"        # all but every sqrt(n)-th contraction's result
    AUTO = "auto"                # the fastest mix that fits the budget (search/plan.py)


@dataclass(frozen=True)
class Options:
    # How variables may be stored; AUTO doubles the search time and never loses bytes.
    variable_storage: VariableStorage = VariableStorage.AUTO
    # Tensors with fewer elements than this may be stored replicated; larger ones (except
    # variables, their gradients and optimizer slots) are always stored partitioned.
    replicate_below: int = 0
    # An op that every device would run alike (whole results on the same inputs, as a
    # replicated op does) and whose results have fewer elements than this runs on device 0
    # only; the devices that read its results receive them. Logical CPU devices share the
    # host's cores, so there N runs of a small op cost N times its overhead where one run
    # and a few transfers cost one; on GPUs each device's copy runs in parallel. 0: off.
    compute_once_below: int = 0
    # Largest table (entries) one elimination step of the DP may build before it falls back
    # to a beam restriction (the plan is then reported as not proven optimal).
    max_dp_table: int = 2 ** 22
    # States kept per variable by that fallback.
    dp_beam: int = 2
    # On a topology of several levels, solve all levels at once (search/joint.py) when
    # that problem has at most this many joint choices (chains of one choice per level,
    # summed over ops: the tiny reference models have 300 to 9400 at 2x2 and 2x4, the
    # Transformer 12894 at 2x2x2; stock Keras text models 10000 to 40000 at 6 devices)
    # and its tables are within joint.MAX_OP_TABLE and MAX_TABLE_WORK, and keep its plan
    # where it moves fewer bytes than the recursion's, which fixes each level before the
    # next. With shared_reads, also the recursion's plan without them priced with them
    # (search/recursive.py: the two accounts pick different upper levels).
    # 0: the recursion alone. Not under a memory weight; under Objective.TIME its plan is
    # one more candidate, ranked by predicted transfer time like the others.
    joint_choices: int = 40_000
    # Where that problem is within joint_choices but the DP's tables would be too large
    # (with shared reads, the views' groups widen them: the LSTM at 2x4), HiGHS solves it
    # if its ILP has at most joint.ILP_VARIABLES columns; its answer counts where HiGHS
    # proves it optimal within joint.ILP_NODES nodes, a bound of work that gives the same
    # plan on any machine, and these seconds (and what is left of search_time_limit_s),
    # bounds for safety (hit first, a warning says the plan depends on the machine).
    # 0: the DP alone.
    joint_ilp_seconds: float = 60.0
    # At three or more levels, where the joint problem is past joint_choices, also plan
    # the lookahead (search/recursive.py): each level but the last fixed by the joint
    # optimum of it and the level below, each such problem within joint_choices; the
    # cheaper plan wins. It closes most of the recursion's gap on the tiny models (the
    # Transformer at 2x2x2 to its joint optimum) but found no cheaper plan on any stock
    # Keras model at 8 devices, at up to 4.1x the recursion's time (bench/results/search.md).
    lookahead: bool = False
    # Price a tensor that several ops read from other devices as the emitter moves it: a
    # region a device lacks is received once, whoever reads it. Its readers read it through
    # a view (search/problem.with_views) that may be assembled whole on every part once
    # (state G(d), search/cost.py) instead of each reader fetching its own region. False:
    # every read is priced on its own.
    shared_reads: bool = False
    # How partial results are combined in the emitted graph.
    collectives: Collectives = Collectives.AUTO
    # What decides between candidate plans (storage policies, memory weights): bytes, or
    # predicted transfer time on the topology's links (search/recursive.py).
    objective: Objective = Objective.BYTES
    # Largest estimated peak bytes per device (search/memory.py) a plan may have; None: no
    # limit. The search then returns the least-communication plan it finds that fits, or
    # raises PlanInfeasibleError with the smallest peak it reached. `optimize` holds the
    # emitted step to it as well (api.optimize_imported: transfer buffers included).
    memory_budget_bytes: int | None = None
    # Seconds the search may take (all its searches, for a budget); past it, the search
    # stops at the next level boundary with a PlanInfeasibleError. None: no limit.
    search_time_limit_s: float | None = None
    # Raise UnsupportedOpError for an op type without a description, instead of keeping
    # its ops whole (run on whole inputs on every device; listed in a KeptWholeWarning).
    strict: bool = False
    # Feed each device its share of every fed tensor through a placeholder of its own
    # (`Optimized.feed_dict` cuts the values), instead of the whole value on device 0,
    # sliced and sent: on GPUs the host then copies to each device directly.
    shard_feeds: bool = False
    # Chain each device's ops with control edges in the planned order, so that the
    # executor cannot run ahead and raise the device's peak memory above the estimate.
    sequential: bool = True
    # Forward ops recomputed in the backward pass (AUTO needs a memory budget, and may
    # also move the updates early).
    recompute: Recompute = Recompute.NONE
    # The device profile (search/simulate.PROFILES) on which Recompute.AUTO and
    # `fastest_step` predict step times, and whose exchange rate prices repeated work.
    step_profile: str = "this_cpu"
    # Bytes moved that one flop of repeated computation is worth in the search's
    # objective: an op run whole on every part of a k-way cut (`replicate`) computes
    # k - 1 times its flops more than split. None: the exchange rate of `step_profile`
    # (its link bandwidth over the FLOP/s its kernels reach); 0: bytes alone (the plan
    # moving the fewest bytes, whatever it repeats).
    flop_bytes: float | None = None
    # Bytes moved that one transfer is worth in the search's objective (each message
    # between two devices has a latency; the search counts them as the emitter sends
    # them: an all-gather or all-to-all over k parts k (k - 1)). None: the
    # step profile's link latency x link bandwidth (this_cpu: 2.56 MB; tiny models then
    # run faster on logical CPUs but replicate more, past the unpartitioned step's peak
    # on some: bench/results/overhead.md); 0 (default): transfers only break ties.
    transfer_bytes: float | None = 0.0
    # Among the plans the search gives at a few memory weights (bytes moved per byte
    # stored: a plan that stores less also replicates less), keep the one predicted
    # fastest on `step_profile` (within the budget, if any) instead of the one of least
    # bytes and work alone.
    fastest_step: bool = False
    # Run each optimizer update as soon as its gradient is complete and each gradient sum
    # as a running sum (search/reorder.py): the weight gradients do not all wait for the
    # end of the backward pass.
    early_updates: bool = False
    # Cut the devices into this many pipeline stages (search/pipeline.py): each op runs on
    # the devices of one stage only, partitioned over them as the search plans one
    # stage's devices; a step that accumulates gradients over micro-batches then flows
    # through the stages. 1: no pipeline; 0: the count (1 included) whose plan is
    # predicted fastest on `step_profile` (within the budget, if any).
    pipeline_stages: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.pipeline_stages, int) or self.pipeline_stages < 0:
            raise TofuError(f"Options.pipeline_stages is {self.pipeline_stages!r}: a count "
                            "of stages is a whole number >= 0.",
                            fix="pass 1 (no pipeline), a stage count that divides the "
                                "devices, or 0 (the search chooses).")
        if not _finite_nonnegative(self.joint_ilp_seconds):
            raise TofuError(f"Options.joint_ilp_seconds is {self.joint_ilp_seconds!r}: a time "
                            "limit is a finite number of seconds >= 0.",
                            fix="pass 0 (the joint DP alone) or a positive number of seconds.")
        for name in ("flop_bytes", "transfer_bytes"):
            value = getattr(self, name)
            if value is not None and not _finite_nonnegative(value):
                raise TofuError(f"Options.{name} is {value!r}: a price in bytes is a finite "
                                "number >= 0.",
                                fix="pass 0 (not priced), a positive number of bytes, or None "
                                    "(the step profile's rate).")


def _finite_nonnegative(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
