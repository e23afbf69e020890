"""A variable read through its handle off the device's shard: the values come from the
shards that hold them, and the op runs on those values."""

from __future__ import annotations

from tofu_tf.options import Options
from tofu_tf.rewrite.partition import ON_VALUES

from tests.rewrite.equivalence import compare


def test_a_gather_reads_a_sharded_table_off_its_shards():
    """LSTM at 3 devices, any tensor replicable: the plan stores the embedding table in
    shards (updating it whole everywhere would repeat the work) while the gather's
    indices are split, so every device reads the whole table: a ResourceGather becomes a
    GatherV2 on the values read from the shards. Same numbers; the ledger is the
    prediction, which prices those reads."""
    optimized = compare("lstm", "sgd", topology="3", dtype="float64",
                        options=Options(replicate_below=10 ** 9))
    assert {n.op for n in optimized.graph_def.node if "Gather" in n.op} == \
        {ON_VALUES["ResourceGather"]}
    assert optimized.ledger.step_bytes == optimized.plan.predicted_bytes
