"""A paper-size model at 8 devices fits within 1.15 x its ideal share (single / 8)."""

from __future__ import annotations

from tofu_tf.models import build
from tofu_tf.options import Options
from tofu_tf.importer.graphdef_io import import_graph_def
from tofu_tf.search.plan import make_plan


def test_lstm_10_hidden_8192_fits_115_percent_of_its_share():
    step = build("lstm", optimizer="sgd", graph_only=True, layers=10, hidden=8192, steps=20,
                 embedding=512, vocab=512, num_classes=512, batch_size=8)
    graph = import_graph_def(step.graph_def, step.fetches).graph
    free = make_plan(graph, num_devices=8)
    budget = int(1.15 * free.single_device_peak_bytes / 8)
    plan = make_plan(graph, num_devices=8, options=Options(memory_budget_bytes=budget))
    assert plan.peak_bytes <= budget
    # Meeting it is not free: the plan moves at least the least-communication plan's bytes.
    assert plan.total_bytes >= free.total_bytes
