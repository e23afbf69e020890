"""Updates as early as they may run (tofu_tf/search/reorder.py): the order, and the peak."""

from __future__ import annotations

import pytest

from tofu_tf.graph import Role, split_tensor_name
from tofu_tf.importer.graphdef_io import import_graph_def
from tofu_tf.liveness import ALIASING
from tofu_tf.models import build
from tofu_tf.search.reorder import updates_early
from tofu_tf.search.memory import single_device_peak


def _graph(model, optimizer, **sizes):
    step = build(model, optimizer=optimizer, graph_only=True, batch_size=8, **sizes)
    return import_graph_def(step.graph_def, step.fetches).graph


@pytest.mark.parametrize("model,optimizer", [("mlp", "sgd"), ("wresnet", "momentum"),
                                             ("transformer", "adam")])
def test_each_variable_is_read_and_written_in_the_same_order(model, optimizer):
    graph = _graph(model, optimizer)
    early = updates_early(graph)
    added = {op.name for op in early} - {op.name for op in graph}
    assert all(early.op(n).copy_of and graph.op(early.op(n).copy_of).type == "AddN"
               for n in added)                                 # running gradient sums
    before, after = ({op.name: i for i, op in enumerate(g)} for g in (graph, early))
    for variable in graph.variables.values():
        on = [op.name for op in graph if variable.handle in op.inputs]
        assert sorted(on, key=after.get) == on, variable.name       # same order on it
        for update in variable.update_ops:
            for read in variable.read_ops:
                if before[read] < before[update]:              # its values' readers first
                    stack = list(graph.op(read).outputs)
                    while stack:
                        for reader in graph.consumers(stack.pop()):
                            assert after[reader.name] < after[update], (reader.name, update)
                            if reader.type in ALIASING:
                                stack.extend(reader.outputs)
    # every other op keeps its relative order
    rest = [op.name for op in graph if op.role not in (Role.UPDATE, Role.CONSTANT)
            and op.type != "AddN"]
    assert sorted(rest, key=after.get) == rest
    # and the updates did move: the last layer's is done before the first layer's gradient
    updates = [op for op in early if op.role is Role.UPDATE and op.name in {
        u for v in graph.variables.values() for u in v.update_ops}]
    gradients = {split_tensor_name(t)[0] for op in updates for t in op.inputs}
    assert after[updates[0].name] < max(after[g] for g in gradients if g in after)


def test_gradient_sums_add_each_term_as_it_comes():
    """The LSTM's weights are shared over its steps: each weight gradient is a sum of one
    term per step, now a running sum whose pieces follow their terms."""
    graph = _graph("lstm", "sgd")
    early = updates_early(graph)
    at = {op.name: i for i, op in enumerate(early)}
    sums = [op for op in graph if op.type == "AddN" and len(op.inputs) >= 3
            and op.role is not Role.FORWARD]
    assert sums
    for op in sums:
        chain = [p for p in early if p.copy_of == op.name]
        assert len(chain) == len(op.inputs) - 1 and all(len(p.inputs) == 2 for p in chain)
        assert chain[-1].name == op.name                     # its readers are unchanged
        terms = {t for p in chain for t in p.inputs} & set(op.inputs)
        assert terms == set(op.inputs)
        for piece in chain[:-1]:                             # right behind its later term
            latest = max(at[split_tensor_name(t)[0]] for t in piece.inputs)
            assert at[piece.name] <= latest + 1 + len(chain)
    plain, running = (single_device_peak(g) for g in (graph, early))
    assert running.transient_peak_bytes < plain.transient_peak_bytes


def test_the_weight_gradients_no_longer_wait_for_the_end():
    """WResNet-152 widen 10 at batch 8 (a paper config): on one device most of the
    transient peak is weight gradients waiting for the optimizer; updated early, they
    die as they come (27.2 -> 14.0 GiB estimated)."""
    step = build("wresnet", optimizer="sgd", graph_only=True, initializers=False, depth=152,
                 widen=10, base_width=64, image_size=224, num_classes=1000, batch_size=8)
    graph = import_graph_def(step.graph_def, step.fetches).graph
    plain, early = (single_device_peak(g) for g in (graph, updates_early(graph)))
    assert early.persistent_bytes == plain.persistent_bytes
    assert early.transient_peak_bytes < 0.6 * plain.transient_peak_bytes


def test_an_lstms_step_gradients_no_longer_pile_up():
    """LSTM-10 hidden 8192, 20 steps, batch 8 (a paper config): summed at the end, the 20
    per-step gradients of each weight are alive at once (76.3 GiB transient on one device,
    estimated); as running sums, 21.4 GiB."""
    step = build("lstm", optimizer="sgd", graph_only=True, initializers=False, layers=10,
                 hidden=8192, steps=20, embedding=512, vocab=512, num_classes=512,
                 batch_size=8)
    graph = import_graph_def(step.graph_def, step.fetches).graph
    plain, early = (single_device_peak(g) for g in (graph, updates_early(graph)))
    assert early.transient_peak_bytes < 0.35 * plain.transient_peak_bytes


def test_early_updates_lower_the_peak_tensorflow_measures():
    """The tiny LSTM (its weights shared over 20 steps) with sgd on 4 logical devices: the
    largest device peak TensorFlow's allocator records drops with the estimate."""
    from tests.memory.test_recompute import measured_peaks
    from tofu_tf.options import Options
    step = build("lstm", optimizer="sgd", graph_only=True, batch_size=8)
    peaks = measured_peaks(step, [Options(), Options(early_updates=True)])
    (measured_plain, estimated_plain), (measured_early, estimated_early) = peaks
    assert estimated_early < estimated_plain
    assert measured_early < measured_plain, peaks
