"""Tests of lmscore.tfgraph on tiny models (TensorFlow required)."""

from __future__ import annotations

import os

import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from lmscore import tfgraph  # noqa: E402
from lmscore.errors import GraphError  # noqa: E402

RESOURCE = tf.resource.as_datatype_enum
WRITE_OPS = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def parse(data: bytes):
    assert isinstance(data, bytes) and data
    return tf.compat.v1.GraphDef.FromString(data)


def all_nodes(graph_def):
    yield from graph_def.node
    for fdef in graph_def.library.function:
        yield from fdef.node_def


def placeholder_dims(graph_def, name):
    node = next(n for n in graph_def.node if n.name == name)
    assert node.op == "Placeholder"
    return [d.size for d in node.attr["_output_shapes"].list.shape[0].dim]


def writes(graph_def):
    return [
        n for n in all_nodes(graph_def) if n.op in WRITE_OPS or n.op.startswith("ResourceApply")
    ]


def tiny_dense():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return model, loss


X_SPEC = tf.TensorSpec([None, 4], tf.float32, name="x")
Y_SPEC = tf.TensorSpec([None], tf.int32, name="y")


@pytest.fixture(scope="module")
def dense_bytes():
    model, loss = tiny_dense()
    return tfgraph.graphdef_from_keras(model, loss, keras.optimizers.Adam(), X_SPEC, Y_SPEC)


@pytest.mark.tf
def test_keras_graph_has_shapes_batch_and_update(dense_bytes):
    graph_def = parse(dense_bytes)
    assert all("_output_shapes" in n.attr for n in all_nodes(graph_def))
    assert placeholder_dims(graph_def, "x") == [-1, 4]
    assert placeholder_dims(graph_def, "y") == [-1]
    ops = {n.op for n in graph_def.node}
    assert {"MatMul", "ReluGrad", "BiasAddGrad", "SparseSoftmaxCrossEntropyWithLogits"} <= ops
    # Adam: m and v updated, weights decremented, iteration counter incremented.
    assert {"AssignAddVariableOp", "AssignSubVariableOp", "AssignVariableOp"} <= ops
    assert len(writes(graph_def)) >= 4 * 3
    resources = [
        n for n in graph_def.node if n.op == "Placeholder" and n.attr["dtype"].type == RESOURCE
    ]
    assert len(resources) >= 4  # the weights are captured, not embedded as constants
    assert not any(n.op in ("VarHandleOp", "VariableV2") for n in graph_def.node)


@pytest.mark.tf
def test_keras_graph_imports_into_tensorflow(dense_bytes):
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(parse(dense_bytes), name="")
    assert graph.get_operation_by_name("x").outputs[0].shape.as_list() == [None, 4]


@pytest.mark.tf
def test_train_step_function_runs_and_updates():
    model, loss = tiny_dense()
    optimizer = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    cf = tfgraph.train_step_function(model, loss, optimizer, (X_SPEC, Y_SPEC))
    assert isinstance(cf, tf.types.experimental.ConcreteFunction)
    before = [v.numpy().copy() for v in model.trainable_variables]
    value = cf(tf.ones([5, 4]), tf.constant([0, 1, 2, 0, 1], tf.int32))
    assert value.shape == [] and float(value) > 0
    assert int(optimizer.iterations.numpy()) == 1
    after = [v.numpy() for v in model.trainable_variables]
    assert any((a != b).any() for a, b in zip(after, before, strict=True))
    data = tfgraph.graphdef_from_concrete_function(cf)
    assert data == tfgraph.graphdef_from_concrete_function(cf)  # deterministic
    graph_def = parse(data)
    assert {"AssignVariableOp", "AssignAddVariableOp"} <= {n.op for n in graph_def.node}


@pytest.mark.tf
def test_multi_input_dict_and_regularization_loss():
    a = keras.Input((3,), name="a")
    b = keras.Input((2,), name="b")
    joined = keras.layers.Concatenate()([a, b])
    out = keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L2(0.01))(joined)
    model = keras.Model({"a": a, "b": b}, out)
    x_spec = {
        "a": tf.TensorSpec([None, 3], tf.float32, name="in_a"),
        "b": tf.TensorSpec([None, 2], tf.float32, name="in_b"),
    }
    data = tfgraph.graphdef_from_keras(
        model,
        keras.losses.MeanSquaredError(),
        keras.optimizers.Adam(),
        x_spec,
        tf.TensorSpec([None, 2], tf.float32, name="target"),
    )
    graph_def = parse(data)
    assert placeholder_dims(graph_def, "in_a") == [-1, 3]
    assert placeholder_dims(graph_def, "in_b") == [-1, 2]
    assert placeholder_dims(graph_def, "target") == [-1, 2]
    assert writes(graph_def)
    assert any("AddN" == n.op for n in graph_def.node)  # the regularization term is added


@pytest.mark.tf
def test_lstm_keeps_while_bodies_in_library():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3, 2)), keras.layers.LSTM(4), keras.layers.Dense(2)])
    data = tfgraph.graphdef_from_keras(
        model,
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        keras.optimizers.Adam(),
        tf.TensorSpec([None, 3, 2], tf.float32, name="x"),
        Y_SPEC,
    )
    graph_def = parse(data)
    library = {f.signature.name for f in graph_def.library.function}
    loops = [n for n in graph_def.node if n.op in ("While", "StatelessWhile")]
    assert len(loops) >= 2  # the forward loop and its gradient loop
    for node in loops:
        assert node.attr["body"].func.name in library
        assert node.attr["cond"].func.name in library
    assert all("_output_shapes" in n.attr for n in all_nodes(graph_def))
    assert placeholder_dims(graph_def, "x") == [-1, 3, 2]


@pytest.mark.tf
def test_graphdef_from_function_accepts_tf_function_and_concrete():
    v = tf.Variable(tf.zeros([3]))

    @tf.function
    def update(x):
        v.assign_add(tf.reduce_sum(x, axis=0))
        return tf.reduce_sum(v)

    spec = tf.TensorSpec([None, 3], tf.float32, name="x")
    from_poly = parse(tfgraph.graphdef_from_function(update, spec))
    assert placeholder_dims(from_poly, "x") == [-1, 3]
    assert any(n.op == "AssignAddVariableOp" for n in from_poly.node)
    cf = update.get_concrete_function(spec)
    assert tfgraph.graphdef_from_function(cf) == tfgraph.graphdef_from_concrete_function(cf)
    with pytest.raises(TypeError):
        tfgraph.graphdef_from_function(cf, spec)
    with pytest.raises(TypeError):
        tfgraph.graphdef_from_function(lambda x: x, spec)


class Trainer(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.ones([4, 2]))
        self.b = tf.Variable(tf.zeros([2]))

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 4], tf.float32, name="x"),
            tf.TensorSpec([None, 2], tf.float32, name="y"),
        ]
    )
    def train_step(self, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(x @ self.w + self.b - y))
        gw, gb = tape.gradient(loss, [self.w, self.b])
        self.w.assign_sub(0.1 * gw)
        self.b.assign_sub(0.1 * gb)
        return loss

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def predict(self, x):
        return x @ self.w + self.b


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("sm") / "trainer"
    module = Trainer()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.predict})
    return path


@pytest.mark.tf
def test_saved_model_default_is_train_step(saved_model):
    graph_def = parse(tfgraph.graphdef_from_saved_model(saved_model))
    assert placeholder_dims(graph_def, "x") == [-1, 4]
    assert placeholder_dims(graph_def, "y") == [-1, 2]
    assert sum(n.op == "AssignSubVariableOp" for n in all_nodes(graph_def)) == 2
    assert all("_output_shapes" in n.attr for n in all_nodes(graph_def))
    assert tfgraph.graphdef_from_saved_model(saved_model, "train_step") == (
        tfgraph.graphdef_from_saved_model(str(saved_model))
    )


@pytest.mark.tf
def test_saved_model_select_function_and_signature(saved_model):
    predict = parse(tfgraph.graphdef_from_saved_model(saved_model, "predict"))
    assert placeholder_dims(predict, "x") == [-1, 4]
    assert not writes(predict)
    signature = parse(tfgraph.graphdef_from_saved_model(saved_model, "serving_default"))
    called = {
        n.attr["f"].func.name
        for n in signature.node
        if n.op in ("PartitionedCall", "StatefulPartitionedCall")
    }
    assert called and called <= {f.signature.name for f in signature.library.function}


@pytest.mark.tf
def test_saved_model_unknown_name(saved_model):
    with pytest.raises(GraphError) as info:
        tfgraph.graphdef_from_saved_model(saved_model, "no_such_function")
    message = str(info.value)
    assert str(saved_model) in message and "no_such_function" in message
    assert "train_step" in message and "serving_default" in message
    assert "\n" not in message


@pytest.mark.tf
def test_saved_model_without_default(tmp_path):
    module = tf.Module()
    module.v = tf.Variable(1.0)
    module.f = tf.function(lambda x: x * module.v, input_signature=[tf.TensorSpec([None])])
    module.g = tf.function(lambda x: x + module.v, input_signature=[tf.TensorSpec([None])])
    only_signature = tmp_path / "one"
    tf.saved_model.save(module, str(only_signature), signatures=module.f)
    assert parse(tfgraph.graphdef_from_saved_model(only_signature)).node
    none = tmp_path / "none"
    tf.saved_model.save(module, str(none), signatures={})
    with pytest.raises(GraphError, match="f \\(function\\), g \\(function\\)") as info:
        tfgraph.graphdef_from_saved_model(none)
    assert str(none) in str(info.value)


@pytest.mark.tf
def test_saved_model_missing_or_corrupt(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(GraphError) as info:
        tfgraph.graphdef_from_saved_model(missing)
    assert str(missing) in str(info.value)
    assert info.value.__context__ is None

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(GraphError) as info:
        tfgraph.graphdef_from_saved_model(empty)
    assert str(empty) in str(info.value) and "\n" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no TF traceback

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "saved_model.pb").write_bytes(b"\x00not a protobuf\xff" * 3)
    with pytest.raises(GraphError) as info:
        tfgraph.graphdef_from_saved_model(corrupt)
    assert str(corrupt) in str(info.value) and "\n" not in str(info.value)

    plain_file = tmp_path / "file.pb"
    plain_file.write_bytes(b"")
    with pytest.raises(GraphError, match=os.path.basename(plain_file)):
        tfgraph.graphdef_from_saved_model(plain_file)


@pytest.mark.tf
def test_graphdef_with_shapes_fills_missing_shapes():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", [4, 3], use_resource=True)
        y = tf.matmul(x, w.read_value(), name="y")
        tf.compat.v1.assign_add(w, tf.ones([4, 3]), name="update")
        tf.reduce_sum(y, name="total")
    graph_def = graph.as_graph_def()
    assert not any("_output_shapes" in n.attr for n in graph_def.node)
    data = tfgraph.graphdef_with_shapes(graph_def.SerializeToString(), source="bare.pb")
    completed = parse(data)
    assert [n.name for n in completed.node] == [n.name for n in graph_def.node]
    assert all("_output_shapes" in n.attr for n in completed.node)
    assert placeholder_dims(completed, "x") == [-1, 4]
    y_node = next(n for n in completed.node if n.name == "y")
    assert [d.size for d in y_node.attr["_output_shapes"].list.shape[0].dim] == [-1, 3]
    # Already complete graphs are unchanged.
    assert tfgraph.graphdef_with_shapes(data, source="bare.pb") == data


@pytest.mark.tf
def test_graphdef_with_shapes_errors_name_the_source():
    with pytest.raises(GraphError, match="garbage.pb") as info:
        tfgraph.graphdef_with_shapes(b"\xff\xfe not a graph", source="garbage.pb")
    assert "\n" not in str(info.value)
    bad = tf.compat.v1.GraphDef()
    node = bad.node.add(name="a", op="Identity")
    node.input.append("missing_node")
    with pytest.raises(GraphError, match="dangling.pb") as info:
        tfgraph.graphdef_with_shapes(bad.SerializeToString(), source="dangling.pb")
    assert "\n" not in str(info.value)


def test_captured_constants_are_written_into_the_graph():
    """A tensor made outside the step (a diffusion schedule) is captured: it was a
    placeholder, which validation fed with random numbers (a schedule's square root became
    NaN). Its values are in the graph now; variables stay placeholders."""
    import numpy as np

    schedule = tf.constant(np.linspace(0.1, 0.9, 200), tf.float32)
    w = tf.Variable(tf.ones([16, 4]))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            a = tf.gather(schedule, tf.range(tf.shape(x)[0]))[:, None]
            loss = tf.reduce_mean(tf.sqrt(a) * x @ w)
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    cf = step.get_concrete_function(tf.TensorSpec([None, 16], tf.float32))
    gd = tf.compat.v1.GraphDef.FromString(tfgraph.graphdef_from_concrete_function(cf))
    consts = [n for n in gd.node if n.op == "Const" and n.attr["value"].tensor.tensor_shape.dim
              and n.attr["value"].tensor.tensor_shape.dim[0].size == 200]
    assert len(consts) == 1
    np.testing.assert_array_equal(tf.make_ndarray(consts[0].attr["value"].tensor),
                                  schedule.numpy())
    assert [d.size for d in consts[0].attr["_output_shapes"].list.shape[0].dim] == [200]
    holders = {n.name: n.attr["dtype"].type for n in gd.node if n.op == "Placeholder"}
    assert sorted(holders.values()) == sorted([tf.float32.as_datatype_enum,
                                               tf.resource.as_datatype_enum])
