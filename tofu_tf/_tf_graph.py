"""A GraphDef in a tf.Graph through TensorFlow's C API alone.

`tf.graph_util.import_graph_def` makes a Python `Operation` for every node (device
functions, colocation, control-flow contexts): for an emitted 8-device step that is 85%
of its time, and neither the planner's shape inference nor a Session needs it.

    import_c_graph(graph, graph_def)  the nodes in `graph`'s C graph; the new C operations
    LazyGraph(graph_def)              a tf.Graph whose nodes get their Python Operation when
                                      first named (Session.run's fetches and feeds,
                                      get_tensor_by_name, an input of a new op)

Where this TensorFlow lacks the private entry points both fall back to the public import
(`C_IMPORT` is then False).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

try:
    from tensorflow.python.client import pywrap_tf_session as _c_api
    from tensorflow.python.framework import c_api_util as _c_api_util
    from tensorflow.python.framework import ops as _ops
    C_IMPORT = all(hasattr(tf.Graph, name) for name in
                   ("_get_operation_by_name", "new_operations")) and \
        hasattr(_ops.Operation, "_from_c_op") and hasattr(tf.Graph(), "_names_in_use")
except ImportError:                           # pragma: no cover - older TensorFlow
    C_IMPORT = False


def import_c_graph(graph: tf.Graph, graph_def: graph_pb2.GraphDef) -> list:
    """`graph_def`'s nodes into `graph`'s C graph; the C operations not yet wrapped.
    Raises ValueError (TensorFlow's message) on a GraphDef TensorFlow rejects."""
    options = _c_api_util.ScopedTFImportGraphDefOptions()
    buffer = _c_api.TF_NewBufferFromString(graph_def.SerializeToString())
    try:
        with graph._c_graph.get() as c_graph:
            results = _c_api.TF_GraphImportGraphDefWithResults(c_graph, buffer,
                                                               options.options)
        _c_api_util.ScopedTFImportGraphDefResults(results)
    except tf.errors.InvalidArgumentError as error:
        raise ValueError(str(error)) from error
    finally:
        _c_api.TF_DeleteBuffer(buffer)
    return graph.new_operations()


def wrap(graph: tf.Graph, c_op):
    """A light Python Operation (name, type, inputs, outputs) over a C operation."""
    return _ops.Operation._from_c_op(c_op=c_op, g=graph)


class LazyGraph(tf.Graph):
    """A tf.Graph holding `graph_def`; a node's Python Operation is made when first named.

    `get_operations()` lists only the nodes named so far: iterate the GraphDef instead."""

    def __init__(self, graph_def: graph_pb2.GraphDef):
        super().__init__()
        self._unwrapped: dict[str, object] | None = None
        if C_IMPORT:
            self._unwrapped = {_c_api.TF_OperationName(c_op): c_op
                               for c_op in import_c_graph(self, graph_def)}
            # New ops (a runner's placeholders, reads and assigns) take other names.
            self._names_in_use.update((name.lower(), 1) for name in self._unwrapped)
            if graph_def.node:              # a Session refuses a graph of no Python ops
                self._get_operation_by_name(graph_def.node[0].name)
        else:                                 # pragma: no cover - older TensorFlow
            with self.as_default():
                tf.graph_util.import_graph_def(graph_def, name="")

    def _get_operation_by_name(self, name):
        try:
            return super()._get_operation_by_name(name)
        except KeyError:
            c_op = self._unwrapped.pop(name, None) if self._unwrapped else None
            if c_op is None:
                raise
            return wrap(self, c_op)
