"""Samples for ops/gather.py: gathers on every axis kind, with batch dims, and segment
reductions over one and two id dims (ids include out-of-order and repeated segments)."""

import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, sample, variable

sample("GatherV2", "axis 0", lambda p, i: tf.gather(p, i), arg((7, 5)),
       arg((6,), "int32", high=7))
sample("GatherV2", "axis 1, rank-2 indices", lambda p, i: tf.gather(p, i, axis=1),
       arg((3, 7, 5)), arg((2, 4), "int32", high=7))
sample("GatherV2", "batch dims 1", lambda p, i: tf.gather(p, i, axis=1, batch_dims=1),
       arg((3, 7, 5)), arg((3, 4), "int32", high=7))
sample("GatherV2", "axis 2, batch dims 1",
       lambda p, i: tf.gather(p, i, axis=2, batch_dims=1), arg((3, 4, 7, 5)),
       arg((3, 2), "int32", high=7))
sample("Gather", "v1", lambda p, i: tf.raw_ops.Gather(params=p, indices=i), arg((7, 5)),
       arg((6,), "int32", high=7))
sample("ResourceGather", "embedding",
       lambda v, i: tf.raw_ops.ResourceGather(resource=v.handle, indices=i, dtype=tf.float32),
       variable((9, 5)), arg((4, 3), "int32", high=9))
sample("GatherNd", "pairs", lambda p, i: tf.gather_nd(p, i), arg((7, 6, 5)),
       arg((4, 2), "int32", high=6))
sample("GatherNd", "batch dims 1", lambda p, i: tf.gather_nd(p, i, batch_dims=1),
       arg((3, 7, 5)), arg((3, 4, 1), "int32", high=7))
for op_type in ("UnsortedSegmentSum", "UnsortedSegmentMax", "UnsortedSegmentMin",
                "UnsortedSegmentProd"):
    fn = getattr(tf.raw_ops, op_type)
    sample(op_type, "rows", lambda d, i, fn=fn: fn(data=d, segment_ids=i, num_segments=5),
           arg((7, 3)), arg((7,), "int32", high=5))
sample("UnsortedSegmentSum", "two id dims",
       lambda d, i: tf.math.unsorted_segment_sum(d, i, 6), arg((3, 4, 2)),
       arg((3, 4), "int32", high=6))
sample("ScatterNd", "pairs, duplicates add",
       lambda i, u: tf.scatter_nd(i, u, tf.constant([5, 4, 3])),
       arg((6, 2), "int32", value=[[0, 1], [4, 3], [2, 0], [0, 1], [3, 2], [1, 1]]),
       arg((6, 3)))
sample("ScatterNd", "flat, as TopKV2's gradient",
       lambda i, u: tf.scatter_nd(i, u, tf.constant([10], tf.int64)),
       arg((4, 2, 1), "int64", value=[[[7], [2]], [[9], [0]], [[2], [5]], [[4], [8]]]),
       arg((4, 2)))
for op_type in ("TensorScatterUpdate", "TensorScatterAdd", "TensorScatterSub",
                "TensorScatterMax", "TensorScatterMin"):
    fn = getattr(tf.raw_ops, op_type)
    sample(op_type, "rows, a duplicate",
           lambda t, i, u, fn=fn: fn(tensor=t, indices=i, updates=u), arg((7, 4, 3)),
           arg((3, 1), "int32", value=[[5], [1], [5]]), arg((3, 4, 3)))
    sample(op_type, "elements",
           lambda t, i, u, fn=fn: fn(tensor=t, indices=i, updates=u), arg((5, 6)),
           arg((2, 2, 2), "int32", value=[[[0, 1], [4, 5]], [[2, 2], [3, 0]]]), arg((2, 2)))
