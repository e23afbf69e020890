"""Running an optimized graph in a v1 Session: shard variables from unpartitioned values,
run steps, read the variables back whole.

    runner = Runner(optimized, values)        # values: variable name -> np.ndarray
    loss = runner.run({"x:0": x, "y:0": y})[0]
    runner.values()                           # variable name -> np.ndarray, unpartitioned

TensorFlow's runtime optimizer is off in the session (it would re-optimise each device's
partition and could change low bits); the session has one logical CPU per device unless
`config` is given.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from tofu_tf._tf_graph import LazyGraph
from tofu_tf.errors import RewriteError


def session_config(num_cpus: int) -> config_pb2.ConfigProto:
    config = config_pb2.ConfigProto(device_count={"CPU": num_cpus})
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def box_slices(box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


class _SessionOwner:
    """Closes its session; usable as a context manager."""
    session: tf.compat.v1.Session

    def close(self) -> None:
        if self.session is not None:
            self.session.close()

    def abandon(self) -> None:
        """Drops the session without its close call, which on a cluster that lost a worker
        waits the whole operation timeout; the local handle is still freed."""
        if self.session is not None:
            self.session._closed = True           # noqa: SLF001 -- BaseSession skips close
            self.session = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _WholeStep(_SessionOwner):
    """A step's GraphDef run whole in a one-device v1 Session; its variables (VarHandleOps
    named in `handles`) read and set by name."""

    def __init__(self, graph_def, handles):
        self.graph = LazyGraph(graph_def)
        self._reads, self._assigns = {}, {}
        with self.graph.as_default():
            for name in handles:
                op = self.graph.get_operation_by_name(name)
                dtype = op.get_attr("dtype")
                self._reads[name] = tf.raw_ops.ReadVariableOp(resource=op.outputs[0],
                                                              dtype=dtype)
                value = tf.compat.v1.placeholder(dtype)
                self._assigns[name] = (value, tf.raw_ops.AssignVariableOp(
                    resource=op.outputs[0], value=value))
        self.session = tf.compat.v1.Session(graph=self.graph, config=session_config(1))

    def load(self, values: Mapping[str, np.ndarray]) -> None:
        """Sets the variables named in `values`."""
        self.session.run([self._assigns[name][1] for name in values],
                         {self._assigns[name][0]: value for name, value in values.items()})

    def values(self) -> dict[str, np.ndarray]:
        return self.session.run(self._reads)


class SingleDevice(_WholeStep):
    """An unpartitioned graph-only step in a one-device v1 Session, initialised by its
    `init_op`; `values()` reads every variable (by VarHandleOp name)."""

    def __init__(self, graph_def, init_op: str, fetches):
        super().__init__(graph_def, [node.name for node in graph_def.node
                                     if node.op == "VarHandleOp"])
        self.fetches = list(fetches)
        self.session.run(init_op)

    def run(self, feeds: Mapping[str, np.ndarray]):
        return self.session.run(self.fetches, dict(feeds))


class ImportedStep(_WholeStep):
    """The imported (normalised, inlined) GraphDef of a step in a one-device Session, its
    variables set from values by handle name: the graph the planner partitions, run
    whole."""

    def __init__(self, imported):
        """`imported`: an importer.graphdef_io.ImportedGraph."""
        super().__init__(imported.graph_def, imported.graph.variables)

    def load(self, values: Mapping[str, np.ndarray]) -> None:
        """Sets the variables of the step among `values` (others are ignored)."""
        super().load({name: value for name, value in values.items()
                      if name in self._assigns})

    def run(self, feeds, fetches):
        return self.session.run(list(fetches), dict(feeds))


class Runner(_SessionOwner):
    def __init__(self, optimized, values: Mapping[str, np.ndarray], *,
                 config: config_pb2.ConfigProto | None = None, target: str = ""):
        missing = sorted(set(optimized.shards) - set(values))
        if missing:
            raise RewriteError(f"no initial value for the variables {missing[:5]}.",
                               fix="pass a value for every variable of the graph.")
        self.optimized = optimized
        self.graph = LazyGraph(optimized.graph_def)
        self._assigns, self._placeholders, self._reads = [], {}, {}
        with self.graph.as_default():
            for name, shards in optimized.shards.items():
                dtype = tf.as_dtype(np.asarray(values[name]).dtype)
                for shard in shards:
                    handle = self.graph.get_tensor_by_name(shard.handle + ":0")
                    with tf.device(optimized.devices[shard.device]):
                        shape = [b - a for a, b in shard.box]
                        placeholder = tf.compat.v1.placeholder(dtype, shape)
                        self._assigns.append(tf.raw_ops.AssignVariableOp(
                            resource=handle, value=placeholder))
                        self._reads.setdefault(name, []).append(
                            (shard.box, tf.raw_ops.ReadVariableOp(resource=handle,
                                                                  dtype=dtype)))
                    self._placeholders[(name, shard.device)] = placeholder
        self.session = tf.compat.v1.Session(
            target, graph=self.graph,
            config=config or session_config(optimized.num_devices))
        self.load(values)

    def load(self, values: Mapping[str, np.ndarray]) -> None:
        """Every shard from the unpartitioned values."""
        feeds = {}
        for name, shards in self.optimized.shards.items():
            value = np.asarray(values[name])
            for shard in shards:
                feeds[self._placeholders[(name, shard.device)]] = value[box_slices(shard.box)]
        self.session.run(self._assigns, feeds)

    def run(self, feeds: Mapping[str, np.ndarray], fetches=None, **run_args):
        """`run_args`: Session.run's `options` and `run_metadata` (a traced step)."""
        return self.session.run(list(fetches or self.optimized.fetches),
                                self.optimized.feed_dict(feeds), **run_args)

    def values(self) -> dict[str, np.ndarray]:
        """Every variable, assembled whole from its shards."""
        got = self.session.run({name: [read for _, read in reads]
                                for name, reads in self._reads.items()})
        out = {}
        for name, reads in self._reads.items():
            variable = self.optimized.graph.variables[name]
            whole = np.zeros(variable.shape, dtype=got[name][0].dtype)
            for (box, _), value in zip(reads, got[name]):
                whole[box_slices(box)] = value
            out[name] = whole
        return out


class WrappedRunner:
    """The same, through `tf.compat.v1.wrap_function` in eager mode: the shards are eager
    tf.Variables on their devices (checkpointable), fed to the pruned graph as handles.
    Needs the eager context to have the plan's devices (e.g. 8 logical CPUs)."""

    def __init__(self, optimized, values: Mapping[str, np.ndarray]):
        self.optimized = optimized
        graph_def = optimized.graph_def
        wrapped = tf.compat.v1.wrap_function(
            lambda: tf.graph_util.import_graph_def(graph_def, name=""), [])
        self.shards: dict[tuple[str, int], tf.Variable] = {}
        handles = []
        for name, shards in optimized.shards.items():
            for shard in shards:
                with tf.device(optimized.devices[shard.device]):
                    variable = tf.Variable(np.asarray(values[name])[box_slices(shard.box)])
                self.shards[(name, shard.device)] = variable
                handles.append(wrapped.graph.get_tensor_by_name(shard.handle + ":0"))
        # the emitted graph's placeholders, in the order `run` passes `feed_dict`'s values
        self._placeholders = [placeholder for name in optimized.feeds for placeholder, _, _ in
                              optimized.feed_shards.get(name, ((name, 0, None),))]
        feeds = [wrapped.graph.get_tensor_by_name(p) for p in self._placeholders] + handles
        fetches = [wrapped.graph.get_tensor_by_name(f) if ":" in f
                   else wrapped.graph.get_operation_by_name(f) for f in optimized.fetches]
        self._function = wrapped.prune(feeds=feeds, fetches=fetches)
        self._handles = [self.shards[(name, s.device)].handle
                         for name, shards in optimized.shards.items() for s in shards]

    def run(self, feeds: Mapping[str, np.ndarray]):
        fed = self.optimized.feed_dict(feeds)
        return self._function(*(tf.constant(fed[p]) for p in self._placeholders),
                              *self._handles)

    def values(self) -> dict[str, np.ndarray]:
        out = {}
        for name, shards in self.optimized.shards.items():
            variable = self.optimized.graph.variables[name]
            whole = None
            for shard in shards:
                value = self.shards[(name, shard.device)].numpy()
                if whole is None:
                    whole = np.zeros(variable.shape, dtype=value.dtype)
                whole[box_slices(shard.box)] = value
            out[name] = whole
        return out
