"""Tests of lmscore.export: GraphDefs of rewritten graphs, the swapped step, SavedModels."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from tensorboard.compat.proto import graph_pb2, types_pb2

import lmscore
from lmscore import export
from lmscore.errors import ConfigError, GraphError, RunError
from lmscore.ir import Op, TensorSpec
from lmscore.load import from_graphdef_bytes
from lmscore.plan import plan_from_params
from lmscore.rewrite import rewrite
from lmscore.samples import sample_dir

SAMPLES = sample_dir()


def sample(name: str) -> lmscore.Graph:
    return lmscore.load(SAMPLES / f"{name}.pb")


@pytest.fixture(scope="module")
def mlp():
    return sample("mlp")


@pytest.fixture(scope="module")
def mlp_rewrite(mlp):
    result = rewrite(mlp, plan_from_params(mlp, 32, threshold=2, ahead=1))
    assert result.swap_outs and result.swap_ins
    return result


def parse(data: bytes):
    gd = graph_pb2.GraphDef()
    gd.ParseFromString(data)
    return gd


def swap_nodes(gd) -> dict:
    return {n.name: n for n in gd.node if n.name.startswith("lms/")}


# --- GraphDef --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "lstm", "bert"])
def test_unmodified_graph_exports_its_own_nodes(name):
    graph = sample(name)
    source, out = parse(graph.graphdef), parse(export.to_graphdef(graph))
    assert list(out.node) == list(source.node)
    assert out.library == source.library and out.versions == source.versions


@pytest.mark.parametrize("mode, swap_type", [("gpu", "Identity"), ("emulate", "DeepCopy")])
def test_round_trip_gives_the_rewritten_ops(mlp_rewrite, mode, swap_type):
    rewritten = mlp_rewrite.graph
    back = from_graphdef_bytes(export.to_graphdef(rewritten, mode=mode))
    assert len(back.ops) == len(rewritten.ops)
    for a, b in zip(rewritten.ops, back.ops, strict=True):
        assert b.name == a.name
        assert b.type == (swap_type if a.attrs.get("_lms_role") else a.type)
        assert b.type == export.exported_type(a, mode)
        assert b.inputs == a.inputs
        assert b.control_inputs == a.control_inputs
        assert b.outputs == a.outputs


def test_rewired_consumers_and_library_survive(mlp, mlp_rewrite):
    gd = parse(export.to_graphdef(mlp_rewrite.graph))
    nodes = {n.name: n for n in gd.node}
    source = parse(mlp.graphdef)
    assert gd.versions == source.versions and gd.library == source.library
    for s in mlp_rewrite.plan.swaps:
        for k, group in enumerate(s.swap_ins):
            swap_in = export_name(mlp_rewrite, s.tensor, k)
            for consumer in group.consumers:
                inputs = list(nodes[consumer].input)
                assert any(i == swap_in for i in inputs), (consumer, inputs)
                data = [i for i in inputs if not i.startswith("^")]
                control = [i for i in inputs if i.startswith("^")]
                assert inputs == data + control
            if group.trigger:
                assert f"^{group.trigger}" in nodes[swap_in].input
    # Everything else keeps all of its attributes.
    for node in source.node:
        assert nodes[node.name].attr == node.attr
        assert nodes[node.name].op == node.op


def export_name(result, tensor: str, group: int) -> str:
    return next(
        op.name for op in result.graph.ops
        if op.attrs.get("_lms_role") == "swap_in" and op.attrs.get("_lms_tensor") == tensor
        and op.attrs.get("_lms_group") == group
    )


def test_gpu_swap_nodes(mlp_rewrite):
    gd = parse(export.to_graphdef(mlp_rewrite.graph, device="/GPU:1", host="/CPU:0"))
    nodes = swap_nodes(gd)
    assert set(nodes) == set(mlp_rewrite.swap_outs) | set(mlp_rewrite.swap_ins)
    for op in mlp_rewrite.graph.ops:
        role = op.attrs.get("_lms_role")
        if not role:
            continue
        node = nodes[op.name]
        assert node.op == "Identity"
        assert node.device == ("/CPU:0" if role == "swap_out" else "/GPU:1")
        assert node.attr["T"].type == types_pb2.DT_FLOAT
        assert node.attr["_lms_role"].s.decode() == role
        assert node.attr["_lms_tensor"].s.decode() == op.attrs["_lms_tensor"]
        assert node.attr[export.KEEP_ATTR].b is True
        (shape,) = node.attr["_output_shapes"].list.shape
        assert tuple(d.size for d in shape.dim) == op.outputs[0].shape
        if role == "swap_in":
            assert node.attr["_lms_group"].i == op.attrs["_lms_group"]


def test_emulate_places_copies_on_the_two_cpus(mlp_rewrite):
    gd = parse(export.to_graphdef(mlp_rewrite.graph, mode="emulate"))
    for node in gd.node:
        role = node.attr["_lms_role"].s.decode() if "_lms_role" in node.attr else ""
        if role:
            assert node.op == "DeepCopy"
            assert node.device == ("/device:CPU:1" if role == "swap_out" else "/device:CPU:0")
        else:
            assert node.device in ("", "/device:CPU:0")


def test_unknown_new_op_is_a_graph_error(mlp_rewrite):
    g = mlp_rewrite.graph
    stray = Op("made_up", "Relu", inputs=("images:0",), outputs=(TensorSpec("float", (-1, 784)),))
    with pytest.raises(GraphError, match="'made_up'"):
        export.to_graphdef(g.replace((*g.ops, stray)))


def test_changed_type_is_a_graph_error(mlp):
    ops = list(mlp.ops)
    k = next(i for i, op in enumerate(ops) if op.type == "Relu")
    ops[k] = dataclasses.replace(ops[k], type="Tanh")
    with pytest.raises(GraphError, match=ops[k].name):
        export.to_graphdef(mlp.replace(ops))


def test_bad_options(mlp, mlp_rewrite):
    with pytest.raises(ConfigError, match="mode"):
        export.to_graphdef(mlp, mode="tpu")
    with pytest.raises(ConfigError, match="device"):
        export.to_graphdef(mlp, device="GPU zero")
    with pytest.raises(GraphError, match="no source GraphDef"):
        export.to_graphdef(lmscore.Graph(mlp.ops, "handmade"))
    g = mlp_rewrite.graph
    ops = [dataclasses.replace(op, outputs=(TensorSpec("unknown", None),))
           if op.attrs.get("_lms_role") else op for op in g.ops]
    with pytest.raises(GraphError, match="dtype"):
        export.to_graphdef(g.replace(ops))


@pytest.mark.parametrize("suffix", [".pb", ".pbtxt"])
def test_write_and_load_back(tmp_path, mlp_rewrite, suffix):
    path = tmp_path / f"rewritten{suffix}"
    export.write_graphdef(mlp_rewrite.graph, path)
    data = path.read_bytes()
    if suffix == ".pbtxt":
        assert data.lstrip().startswith(b"node {")
    back = lmscore.load(path)
    assert [(o.name, o.inputs, o.control_inputs) for o in back.ops] == [
        (o.name, o.inputs, o.control_inputs) for o in mlp_rewrite.graph.ops
    ]
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_text_flag_overrides_the_suffix(tmp_path, mlp):
    path = tmp_path / "graph.pb"
    export.write_graphdef(mlp, path, text=True)
    assert path.read_bytes().lstrip().startswith(b"node {")


def test_refuses_to_overwrite_the_source(tmp_path, mlp):
    path = tmp_path / "mlp.pb"
    path.write_bytes(mlp.graphdef)
    graph = lmscore.load(path)
    result = rewrite(graph, plan_from_params(graph, 32, threshold=2))
    for g in (graph, result.graph):
        with pytest.raises(ConfigError, match="loaded from"):
            export.write_graphdef(g, path)
        with pytest.raises(ConfigError, match="loaded from"):
            export.write_graphdef(g, tmp_path / "." / "mlp.pb")
    assert path.read_bytes() == mlp.graphdef


def test_unwritable_destination(tmp_path, mlp):
    with pytest.raises(ConfigError, match="cannot write"):
        export.write_graphdef(mlp, tmp_path / "missing" / "out.pb")
    with pytest.raises(ConfigError, match="directory"):
        export.write_graphdef(mlp, tmp_path)
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(ConfigError, match="cannot write"):
            export.write_graphdef(mlp, ro / "out.pb")
        assert list(ro.iterdir()) == []


def test_bad_graph_is_not_written(tmp_path, mlp):
    path = tmp_path / "out.pb"
    with pytest.raises(GraphError):
        export.write_graphdef(lmscore.Graph(mlp.ops, "handmade"), path)
    assert not path.exists()


# --- Grappler --------------------------------------------------------------------------------


def _optimize(data: bytes, fetch: str):
    """Run Grappler's meta optimizer with the default ConfigProto on a step GraphDef."""
    pytest.importorskip("tensorflow")
    from tensorflow.core.framework import graph_pb2 as tf_graph_pb2
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(tf_graph_pb2.GraphDef.FromString(data))
    meta.collection_def["train_op"].node_list.value.append(fetch)
    return tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta)


@pytest.mark.tf
@pytest.mark.parametrize(
    "device, host", [("/GPU:0", "/CPU:0"), ("/CPU:0", "/CPU:0"), ("", "")]
)
def test_grappler_keeps_swap_nodes(mlp_rewrite, device, host):
    data = export.to_graphdef(mlp_rewrite.graph, device=device, host=host)
    optimized = _optimize(data, "Identity")
    kept = {n.name: n for n in optimized.node}
    assert len(kept) < len(parse(data).node)  # Grappler did optimize the graph
    for name, node in swap_nodes(parse(data)).items():
        assert name in kept, name
        assert kept[name].op == "Identity"
        assert list(kept[name].input) == list(node.input)
    # Consumers still read the swap-ins, not the original tensors.
    for s in mlp_rewrite.plan.swaps:
        for k, group in enumerate(s.swap_ins):
            for consumer in group.consumers:
                if consumer in kept:
                    assert export_name(mlp_rewrite, s.tensor, k) in kept[consumer].input


@pytest.mark.tf
def test_grappler_removes_same_device_swaps_without_the_keep_attribute(mlp_rewrite):
    gd = parse(export.to_graphdef(mlp_rewrite.graph, device="/CPU:0", host="/CPU:0"))
    swaps = set(swap_nodes(gd))
    for node in gd.node:
        if export.KEEP_ATTR in node.attr:
            del node.attr[export.KEEP_ATTR]
        # the ops that wait for a swap-out (release edges) would keep it alive by themselves
        kept_inputs = [i for i in node.input if i.lstrip("^") not in swaps or not i.startswith("^")]
        del node.input[:]
        node.input.extend(kept_inputs)
    kept = {n.name for n in _optimize(gd.SerializeToString(), "Identity").node}
    assert not set(swap_nodes(gd)) <= kept


# --- Emulated accelerator: numerics and peaks -------------------------------------------------


def _emulated(graph, batch, plan):
    pytest.importorskip("tensorflow")
    from lmscore.measure import measure

    result = rewrite(graph, plan)
    assert result.plan.swaps
    original = measure(graph.graphdef, batch, devices=1, steps=3, seed=0)
    swapped = measure(
        export.to_graphdef(result.graph, mode="emulate"), batch, devices=2, steps=3, seed=0
    )
    assert original.losses == swapped.losses
    assert set(original.variables) == set(swapped.variables)
    for name, value in original.variables.items():
        assert np.array_equal(value, swapped.variables[name]), name
    assert swapped.finite
    assert swapped.peak_bytes["CPU:1"] > 0  # the host really holds copies
    return original, swapped


@pytest.mark.tf
def test_emulated_swaps_are_exact_mlp(mlp):
    _emulated(mlp, 32, plan_from_params(mlp, 32, threshold=2, ahead=1))


@pytest.mark.tf
def test_emulated_swaps_are_exact_bert():
    bert = sample("bert")
    _emulated(bert, 2, plan_from_params(bert, 2, threshold=5, ahead=1))


# --- swap(): the rewritten step on the original variables -------------------------------------


def _keras_step():
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    from lmscore import tfgraph

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((12,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(5),
    ])
    optimizer = keras.optimizers.Adam()
    specs = (tf.TensorSpec([None, 12], name="x"), tf.TensorSpec([None], tf.int32, name="y"))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = tfgraph.train_step_function(model, loss, optimizer, specs)
    return step, list(model.variables) + list(optimizer.variables)


def _batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((8, 12)).astype(np.float32), rng.integers(0, 5, 8).astype(np.int32)


@pytest.mark.tf
@pytest.mark.parametrize("sync_mode", [0, 3])
def test_swapped_step_trains_bit_identically(sync_mode):
    step_a, vars_a = _keras_step()
    step_b, vars_b = _keras_step()
    for a, b in zip(vars_a, vars_b, strict=True):
        assert np.array_equal(a.numpy(), b.numpy())
    swapped = export.swap(step_b, threshold=1, ahead=1, batch_size=8, sync_mode=sync_mode)
    assert swapped.plan.swaps and swapped.rewrite.swap_ins
    assert swapped.plan is swapped.rewrite.plan
    # The very variables of the model and optimizer (Keras wraps tf.Variables).
    assert {id(v.handle) for v in swapped.variables} == {id(v.handle) for v in vars_b}
    assert swap_nodes(parse(swapped.graphdef))
    x, y = _batch()
    for _ in range(3):
        expected = step_a(x, y).numpy()
        got = swapped(x, y).numpy()
        assert np.array_equal(expected, got)
    for a, b in zip(vars_a, vars_b, strict=True):
        assert np.array_equal(a.numpy(), b.numpy()), a.name


@pytest.mark.tf
def test_swap_traces_tf_functions():
    tf = pytest.importorskip("tensorflow")
    v = tf.Variable(tf.ones([4, 4]))

    def body(x):
        a = tf.matmul(x, v)
        b = tf.nn.relu(a)
        c = tf.matmul(b, v)
        d = tf.tanh(c)
        loss = tf.reduce_sum(d * a)
        v.assign_sub(0.01 * tf.gradients(loss, v)[0])
        return loss

    x = tf.ones([3, 4])
    with_signature = tf.function(body, input_signature=[tf.TensorSpec([3, 4])])
    assert export.swap(with_signature, threshold=1).plan.params["batch_size"] == 3
    traced_once = tf.function(body)
    traced_once(x)
    assert [id(w) for w in export.swap(traced_once, threshold=1, batch_size=3).variables] == [id(v)]
    plain = tf.function(body)
    assert export.swap(plain, tf.TensorSpec([None, 4]), threshold=1, batch_size=3)
    with pytest.raises(ConfigError, match="specs"):
        export.swap(tf.function(body), threshold=1, batch_size=3)
    with pytest.raises(ConfigError, match="batch_size"):
        export.swap(plain, tf.TensorSpec([None, 4]), threshold=1)
    with pytest.raises(ConfigError, match="specs"):
        export.swap(with_signature.get_concrete_function(), tf.TensorSpec([3, 4]))
    with pytest.raises(ConfigError, match="train_step"):
        export.swap(body)
    with pytest.raises(ConfigError, match="thresold"):
        export.swap(with_signature, thresold=1)
    with pytest.raises(GraphError, match="cannot trace"):
        export.swap(tf.function(lambda x: tf.matmul(x, x)), tf.TensorSpec([2, 3]), batch_size=2)


@pytest.mark.tf
def test_swap_of_an_xla_step_says_it_runs_without_xla():
    """A ``jit_compile`` step is rewritten and run by TensorFlow's executor, and says so.

    XLA would compile the swap nodes away; dropping it silently changes the user's step.
    """
    tf = pytest.importorskip("tensorflow")
    import warnings

    v = tf.Variable(tf.ones([4, 4]))

    def body(x):
        loss = tf.reduce_sum(tf.tanh(tf.matmul(tf.nn.relu(tf.matmul(x, v)), v)))
        v.assign_sub(0.01 * tf.gradients(loss, v)[0])
        return loss

    spec = tf.TensorSpec([3, 4])
    with pytest.warns(UserWarning, match="jit_compile: the rewritten step runs without XLA"):
        swapped = export.swap(tf.function(body, jit_compile=True), spec, threshold=1)
    assert float(swapped(tf.ones([3, 4]))) > 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export.swap(tf.function(body), spec, threshold=1)
    assert not [w for w in caught if "jit_compile" in str(w.message)]


@pytest.mark.tf
def test_swapped_step_errors_are_one_line():
    step, _ = _keras_step()
    swapped = export.swap(step, threshold=1, batch_size=8)
    x, _y = _batch()
    with pytest.raises(RunError) as info:
        swapped(x)
    assert "\n" not in str(info.value)
    with pytest.raises(RunError):
        swapped(x[:, :3], _y)


# --- SavedModel ------------------------------------------------------------------------------


@pytest.mark.tf
def test_saved_model_of_a_swapped_step(tmp_path):
    tf = pytest.importorskip("tensorflow")
    step, _ = _keras_step()
    swapped = export.swap(step, threshold=1, batch_size=8)
    x, y = _batch()
    swapped(x, y)
    path = tmp_path / "model"
    export.save_rewritten_saved_model(swapped, path)
    loaded = tf.saved_model.load(str(path))
    for a, b in zip(swapped.variables, loaded.step_variables, strict=True):
        assert np.array_equal(a.numpy(), b.numpy())
    for _ in range(2):
        assert np.array_equal(swapped(x, y).numpy(), loaded.train_step(x, y).numpy())
    for a, b in zip(swapped.variables, loaded.step_variables, strict=True):
        assert np.array_equal(a.numpy(), b.numpy())
    graph = lmscore.load(path)  # lmscore reads it back: its function is train_step
    roles = [op for op in graph.ops if op.name.startswith(f"{export._SCOPE}/lms/")]
    assert len(roles) == len(swapped.rewrite.swap_outs) + len(swapped.rewrite.swap_ins)
    with pytest.raises(ConfigError, match="exists"):
        export.save_rewritten_saved_model(swapped, path)
    with pytest.raises(ConfigError, match="came from"):
        export.save_rewritten_saved_model(graph, path, overwrite=True)
    export.save_rewritten_saved_model(swapped, path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.tf
def test_saved_model_of_a_graph_with_measured_variables(tmp_path, mlp_rewrite):
    tf = pytest.importorskip("tensorflow")
    from lmscore.measure import measure, synthetic_inputs

    emulated = export.to_graphdef(mlp_rewrite.graph, mode="emulate")
    one = measure(emulated, 32, devices=2, steps=1, seed=0)
    two = measure(emulated, 32, devices=2, steps=2, seed=0)
    path = tmp_path / "model"
    export.save_rewritten_saved_model(mlp_rewrite.graph, path, variables=one.variables)
    loaded = tf.saved_model.load(str(path))
    feeds = synthetic_inputs(emulated, 32, seed=0)
    loss = loaded.train_step(feeds["images"], feeds["labels"]).numpy()
    assert np.array_equal(loss, np.float32(two.losses[1]))
    # Variables are created in the order of the graph's resource placeholders.
    order = [op.name for op in mlp_rewrite.graph.ops if op.name in one.variables]
    for name, var in zip(order, loaded.step_variables, strict=True):
        assert np.array_equal(var.numpy(), two.variables[name]), name
    with pytest.raises(ConfigError, match="no value for the variable"):
        export.save_rewritten_saved_model(
            mlp_rewrite.graph, tmp_path / "other", variables=dict(list(one.variables.items())[1:])
        )
    with pytest.raises(ConfigError, match="output"):
        export.save_rewritten_saved_model(
            mlp_rewrite.graph, tmp_path / "other", variables=one.variables, output="nope:0"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.tf
def test_saved_model_refuses_bad_destinations(tmp_path, mlp_rewrite):
    pytest.importorskip("tensorflow")
    with pytest.raises(ConfigError, match="source"):
        export.save_rewritten_saved_model("step", tmp_path / "m")
    with pytest.raises(ConfigError, match="cannot write"):
        export.save_rewritten_saved_model(mlp_rewrite.graph, tmp_path / "no" / "m", variables={})
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        export.save_rewritten_saved_model(mlp_rewrite.graph, tmp_path / "file", variables={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_public_names():
    assert set(export.__all__) <= set(dir(export))


def test_an_exported_tuned_step_loads_again_as_it_was():
    """A tuned plan's rewrite, exported and loaded as a new file (what ``lms inspect`` of
    ``tune --out`` does): the pinned order's edges are marked (``_lms_after``) and the
    clones keep their originals, so every original op keeps its category and the step
    simulates to the same peak. Unmarked, the order's edges made each update wait for a
    backward op: 532 of ResNet-50's updates were called backward."""
    from lmscore.memory import simulate
    from lmscore.order import order
    from lmscore.tune import tune

    g = lmscore.load(sample_dir() / "resnet50.pb")
    base = simulate(g, 8)
    device = int(base.persistent_bytes + base.input_bytes + 0.5 * base.transient_peak_bytes)
    result = tune(g, 8, device)
    assert result.fits and result.plan.pin_schedule and result.plan.recomputes
    rewritten = rewrite(g, result.plan).graph
    loaded = from_graphdef_bytes(export.to_graphdef(rewritten), source="again", text=False)
    before = dict(zip((op.name for op in g.ops), order(g).categories, strict=True))
    after = dict(zip((op.name for op in loaded.ops), order(loaded).categories, strict=True))
    assert {n: c for n, c in before.items() if after[n] != c} == {}
    assert order(loaded).loss == order(g).loss
    assert [op.attrs.get("_lms_clone_of") for op in loaded.ops] == [
        op.attrs.get("_lms_clone_of") for op in rewritten.ops]
    assert simulate(loaded, 8).peak_bytes == simulate(rewritten, 8).peak_bytes
