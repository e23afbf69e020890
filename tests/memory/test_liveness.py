"""The liveness model on hand-made schedules: each rule, and one that breaks it."""

from __future__ import annotations

from tofu_tf.liveness import CONV_GRAD_WORKING_SET, Node, conv_grad_scratch, peaks, slice_is_view


def _node(name, inputs=(), size=100, device="d", **kwargs):
    return Node(name, device, tuple(inputs), ((name + ":0", size, "float32"),), **kwargs)


def test_a_buffer_lives_until_its_last_reader():
    # a -> b -> c, and a read again by d: a stays live over b and c.
    nodes = [_node("a"), _node("b", ["a:0"]), _node("c", ["b:0"]), _node("d", ["a:0", "c:0"])]
    (memory,) = peaks(nodes).values()
    assert memory.transient_peak_bytes == 300            # a, c, d at d (b freed after c)
    chain = [_node("a"), _node("b", ["a:0"]), _node("c", ["b:0"]), _node("d", ["c:0"])]
    assert peaks(chain)["d"].transient_peak_bytes == 200


def test_fetched_tensors_live_to_the_end():
    nodes = [_node("a"), _node("b", ["a:0"]), _node("c", ["b:0"]), _node("d", ["c:0"])]
    assert peaks(nodes, fetched={"a:0"})["d"].transient_peak_bytes == 300


def test_views_and_forwarding_take_no_new_buffer():
    viewed = [_node("a"), _node("r", ["a:0"], view_of=0), _node("s", ["r:0"])]
    assert peaks(viewed)["d"].transient_peak_bytes == 200
    forwarded = [_node("a"), _node("b", ["a:0"], forwards=(0,)), _node("c", ["b:0"], forwards=(0,))]
    assert peaks(forwarded)["d"].transient_peak_bytes == 100
    # a later reader of the input forbids forwarding: the input is not the op's alone
    shared = [_node("a"), _node("b", ["a:0"], forwards=(0,)), _node("c", ["a:0", "b:0"])]
    assert peaks(shared)["d"].transient_peak_bytes == 300
    # a different size cannot be forwarded
    grown = [_node("a"), _node("b", ["a:0"], size=200, forwards=(0,))]
    assert peaks(grown)["d"].transient_peak_bytes == 300


def test_persistent_buffers_are_never_forwarded_or_freed():
    nodes = [Node("v", "d", (), (("v:0", 0, "float32"),), persistent_bytes=400, persistent=True),
             _node("read", ["v:0"], size=400, view_of=0),
             _node("m", ["read:0"], size=400, forwards=(0,))]
    (memory,) = peaks(nodes).values()
    assert memory.persistent_bytes == 400 and memory.transient_peak_bytes == 400


def test_receive_buffers_only_without_shared_memory():
    nodes = [_node("a", device="x"), _node("b", ["a:0"], device="y"),
             _node("c", ["a:0", "b:0"], device="y")]
    shared = peaks(nodes, shared_memory=True)
    assert shared["y"].transient_peak_bytes == 200            # b and c; a counts on x
    copied = peaks(nodes, shared_memory=False)
    assert copied["y"].transient_peak_bytes == 300            # plus the received copy of a
    assert copied["x"].transient_peak_bytes == 100      # a freed once sent


def test_scratch_counts_only_while_its_node_runs():
    nodes = [_node("a"), _node("b", ["a:0"], scratch_bytes=1000), _node("c", ["b:0"])]
    (memory,) = peaks(nodes, explain=3).values()
    assert memory.transient_peak_bytes == 1200 and memory.peak_op == "b"
    assert ("b (scratch)", 1000) in memory.peak_buffers


def test_slice_views_follow_tensorflow_alignment():
    assert slice_is_view([8, 16], [2, 0], [4, 16], 4)          # rows of 64 bytes
    assert not slice_is_view([8, 3], [2, 0], [4, 3], 4)        # rows of 12 bytes
    assert not slice_is_view([8, 16], [0, 4], [8, 4], 4)       # not along dim 0
    assert slice_is_view([8, 3], [0, 0], [-1, -1], 4)          # the whole tensor
    assert slice_is_view([64], [16], [16], 4) and not slice_is_view([64], [1], [16], 4)


def test_conv_grad_scratch_fills_the_working_set():
    # One work unit per image: out 16x16, patch 7*7*3, 8 filters (float32).
    image, patch, depth = 256, 147, 8
    unit = image * patch + image * depth + patch * depth
    shards = -(-(CONV_GRAD_WORKING_SET // 4) // unit)
    assert conv_grad_scratch((7, 7, 3, 8), (16, 16), 4) == shards * image * patch * 4
    assert conv_grad_scratch((7, 7, 3, 8), (16, 16), 4) <= CONV_GRAD_WORKING_SET + unit * 4
