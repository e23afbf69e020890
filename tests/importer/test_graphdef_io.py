"""Import of training steps into the planner Graph: shapes, pruning, roles, variables,
numerical equivalence of the normalised GraphDef, typed errors, and ResNet50 import time."""

from __future__ import annotations

import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tofu_tf.errors import DynamicShapeError, GraphImportError
from tofu_tf.graph import DTYPE_SIZES, Role
from tofu_tf.models.keras_models import training_step
from tofu_tf.importer import _normalise
from tofu_tf.importer.graphdef_io import import_concrete_function, import_graph_def

RNG = np.random.default_rng(0)


# -- training steps -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def keras_adam():
    """A tiny Keras MLP trained with Adam (slots m and v per weight)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    optimizer = keras.optimizers.Adam(1e-2)
    step = training_step(model, optimizer,
                         keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cf = step.get_concrete_function(tf.TensorSpec([6, 4]), tf.TensorSpec([6], tf.int32))
    inputs = {"x:0": RNG.normal(size=(6, 4)).astype(np.float32),
              "y:0": RNG.integers(0, 3, size=6).astype(np.int32)}
    return model, optimizer, cf, inputs, import_concrete_function(cf)


@pytest.fixture(scope="module")
def momentum_step():
    """Raw tf.Variables, GradientTape and an explicit momentum-SGD update."""
    w1 = tf.Variable(RNG.normal(size=(5, 7)).astype(np.float32), name="w1")
    b1 = tf.Variable(np.zeros(7, np.float32), name="b1")
    w2 = tf.Variable(RNG.normal(size=(7, 2)).astype(np.float32), name="w2")
    weights = [w1, b1, w2]
    slots = [tf.Variable(tf.zeros_like(w), name=f"{w.name[:-2]}_momentum") for w in weights]

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
            loss = tf.reduce_mean(tf.square(tf.matmul(hidden, w2) - y))
        for w, m, g in zip(weights, slots, tape.gradient(loss, weights)):
            m.assign(0.9 * m + g)
            w.assign_sub(0.05 * m)
        return loss

    cf = step.get_concrete_function(tf.TensorSpec([3, 5]), tf.TensorSpec([3, 2]))
    inputs = {"x:0": RNG.normal(size=(3, 5)).astype(np.float32),
              "y:0": RNG.normal(size=(3, 2)).astype(np.float32)}
    return weights, slots, cf, inputs, import_concrete_function(cf)


def build_graph_mode_step():
    """tf.Graph + placeholders + tf.Variable + tf.gradients + a momentum update."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 3], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [4, 2], name="y")
        w1 = tf.Variable(RNG.normal(size=(3, 6)).astype(np.float32), name="w1")
        w2 = tf.Variable(RNG.normal(size=(6, 2)).astype(np.float32), name="w2")
        m1 = tf.Variable(np.zeros((3, 6), np.float32), name="w1_momentum")
        m2 = tf.Variable(np.zeros((6, 2), np.float32), name="w2_momentum")
        hidden = tf.tanh(tf.matmul(x, w1, name="layer1"))
        loss = tf.reduce_mean(tf.square(tf.matmul(hidden, w2, name="layer2") - y), name="loss")
        g1, g2 = tf.gradients(loss, [w1, w2])
        updates = []
        for w, m, g in ((w1, m1, g1), (w2, m2, g2)):
            new_m = m.assign(0.9 * m + g)
            updates.append(w.assign_sub(0.1 * new_m))
        train_op = tf.group(*updates, name="train_op")
        init = tf.compat.v1.global_variables_initializer()
    names = {"loss": loss.name, "train_op": train_op.name, "init": init.name,
             "w1": w1, "w2": w2, "m1": m1, "m2": m2}
    return graph, names


# -- helpers ------------------------------------------------------------------------------

def run_imported(imported, inputs, variables, fetches):
    """Run the normalised GraphDef with the given eager variables behind its handles."""
    graph_def = imported.graph_def
    wrapped = tf.compat.v1.wrap_function(
        lambda: tf.graph_util.import_graph_def(graph_def, name=""), [])
    feed_names = list(inputs) + [f"{handle}:0" for handle in variables]
    pruned = wrapped.prune(
        feeds=[wrapped.graph.get_tensor_by_name(n) for n in feed_names],
        fetches=[wrapped.graph.get_tensor_by_name(f) if ":" in f
                 else wrapped.graph.get_operation_by_name(f) for f in fetches])
    return pruned(*map(tf.constant, inputs.values()), *(v.handle for v in variables.values()))


def snapshot(variables):
    return [v.numpy().copy() for v in variables]


def restore(variables, values):
    for v, value in zip(variables, values):
        v.assign(value)


def assert_all_static(graph):
    for tensor in graph.tensors.values():
        assert all(isinstance(d, int) and d >= 0 for d in tensor.shape), tensor
        assert tensor.dtype in DTYPE_SIZES, tensor


# -- concrete function, Keras + Adam ------------------------------------------------------

def test_every_tensor_is_static_and_loss_is_fetched(keras_adam):
    *_, imported = keras_adam
    graph = imported.graph
    assert_all_static(graph)
    assert graph.fetches == ("Identity:0",)
    assert graph.tensor("Identity:0").shape == ()
    assert imported.seconds > 0 and imported.stats["nodes_out"] <= imported.stats["nodes_in"]


def test_captured_variables_become_var_handle_ops(keras_adam):
    model, optimizer, cf, _, imported = keras_adam
    nodes = {n.name: n for n in imported.graph_def.node}
    assert not [n for n in nodes.values()
                if n.op == "Placeholder" and n.attr["dtype"].type == tf.resource]
    every_variable = [v.value for v in model.variables + optimizer.variables]
    assert len(imported.graph.variables) == len(every_variable)
    captured = list(imported.captures.values())
    assert all(any(c is v for c in captured) for v in every_variable)
    for name, variable in imported.graph.variables.items():
        assert nodes[name].op == "VarHandleOp"
        assert variable.shape == tuple(imported.captures[name].shape)
        assert imported.graph.tensor(variable.handle).is_resource


def test_adam_slots_and_trainable_flags(keras_adam):
    model, optimizer, _, _, imported = keras_adam
    handle_of = {id(v): name for name, v in imported.captures.items()}
    variables = imported.graph.variables
    for weight in model.trainable_variables:
        handle = handle_of[id(weight.value)]
        assert variables[handle].trainable
        prefix = weight.path.replace("/", "_")
        slots = [v for v in optimizer.variables
                 if v.path.endswith((f"{prefix}_momentum", f"{prefix}_velocity"))]
        assert len(slots) == 2
        for slot in slots:
            slot_var = variables[handle_of[id(slot.value)]]
            assert slot_var.slot_of == handle and not slot_var.trainable
    for scalar in (optimizer.iterations, optimizer.learning_rate):
        variable = variables[handle_of[id(scalar.value)]]
        assert variable.slot_of is None and not variable.trainable


def test_roles_and_forward_links(keras_adam):
    *_, imported = keras_adam
    graph = imported.graph
    forward_matmuls = [op for op in graph if op.type == "MatMul" and op.role is Role.FORWARD]
    assert len(forward_matmuls) == 2
    for forward in forward_matmuls:
        grads = [op for op in graph if op.forward_op == forward.name]
        assert grads and all(op.role is Role.BACKWARD for op in grads)
        assert {op.type for op in grads} <= {"MatMul"}
    # the first layer's input gradient is dead and pruned: one gradient MatMul only
    first = min(forward_matmuls, key=lambda op: op.name)
    assert len([op for op in graph if op.forward_op == first.name]) == 1
    assert {op.role for op in graph if op.type.startswith("Assign")} == {Role.UPDATE}
    assert {op.role for op in graph if op.type == "Placeholder"} == {Role.INPUT}
    assert {op.role for op in graph if op.type == "VarHandleOp"} == {Role.VARIABLE}
    assert {op.role for op in graph if op.type == "Const"} == {Role.CONSTANT}


def test_attrs_are_plain_python_and_small_constants_kept(keras_adam):
    *_, imported = keras_adam
    graph = imported.graph
    matmul = next(op for op in graph if op.type == "MatMul")
    assert matmul.attr("T") == "float32" and matmul.attr("transpose_a") in (True, False)
    for op in graph:
        assert not any(key.startswith("_") for key in op.attrs)
        if op.type == "Const":
            assert "value" not in op.attrs
            assert isinstance(graph.constant_value(op.outputs[0]), np.ndarray)
    handle = next(op for op in graph if op.type == "VarHandleOp")
    assert isinstance(handle.attr("shape"), tuple) and isinstance(handle.attr("shared_name"), str)


def test_normalised_graph_computes_the_same_step(keras_adam):
    model, optimizer, cf, inputs, imported = keras_adam
    state = [imported.captures[name] for name in imported.graph.variables]
    before = snapshot(state)
    (loss_imported,) = run_imported(imported, inputs, dict(zip(imported.graph.variables, state)),
                                    list(imported.graph.fetches))
    after_imported = snapshot(state)
    restore(state, before)
    loss_original = cf(*(tf.constant(v) for v in inputs.values()))
    np.testing.assert_allclose(loss_imported.numpy(), loss_original.numpy(), rtol=1e-6)
    for got, want in zip(after_imported, snapshot(state)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after_imported))


# -- concrete function, raw variables + momentum --------------------------------------------

def test_momentum_slots_roles_and_numerics(momentum_step):
    weights, slots, cf, inputs, imported = momentum_step
    graph = imported.graph
    handle_of = {id(v): name for name, v in imported.captures.items()}
    for weight, slot in zip(weights, slots):
        assert graph.variables[handle_of[id(weight)]].trainable
        assert graph.variables[handle_of[id(slot)]].slot_of == handle_of[id(weight)]
        assert graph.variables[handle_of[id(weight)]].shape == tuple(weight.shape)
    assert {graph.op(u).type for v in graph.variables.values() for u in v.update_ops} == \
        {"AssignVariableOp", "AssignSubVariableOp"}
    state = weights + slots
    before = snapshot(state)
    variables = {handle_of[id(v)]: v for v in state}
    (loss_imported,) = run_imported(imported, inputs, variables, list(graph.fetches))
    after_imported = snapshot(state)
    restore(state, before)
    loss_original = cf(*(tf.constant(v) for v in inputs.values()))
    np.testing.assert_allclose(loss_imported.numpy(), loss_original.numpy(), rtol=1e-6)
    for got, want in zip(after_imported, snapshot(state)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_nested_tf_function_is_inlined():
    w = tf.Variable(RNG.normal(size=(4, 3)).astype(np.float32))

    @tf.function
    def layer(x):
        return tf.nn.relu(tf.matmul(x, w))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x) ** 2)
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    imported = import_concrete_function(step.get_concrete_function(tf.TensorSpec([2, 4])))
    graph = imported.graph
    assert not {"PartitionedCall", "StatefulPartitionedCall"} & set(graph.op_types())
    forward = next(op for op in graph if op.type == "MatMul" and op.role is Role.FORWARD)
    grads = [op for op in graph if op.type == "MatMul" and op.role is Role.BACKWARD]
    assert grads and all(op.forward_op == forward.name for op in grads)
    assert graph.variables[next(iter(graph.variables))].trainable


# -- graph mode: tf.Graph + tf.gradients --------------------------------------------------------

def test_graph_mode_step_imports_and_computes_the_same():
    graph, names = build_graph_mode_step()
    graph_def = graph.as_graph_def()
    fetches = [names["loss"], names["train_op"]]
    imported = import_graph_def(graph_def, fetches, feeds=["x:0", "y:0"])
    planner = imported.graph
    assert_all_static(planner)
    # tf.gradients builds the input gradient of layer1 (dead); pruning drops it
    raw_grads = {n.name for n in graph_def.node if n.name.startswith("gradients/layer1_grad/")
                 and n.op == "MatMul"}
    assert len(raw_grads) == 2
    kept = {op.name for op in planner if op.forward_op == "layer1"}
    assert len(kept) == 1 and kept < raw_grads
    assert {planner.op(n).forward_op for n in ("gradients/layer2_grad/MatMul",
                                               "gradients/layer2_grad/MatMul_1")} == {"layer2"}
    assert planner.op("layer1").role is Role.FORWARD
    initializers = {n.name for n in graph_def.node if "/Initializer/" in n.name}
    assert initializers and not initializers & {op.name for op in planner}
    var = planner.variables
    assert var["w1"].trainable and var["w2"].trainable and var["w1"].shape == (3, 6)
    assert var["w1_momentum"].slot_of == "w1" and var["w2_momentum"].slot_of == "w2"
    assert not var["w1_momentum"].trainable

    x = RNG.normal(size=(4, 3)).astype(np.float32)
    y = RNG.normal(size=(4, 2)).astype(np.float32)
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(names["init"])
        initial = session.run({k: names[k].value() for k in ("w1", "w2", "m1", "m2")})
        want_loss, _ = session.run(fetches, {"x:0": x, "y:0": y})
        want_w1 = session.run(names["w1"].value())
    eager = {name: tf.Variable(initial[key]) for name, key in
             (("w1", "w1"), ("w2", "w2"), ("w1_momentum", "m1"), ("w2_momentum", "m2"))}
    got_loss, _ = run_imported(imported, {"x:0": x, "y:0": y}, eager, list(planner.fetches))
    np.testing.assert_allclose(got_loss.numpy(), want_loss, rtol=1e-6)
    np.testing.assert_allclose(eager["w1"].numpy(), want_w1, rtol=1e-5, atol=1e-7)


def test_v1_optimizer_slots_in_graph_mode():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 3], name="x")
        w1 = tf.Variable(np.ones((3, 6), np.float32), name="w1")
        w2 = tf.Variable(np.ones((6, 1), np.float32), name="w2")
        loss = tf.reduce_mean(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2) ** 2)
        train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
    planner = import_graph_def(graph.as_graph_def(), [loss.name, train_op.name]).graph
    var = planner.variables
    for weight in ("w1", "w2"):
        assert var[weight].trainable
        assert planner.op(var[weight].update_ops[0]).type == "ResourceApplyAdam"
        assert var[f"{weight}/Adam"].slot_of == weight == var[f"{weight}/Adam_1"].slot_of
    assert var["beta1_power"].slot_of is None and not var["beta1_power"].trainable
    assert planner.op(train_op.name).role is Role.UPDATE
    assert {planner.op(n).forward_op for n in ("gradients/MatMul_grad/MatMul_1",
                                               "gradients/Relu_grad/ReluGrad")} == \
        {"MatMul", "Relu"}


def test_feeding_an_intermediate_tensor_cuts_its_fan_in():
    graph, names = build_graph_mode_step()
    imported = import_graph_def(graph.as_graph_def(), [names["loss"]], feeds=["Tanh:0", "y:0"])
    planner = imported.graph
    assert planner.op("Tanh").type == "Placeholder" and planner.op("Tanh").role is Role.INPUT
    assert planner.tensor("Tanh:0").shape == (4, 6)
    assert "layer1" not in planner and "x" not in planner
    assert set(planner.variables) == {"w2"}


def test_shape_ops_of_static_tensors_fold_to_constants():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [3, 2], name="y")
        shapes = tf.raw_ops.ShapeN(input=[x, y], name="shapes")
        out = tf.reshape(y, shapes[0], name="out") + tf.reshape(x, shapes[0])
    graph_def = graph.as_graph_def()
    shapes_by_op = {"x": [((2, 3), "float32")], "y": [((3, 2), "float32")]}
    folded = _normalise.fold_shape_ops(graph_def, shapes_by_op)
    nodes = {n.name: n for n in folded.node}
    assert "shapes" not in nodes and nodes["shapes/folded_0"].op == "Const"
    assert list(nodes["out"].input) == ["y", "shapes/folded_0"]
    assert shapes_by_op["shapes/folded_1"] == [((2,), "int32")]
    with tf.compat.v1.Session(graph=tf.Graph()) as session:
        tf.graph_util.import_graph_def(folded, name="")
        feeds = {"x:0": np.ones((2, 3)), "y:0": np.arange(6.0).reshape(3, 2)}
        got = session.run(out.name, feeds)
    with tf.compat.v1.Session(graph=graph) as session:
        np.testing.assert_array_equal(got, session.run(out, feeds))


def test_equal_constants_merge_and_stop_gradients_are_bypassed():
    """Per-op Consts of one value become one Const; Consts of another value, dtype or
    device stay apart; StopGradient is bypassed; the imported step computes the same."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 3, 2], name="x")
        means = [tf.reduce_mean(x * 0.5, [0, 1]), tf.reduce_mean(x * 0.5, [0, 1])]
        other = tf.reduce_mean(x * 0.25, [0, 1]) + tf.cast(tf.reduce_sum(
            tf.cast(x, tf.float64) * tf.constant(0.5, tf.float64), [0, 1]), tf.float32)
        with tf.device("/device:CPU:0"):
            placed = tf.reduce_mean(x * 0.5, [0, 1])
        out = tf.identity(tf.stop_gradient(means[0] + means[1]) + other + placed, name="out")
    planner = import_graph_def(graph.as_graph_def(), ["out:0"]).graph
    consts = [op for op in planner if op.type == "Const"]
    values = sorted((op.attrs["dtype"], np.asarray(planner.constants[op.outputs[0]]).tolist())
                    for op in consts if op.outputs[0] in planner.constants)
    # 0.5 float32 twice (unplaced and placed), [0, 1] twice, 0.25 once, 0.5 float64 once
    assert values.count(("float32", 0.5)) == 2 and values.count(("int32", [0, 1])) == 2
    assert ("float32", 0.25) in values and ("float64", 0.5) in values
    assert not [op for op in planner if op.type == "StopGradient"]
    imported = import_graph_def(graph.as_graph_def(), ["out:0"])
    feeds = {"x:0": RNG.normal(size=(4, 3, 2)).astype(np.float32)}
    got = run_imported(imported, feeds, {}, ["out:0"])
    with tf.compat.v1.Session(graph=graph) as session:
        np.testing.assert_allclose(got[0].numpy(), session.run(out, feeds), rtol=1e-6)


# -- typed errors -------------------------------------------------------------------------

def test_while_loop_is_rejected_naming_the_while_node():
    @tf.function
    def step(x, n):
        for _ in tf.range(n):
            x = x * 2.0
        return tf.reduce_sum(x)

    cf = step.get_concrete_function(tf.TensorSpec([3]), tf.TensorSpec([], tf.int32))
    with pytest.raises(GraphImportError) as caught:
        import_concrete_function(cf)
    assert caught.value.op_type in ("While", "StatelessWhile")
    assert caught.value.node in {n.name for n in cf.graph.as_graph_def().node}
    assert "unroll" in str(caught.value)


def test_unknown_batch_dimension_raises_dynamic_shape_error():
    w = tf.Variable(tf.ones([4, 2]))

    @tf.function
    def step(x):
        return tf.reduce_sum(tf.matmul(x, w))

    with pytest.raises(DynamicShapeError) as caught:
        import_concrete_function(step.get_concrete_function(tf.TensorSpec([None, 4])))
    assert caught.value.node == "x" and caught.value.op_type == "Placeholder"
    assert "tf.TensorSpec(" in str(caught.value)


def test_missing_fetch_raises():
    graph, _ = build_graph_mode_step()
    with pytest.raises(GraphImportError) as caught:
        import_graph_def(graph.as_graph_def(), ["no_such_node:0"])
    assert caught.value.node == "no_such_node:0"


def test_graph_def_with_captured_resources_needs_the_function(keras_adam):
    *_, cf, _, _ = keras_adam
    with pytest.raises(GraphImportError, match="import_concrete_function"):
        import_graph_def(cf.graph.as_graph_def(), ["Identity:0"])


def test_unimportable_graph_def_is_wrapped():
    graph_def = tf.Graph().as_graph_def()
    node = graph_def.node.add(name="odd", op="NoSuchOpType")
    node.input.append("x")
    x = graph_def.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = tf.float32.as_datatype_enum
    x.attr["shape"].shape.dim.add(size=2)
    with pytest.raises(GraphImportError) as caught:
        import_graph_def(graph_def, ["odd"])
    assert "NoSuchOpType" in str(caught.value)


# -- ResNet50 ----------------------------------------------------------------------------

def test_resnet50_training_step_imports_fast():
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))
    optimizer = keras.optimizers.Adam(1e-3)
    step = training_step(model, optimizer, keras.losses.SparseCategoricalCrossentropy())
    cf = step.get_concrete_function(tf.TensorSpec([2, 224, 224, 3]),
                                    tf.TensorSpec([2], tf.int32))
    start = time.perf_counter()
    imported = import_concrete_function(cf)
    seconds = time.perf_counter() - start
    stats = dict(imported.stats)
    print(f"\nResNet50 import: {seconds:.2f} s total, Grappler "
          f"{stats.get('grappler_seconds', 0.0):.2f} s, "
          f"nodes {stats['nodes_in']:.0f} -> {stats['nodes_out']:.0f}")
    assert seconds < 10.0
    graph = imported.graph
    assert_all_static(graph)
    variables = graph.variables.values()
    assert len(graph.variables) == len(model.variables) + len(optimizer.variables)
    trainable = [v for v in variables if v.trainable]
    assert len(trainable) == len(model.trainable_variables)
    slot_owners = [v.slot_of for v in variables if v.slot_of]
    assert sorted(slot_owners) == sorted(2 * [v.name for v in trainable])
    conv1_input_grads = [op for op in graph if op.type == "Conv2DBackpropInput"
                         and op.forward_op and "conv1_conv" in op.forward_op]
    assert not conv1_input_grads
    assert not {"Shape", "ShapeN", "BroadcastGradientArgs"} & set(graph.op_types())
    convs = [op for op in graph if op.type == "Conv2D"]
    assert all(op.role is Role.FORWARD for op in convs)
    filter_grads = [op for op in graph if op.type == "Conv2DBackpropFilter"]
    assert {op.forward_op for op in filter_grads} == {op.name for op in convs}


def test_fused_batch_norm_scratch_output_imports():
    """FusedBatchNormV3's reserve space has no static shape; it carries no step data."""
    scale, offset = tf.Variable(tf.ones([4])), tf.Variable(tf.zeros([4]))
    kernel = tf.Variable(tf.ones([3, 3, 3, 4]))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = tf.nn.conv2d(x, kernel, 1, "SAME")
            y, _, _ = tf.compat.v1.nn.fused_batch_norm(y, scale, offset, is_training=True)
            loss = tf.reduce_sum(y * y)
        for v, g in zip([kernel, scale, offset], tape.gradient(loss, [kernel, scale, offset])):
            v.assign_sub(0.1 * g)
        return loss

    graph = import_concrete_function(step.get_concrete_function(tf.TensorSpec([2, 5, 5, 3]))).graph
    (bn,) = [op for op in graph if op.type == "FusedBatchNormV3"]
    assert graph.tensor(bn.outputs[5]).shape == (0,)
    assert graph.tensor(bn.outputs[0]).shape == (2, 5, 5, 4)
    assert "FusedBatchNormGradV3" in graph.op_types()


def test_colocation_with_a_pruned_node_is_dropped():
    """tf.gradients colocates each gradient op with its forward op (`_class: loc:@op`); a
    step that fetches the gradient but not the loss prunes the loss, and TensorFlow
    rejects a node colocated with a node that is not there."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (4, 3), name="x")
        loss = tf.reduce_sum(tf.square(x), name="loss")
        tf.identity(tf.gradients(loss, x)[0], name="dx")
    graph_def = graph.as_graph_def()
    assert any(b"loc:@loss" in n.attr["_class"].list.s for n in graph_def.node
               if "_class" in n.attr)
    imported = import_graph_def(graph_def, ["dx:0"], feeds=["x:0"])
    assert "loss" not in {op.name for op in imported.graph}
