"""`tofu_tf.optimize`: a training step's GraphDef in, a device-placed GraphDef out.

    optimized = tofu_tf.optimize(graph_def, fetches=["loss:0", "train_op"],
                                 feeds=["x:0", "y:0"], num_devices=8)
    optimized.graph_def      # runs in a v1 Session or through wrap_function
    optimized.plan           # the plan it follows
    optimized.ledger         # every cross-device transfer

The result's variables are shards (one VarHandleOp per device, `optimized.shards`);
`tofu_tf.runtime` initialises them from unpartitioned values and reads them back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from tensorflow.core.framework import graph_pb2

from tofu_tf.errors import TofuError
from tofu_tf.graph import Graph
from tofu_tf.op_semantics.catalog import catalog
from tofu_tf.options import Options
from tofu_tf.rewrite.emit import Shard, emit
from tofu_tf.rewrite.graphdef_io import import_graph_def
from tofu_tf.rewrite.ledger import Ledger
from tofu_tf.rewrite.verify import verify
from tofu_tf.search.plan import Plan, make_plan
from tofu_tf.search.topology import Topology


@dataclass(frozen=True)
class Optimized:
    graph_def: graph_pb2.GraphDef
    plan: Plan
    ledger: Ledger
    shards: Mapping[str, tuple[Shard, ...]]    # original variable -> its shards
    devices: tuple[str, ...]
    fetches: tuple[str, ...]                   # fetch names (the input's names)
    feeds: tuple[str, ...]
    graph: Graph                               # the planner graph the plan is for

    @property
    def num_devices(self) -> int:
        return len(self.devices)


def optimize(graph_def: graph_pb2.GraphDef, fetches: Sequence[str], *,
             feeds: Sequence[str] = (), num_devices: int | None = None,
             topology: Topology | str | None = None, options: Options = Options(),
             devices: Sequence[str] | None = None, plan: Plan | None = None,
             expose: Sequence[str] = ()) -> Optimized:
    """Partition a training step. `fetches`: tensor ('loss:0') or op ('train_op') names;
    `feeds`: the placeholders fed each step; `num_devices` or `topology` ('2x4');
    `devices`: device names (default: this host's logical CPUs)."""
    topology = _topology(num_devices, topology)
    imported = import_graph_def(graph_def, list(fetches), feeds=list(feeds))
    entries = catalog(imported.graph, strict=True)
    plan = plan or make_plan(imported.graph, topology, options=options)
    emitted = emit(imported.graph, imported.graph_def, entries, plan, devices=devices,
                   feeds=feeds, expose=expose)
    verify(emitted, imported.graph)
    return Optimized(emitted.graph_def, plan, emitted.ledger, emitted.shards,
                     emitted.devices, emitted.fetches, tuple(feeds), imported.graph)


def _topology(num_devices: int | None, topology: Topology | str | None) -> Topology:
    if (num_devices is None) == (topology is None):
        raise TofuError("pass exactly one of num_devices and topology.",
                        fix="e.g. num_devices=8, or topology='2x4'.")
    if topology is None:
        return Topology.default(num_devices)
    return Topology.parse(topology) if isinstance(topology, str) else topology
