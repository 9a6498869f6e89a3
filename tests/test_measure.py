"""Tests of lmscore.measure: running training-step GraphDefs under TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from lmscore.errors import RunError  # noqa: E402
from lmscore.measure import CPU_ALLOCATORS, measure, synthetic_inputs  # noqa: E402
from lmscore.memory import cpu_kernel_library  # noqa: E402

pytestmark = pytest.mark.tf

RESOURCE = tf.resource.as_datatype_enum


def _train_step(model, optimizer, specs):
    """Export the GraphDef of a Keras training step (x, y) -> loss."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return step.get_concrete_function(*specs).graph.as_graph_def(add_shapes=True)


def _resource_placeholders(gdef):
    return {n.name for n in gdef.node if n.op == "Placeholder" and n.attr["dtype"].type == RESOURCE}


def _const_bytes(gdef):
    return sum(tf.make_ndarray(n.attr["value"].tensor).nbytes for n in gdef.node if n.op == "Const")


@pytest.fixture(scope="module")
def mlp():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(5)]
    )
    specs = (tf.TensorSpec([None, 12]), tf.TensorSpec([None], tf.int32))
    return _train_step(model, keras.optimizers.Adam(), specs)


@pytest.fixture(scope="module")
def mlp_run(mlp):
    return measure(mlp.SerializeToString(), 8)


def test_mlp_measures_a_peak(mlp_run):
    assert set(mlp_run.peak_bytes) == {"CPU:0"}
    assert mlp_run.peak_bytes["CPU:0"] > 0
    assert mlp_run.allocations
    # The fed batch is part of the step: x is 8 x 12 float32, y is 8 int32.
    feeds = {a.node: a.bytes for a in mlp_run.allocations if a.allocator == "feed"}
    assert feeds == {"x": 8 * 12 * 4, "y": 8 * 4}
    # One CPU allocator, named after the kernel library TensorFlow chose in this process
    # (oneDNN: "mklcpu", Eigen: "cpu"), so the test holds with TF_ENABLE_ONEDNN_OPTS=0 or 1.
    library = cpu_kernel_library()
    allocator = next(k for k, v in CPU_ALLOCATORS.items() if v == library)
    assert {a.allocator for a in mlp_run.allocations} == {allocator, "feed"}
    assert mlp_run.kernel_library == library
    for a in mlp_run.allocations:
        assert a.alloc_us >= 0
        if a.bytes < 0:  # a variable buffer released after a copy-on-write update
            assert a.free_us is None and ("Assign" in a.node or "Apply" in a.node)
            continue
        assert a.bytes > 0
        assert a.free_us is None or a.free_us >= a.alloc_us


def test_mlp_allocations_use_original_node_names(mlp, mlp_run):
    names = {n.name for n in mlp.node}
    assert {a.node for a in mlp_run.allocations} <= names


def test_mlp_persistent_is_variables_plus_constants(mlp, mlp_run):
    variable_bytes = sum(v.nbytes for v in mlp_run.variables.values())
    # kernel 12x16 + bias 16 + kernel 16x5 + bias 5, twice more for Adam's m and v,
    # plus the learning rate (float32) and the iteration counter (int64).
    weights = (12 * 16 + 16 + 16 * 5 + 5) * 4
    assert variable_bytes == 3 * weights + 4 + 8
    assert mlp_run.persistent_bytes == {"CPU:0": variable_bytes + _const_bytes(mlp)}


def test_mlp_variables_keyed_by_placeholder(mlp, mlp_run):
    assert set(mlp_run.variables) == _resource_placeholders(mlp)
    shapes = sorted(v.shape for v in mlp_run.variables.values())
    assert shapes.count((12, 16)) == 3 and shapes.count((16, 5)) == 3


def test_mlp_losses_finite_and_deterministic(mlp, mlp_run):
    assert len(mlp_run.losses) == 2
    assert mlp_run.finite
    assert all(np.isfinite(mlp_run.losses))
    again = measure(mlp.SerializeToString(), 8)
    assert again.losses == mlp_run.losses  # bit-identical
    for name, value in mlp_run.variables.items():
        np.testing.assert_array_equal(again.variables[name], value)
    other = measure(mlp.SerializeToString(), 8, seed=1)
    assert other.losses != mlp_run.losses


def test_mlp_training_changes_the_variables(mlp):
    one = measure(mlp.SerializeToString(), 8, steps=1)
    three = measure(mlp.SerializeToString(), 8, steps=3)
    assert len(three.losses) == 3
    assert three.losses[0] == one.losses[0]
    counters = [v for v in three.variables.values() if v.dtype == np.int64]
    assert [int(c) for c in counters] == [1 + 3]  # synthetic iteration counter starts at 1


def test_nan_run_is_visible():
    @tf.function
    def step(x):
        return tf.reduce_sum(tf.math.log(x - 100.0))

    gdef = step.get_concrete_function(tf.TensorSpec([None, 3])).graph.as_graph_def(add_shapes=True)
    result = measure(gdef.SerializeToString(), 4)
    assert not result.finite
    assert np.isnan(result.losses[-1])


def test_an_unseeded_fractional_pool_runs_seeded_and_repeatable():
    """Random ops get fixed seeds for repeatable runs; a fractional pool also takes
    ``deterministic`` then (seeded without it, its kernel refuses to run)."""
    @tf.function
    def step(x):
        y, _, _ = tf.nn.fractional_max_pool(x, [1.0, 1.5, 1.5, 1.0])
        return tf.reduce_sum(y)

    gdef = step.get_concrete_function(tf.TensorSpec([None, 8, 8, 2])).graph.as_graph_def(
        add_shapes=True).SerializeToString()
    first, second = measure(gdef, 2), measure(gdef, 2)
    assert first.finite and first.losses == second.losses


def test_a_table_only_gathered_and_scattered_is_made_from_the_exported_shape():
    """An embedding table under a sparse update (Adagrad: gather, scatter) tells only its
    rows' shape; the exporter records each captured variable's own (``_handle_shapes``), so
    validation can make it and the simulation counts it (DLRM: "no consumer tells its
    full shape", then 0.727 with the tables counted as 0 bytes; 1.000 now). Here the peak
    itself is not compared: Keras' check of the sparse gradient's rows in a ``tf.cond``
    gathers rows by a ``Where``, counted at its bound (every row: 1.16 of measured)."""
    import lmscore
    from lmscore.tfgraph import graphdef_from_concrete_function
    from lmscore.validate import validate

    keras.utils.set_random_seed(0)
    table = tf.Variable(tf.random.normal([5000, 32]), name="table")
    head = tf.Variable(tf.random.normal([32, 1]), name="head")
    opt = keras.optimizers.Adagrad(0.05)
    opt.build([table, head])

    @tf.function
    def step(ids, y):
        with tf.GradientTape() as tape:
            logit = tf.gather(table, ids) @ head
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(y, logit[:, 0]))
        opt.apply_gradients(zip(tape.gradient(loss, [table, head]), [table, head], strict=True))
        return loss

    cf = step.get_concrete_function(tf.TensorSpec([None], tf.int32),
                                    tf.TensorSpec([None], tf.float32))
    graph = lmscore.from_graphdef_bytes(graphdef_from_concrete_function(cf), source="table")
    v = validate(graph, 64)
    assert v.finite and v.simulated_persistent_bytes >= 2 * 5000 * 32 * 4  # table, slot
    assert abs(v.simulated_persistent_bytes / v.measured_persistent_bytes - 1) < 1e-4, v


def _embedding_graph():
    """Token ids into a Keras Embedding (GatherV2) and a gathered variable (ResourceGather)."""
    keras.utils.set_random_seed(0)
    embedding = keras.layers.Embedding(7, 3)
    embedding.build((None, 4))
    table = tf.Variable(tf.random.normal([5, 3]), name="table")
    dense = keras.layers.Dense(6)
    dense.build((None, 3))
    weights = [*embedding.trainable_variables, table, *dense.trainable_variables]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(tokens, rows, y):
        with tf.GradientTape() as tape:
            h = tf.reduce_mean(embedding(tokens), axis=1) + tf.gather(table, rows)
            loss = loss_fn(y, dense(h))
        grads = tape.gradient(loss, weights)
        for w, g in zip(weights, grads, strict=True):
            w.assign_sub(0.01 * tf.convert_to_tensor(g))
        return loss

    specs = (
        tf.TensorSpec([None, 4], tf.int32),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.int32),
    )
    return step.get_concrete_function(*specs).graph.as_graph_def(add_shapes=True)


def test_centered_rmsprop_state_gives_finite_steps():
    """Centered RMSprop takes the square root of a second moment less a squared first
    moment; drawn independently from [0, l), the two made that negative somewhere in 2M
    elements, and the second step's loss was NaN."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
    specs = (tf.TensorSpec([None, 32]), tf.TensorSpec([None], tf.int32))
    gdef = _train_step(model, keras.optimizers.RMSprop(1e-3, centered=True), specs)
    result = measure(gdef.SerializeToString(), 8)
    assert result.finite and all(np.isfinite(result.losses))


def test_integer_inputs_stay_in_range():
    gdef = _embedding_graph()
    ops = {n.op for n in gdef.node}
    assert {"GatherV2", "ResourceGather", "SparseSoftmaxCrossEntropyWithLogits"} <= ops
    feeds = synthetic_inputs(gdef, 64)
    assert feeds["tokens"].shape == (64, 4) and feeds["tokens"].dtype == np.int32
    # Bounds: vocabulary 7, table rows 5, classes 6; all values drawn, none beyond.
    assert feeds["tokens"].min() == 0 and feeds["tokens"].max() == 6
    assert feeds["rows"].min() == 0 and feeds["rows"].max() == 4
    assert feeds["y"].min() == 0 and feeds["y"].max() == 5
    # An id out of range would make the CPU gather kernels raise.
    result = measure(gdef.SerializeToString(), 64)
    assert result.finite
    table = [k for k, v in result.variables.items() if v.shape == (5, 3)]
    assert len(table) == 1


def test_out_of_range_index_raises_run_error():
    params = tf.constant([[1.0], [2.0], [3.0], [4.0]])

    @tf.function
    def step(ids):
        # ids + 3 hides the bound from the input: ids are drawn from [0, 2) and 4 is
        # out of range for the 4 rows of params.
        return tf.reduce_sum(tf.gather(params, ids + 3))

    gdef = step.get_concrete_function(tf.TensorSpec([None], tf.int32)).graph.as_graph_def(
        add_shapes=True
    )
    with pytest.raises(RunError) as info:
        measure(gdef.SerializeToString(), 32)
    message = str(info.value)
    assert message.startswith("node 'GatherV2': ") and "is not in [0, 4)" in message
    assert "\n" not in message


def test_single_matmul_peak_is_exact():
    w = tf.Variable(tf.zeros([8, 4]))

    @tf.function
    def step(x):
        return tf.reduce_sum(tf.matmul(x, w))

    gdef = step.get_concrete_function(tf.TensorSpec([None, 8])).graph.as_graph_def(add_shapes=True)
    for batch in (16, 1000):
        result = measure(gdef.SerializeToString(), batch)
        feed, product, total = batch * 8 * 4, batch * 4 * 4, 4
        # x is live all step; the Sum output is allocated before the MatMul output dies.
        assert result.peak_bytes == {"CPU:0": feed + product + total}
        by_node = {a.node: a for a in result.allocations}
        assert set(by_node) == {"x", "MatMul", "Sum"}
        assert by_node["MatMul"].bytes == product and by_node["MatMul"].free_us is not None
        assert by_node["Sum"].bytes == total and by_node["Sum"].free_us is None  # fetched
        # w (8x4 float32) and the reduction axes Const (2 int32).
        assert result.persistent_bytes == {"CPU:0": 8 * 4 * 4 + 2 * 4}
        assert list(result.variables) == ["MatMul/ReadVariableOp/resource"]


def _copy_on_write_graph(copied):
    """A step that writes its 64x64 variable while a read of it is held (``copied``), or not.

    ``copied``: the ``AssignSubVariableOp`` runs before the ``MatMul`` that uses the read,
    so TensorFlow writes into a copy of the variable, and the old buffer goes when the
    ``MatMul`` is done. Otherwise the update waits for the ``MatMul`` and writes in place.
    A ``Tile`` after both makes the step's peak.
    """
    w = tf.Variable(tf.zeros([64, 64]))

    @tf.function
    def step(x):
        r = w.value()
        if copied:
            update = w.assign_sub(tf.fill([64, 64], 0.5), read_value=False)
            with tf.control_dependencies([update]):
                h = tf.matmul(x, r)
        else:
            h = tf.matmul(x, r)
            with tf.control_dependencies([h]):
                w.assign_sub(tf.fill([64, 64], 0.5), read_value=False)
        return tf.reduce_sum(tf.tile(h, [1, 8]))

    return step.get_concrete_function(tf.TensorSpec([None, 64])).graph.as_graph_def(
        add_shapes=True)


@pytest.mark.parametrize("steps", [2, 3])
@pytest.mark.parametrize("copied", [True, False])
def test_variable_copied_on_write_is_counted_once(copied, steps):
    gdef = _copy_on_write_graph(copied)
    assign = next(n.name for n in gdef.node if n.op == "AssignSubVariableOp")
    result = measure(gdef.SerializeToString(), 64, steps=steps)
    size = 64 * 64 * 4  # the variable; x and the MatMul output are as large
    by_node = {}
    for a in result.allocations:
        by_node.setdefault(a.node, []).append(a)
    if copied:
        # The copy (never freed: it is the variable now) and the release of the old
        # buffer, which TensorFlow does not record, once the MatMul holding it is done.
        copy, release = sorted(by_node[assign], key=lambda a: -a.bytes)
        assert (copy.bytes, copy.free_us) == (size, None)
        assert (release.bytes, release.free_us) == (-size, None)
        assert release.alloc_us >= copy.alloc_us
        assert release.alloc_us >= max(a.alloc_us for a in by_node["MatMul"])
        assert release.alloc_us <= max(a.alloc_us for a in by_node["Tile"])
    else:
        assert assign not in by_node
        assert all(a.bytes > 0 for a in result.allocations)
    # At the Tile: x, the MatMul output and the tiled 64x512 float32; the variable
    # (persistent memory) is counted once, whichever buffer holds it.
    assert result.peak_bytes == {"CPU:0": size + size + 64 * 512 * 4}
    assert result.persistent_bytes["CPU:0"] >= size


def test_assigned_value_adopted_by_the_variable_is_counted_once():
    # w.assign(zeros_like(w)) (the reset of a gradient accumulator): AssignVariableOp is
    # the last user of the zeros and adopts their buffer as the variable's; the old
    # buffer, allocated before the step, goes then, unrecorded. A Tile after the reset
    # makes the peak.
    w = tf.Variable(tf.ones([64, 64]))

    @tf.function
    def step(x):
        reset = w.assign(tf.zeros_like(w), read_value=False)
        with tf.control_dependencies([reset]):
            return tf.reduce_sum(tf.tile(x, [1, 8]))

    gdef = step.get_concrete_function(tf.TensorSpec([None, 64])).graph.as_graph_def(
        add_shapes=True)
    zeros = next(n.name for n in gdef.node if n.op == "ZerosLike" or n.name == "zeros_like")
    result = measure(gdef.SerializeToString(), 64, steps=2)
    size = 64 * 64 * 4
    by_node = {}
    for a in result.allocations:
        by_node.setdefault(a.node, []).append(a)
    assign = next(n.name for n in gdef.node if n.op == "AssignVariableOp")
    (adopted,) = by_node[zeros]
    (release,) = by_node[assign]  # at the assignment, under it
    assert (adopted.bytes, adopted.free_us) == (size, None)
    assert (release.bytes, release.free_us) == (-size, None)
    assert release.alloc_us >= adopted.alloc_us
    # At the sum: x, the tiled 64x512 float32 and the sum, the variable counted once.
    assert result.peak_bytes == {"CPU:0": size + 64 * 512 * 4 + 4}


def test_unknown_non_batch_dimension_raises_run_error():
    @tf.function
    def step(features):
        return tf.reduce_sum(features)

    gdef = step.get_concrete_function(tf.TensorSpec([None, None])).graph.as_graph_def(
        add_shapes=True
    )
    with pytest.raises(RunError, match=r"input 'features': dimension 1 is unknown"):
        measure(gdef.SerializeToString(), 4)


def _two_device_graph(copy):
    @tf.function
    def step(x):
        with tf.device("/device:CPU:0"):
            big = tf.multiply(x, 2.0, name="big")
        with tf.device("/device:CPU:1"):
            host = copy(big)
        with tf.device("/device:CPU:0"):
            return tf.reduce_sum(tf.add(host, 1.0, name="back"), name="loss")

    spec = tf.TensorSpec([None, 256])
    return step.get_concrete_function(spec).graph.as_graph_def(add_shapes=True)


def test_two_devices_deep_copy_allocates_on_host():
    gdef = _two_device_graph(lambda t: tf.raw_ops.DeepCopy(x=t, name="swap"))
    result = measure(gdef.SerializeToString(), 64, devices=2)
    size = 64 * 256 * 4
    assert set(result.peak_bytes) == {"CPU:0", "CPU:1"}
    assert set(result.persistent_bytes) == {"CPU:0", "CPU:1"}
    host = [a for a in result.allocations if a.device == "CPU:1"]
    assert [(a.node, a.bytes) for a in host] == [("swap", size)]
    # The copy lives on CPU:1 until its last consumer (on CPU:0) is done with it.
    assert result.peak_bytes["CPU:1"] == size
    # On CPU:0: the fed x and big; big dies once copied, before the loss scalar exists.
    assert result.peak_bytes["CPU:0"] == 2 * size


def test_two_devices_identity_shares_the_buffer():
    gdef = _two_device_graph(lambda t: tf.identity(t, name="swap"))
    result = measure(gdef.SerializeToString(), 64, devices=2)
    size = 64 * 256 * 4
    assert set(result.peak_bytes) == {"CPU:0", "CPU:1"}
    assert result.peak_bytes["CPU:1"] == 0
    assert not [a for a in result.allocations if a.device == "CPU:1"]
    # big's buffer goes to CPU:1 and back uncopied, and is still alive when Sum allocates.
    assert result.peak_bytes["CPU:0"] == 2 * size + 4


def test_one_device_runs_host_nodes_on_cpu0():
    gdef = _two_device_graph(lambda t: tf.raw_ops.DeepCopy(x=t, name="swap"))
    result = measure(gdef.SerializeToString(), 64)
    assert set(result.peak_bytes) == {"CPU:0"}
    assert {a.device for a in result.allocations} == {"CPU:0"}


def test_lstm_with_while_loops():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(11, 4),
            keras.layers.LSTM(6),
            keras.layers.Dense(11),
        ]
    )
    specs = (tf.TensorSpec([None, 5], tf.int32), tf.TensorSpec([None], tf.int32))
    gdef = _train_step(model, keras.optimizers.SGD(0.1), specs)
    assert {"While", "StatelessWhile"} & {n.op for n in gdef.node}
    result = measure(gdef.SerializeToString(), 4)
    assert result.finite
    names = {n.name for n in gdef.node}
    assert {a.node for a in result.allocations} <= names
    whiles = {n.name for n in gdef.node if n.op in ("While", "StatelessWhile")}
    assert whiles & {a.node for a in result.allocations}


@pytest.mark.parametrize("kind", ["write", "read", "py_function", "print_to_file", "nested"])
def test_graphs_that_reach_outside_are_not_run(tmp_path, kind):
    target = tmp_path / "written.txt"
    secret = tmp_path / "secret.txt"
    secret.write_text("42")
    called = []

    def spy(x):
        called.append(1)
        return x

    def body(x):
        if kind == "write":
            tf.io.write_file(str(target), tf.strings.as_string(tf.reduce_sum(x)))
        elif kind == "read":
            x = x + tf.strings.to_number(tf.io.read_file(str(secret)))
        elif kind == "py_function":
            x = tf.py_function(spy, [x], tf.float32)
        elif kind == "print_to_file":
            tf.print(x, output_stream=f"file://{target}")
        return tf.reduce_sum(x * 2.0)

    inner = tf.function(body)

    @tf.function
    def step(x):
        return inner(x) if kind == "nested" else body(x)

    if kind == "nested":
        kind = "write"
    gdef = step.get_concrete_function(tf.TensorSpec([None, 4])).graph.as_graph_def(
        add_shapes=True)
    expected = {"write": "WriteFile", "read": "ReadFile", "py_function": "EagerPyFunc",
                "print_to_file": "PrintV2"}[kind]
    with pytest.raises(RunError, match=rf"is a {expected}, which reads or writes outside the "
                                       r"graph: refusing to run it$"):
        measure(gdef.SerializeToString(), 2)
    assert not target.exists() and not called


def test_executed_is_the_sessions_order_with_fused_ops_in_place():
    # A convolution with a bias: oneDNN's layout pass runs Conv2D inside the BiasAdd after
    # it and BiasAddGrad inside Conv2DBackpropFilter, so neither has a kernel of its own.
    import importlib

    import lmscore

    order = importlib.import_module("lmscore.order").order
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3),
                              keras.layers.Flatten(), keras.layers.Dense(5)])
    specs = (tf.TensorSpec([None, 8, 8, 3]), tf.TensorSpec([None], tf.int32))
    gdef = _train_step(model, keras.optimizers.SGD(0.1), specs)
    graph = lmscore.from_graphdef_bytes(gdef.SerializeToString(), source="conv")
    run = measure(gdef.SerializeToString(), 4)
    ranked = {name: k for k, name in enumerate(run.executed)}
    assert len(ranked) == len(run.executed)
    ordering = order(graph)
    # Every op the step runs is placed, constants aside (they may be cached across steps).
    missing = [op.name for i, op in enumerate(graph.ops)
               if ordering.needed[i] and op.type != "Const" and op.name not in ranked]
    assert missing == []
    # ... after every producer of its inputs: the order is one the executor can run.
    for op in graph.ops:
        for t in op.inputs:
            producer = t.lstrip("^").partition(":")[0]
            if op.name in ranked and producer in ranked:
                assert ranked[producer] < ranked[op.name], (producer, op.name)
    conv = next(op.name for op in graph.ops if op.type == "Conv2D")
    bias = next(op.name for op in graph.ops if op.type == "BiasAdd")
    assert ranked[conv] < ranked[bias]
