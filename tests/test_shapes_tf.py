"""Resolved shapes agree with TensorFlow's own shape inference at a concrete batch size.

On the samples and on the zoo's steps traced with an unknown batch: the step is imported
with its feeds' batch dimension fixed and its recorded shapes dropped, and TensorFlow's
shapes are compared with what :func:`lmscore.shapes.resolve` makes of the unknown ones.
"""

from __future__ import annotations

import pytest
import zoo

import lmscore
from lmscore.samples import sample_dir
from lmscore.shapes import resolve

pytestmark = pytest.mark.tf

CASES = [("mlp", 32), ("resnet50", 3), ("vgg16", 2), ("unet3d", 2), ("bert", 5), ("lstm", 7)]


def tf_shapes(data: bytes, batch: int) -> dict[str, tuple[int, ...]]:
    """Shapes TensorFlow infers for the GraphDef ``data`` when the feeds' batch is fixed."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    gd = graph_pb2.GraphDef()
    gd.ParseFromString(data)
    for node in gd.node:
        node.attr.pop("_output_shapes", None)
        if node.op == "Placeholder" and node.attr["dtype"].type != tf.resource.as_datatype_enum:
            dims = node.attr["shape"].shape.dim
            if dims and dims[0].size == -1:
                dims[0].size = batch
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    out = {}
    for op in g.get_operations():
        for k, t in enumerate(op.outputs):
            if t.shape.rank is not None and t.shape.is_fully_defined():
                out[f"{op.name}:{k}"] = tuple(t.shape.as_list())
    return out


def _compare(graph, data: bytes, batch: int) -> None:
    ours = resolve(graph, batch)
    theirs = tf_shapes(data, batch)
    mismatches = []
    compared = 0
    for i, op in enumerate(graph.ops):
        for k, shape in enumerate(ours.shapes[i]):
            expected = theirs.get(f"{op.name}:{k}")
            if expected is not None:
                compared += 1
                if shape != expected:
                    mismatches.append((f"{op.name}:{k}", shape, expected))
    total = sum(len(op.outputs) for op in graph.ops)
    print(f"{graph.source}: compared {compared} of {total} outputs")
    assert compared > 0.3 * total
    assert mismatches == []


@pytest.mark.parametrize(("name", "batch"), CASES)
def test_shapes_match_tensorflow(name, batch):
    path = sample_dir() / f"{name}.pb"
    _compare(lmscore.load(path), path.read_bytes(), batch)


#: Zoo steps traced with an unknown batch (the others leave nothing to resolve);
#: EfficientNet-B0's (10 s) under -m slow, to keep the default suite under 15 minutes.
ZOO = [pytest.param(e.name, marks=pytest.mark.slow) if e.name == "efficientnet_b0" else e.name
       for e in zoo.ENTRIES if not e.fixed_batch and not e.large]


@pytest.mark.parametrize("name", ZOO)
def test_zoo_shapes_match_tensorflow(name):
    _compare(zoo.graph(name), zoo.graphdef(name), 3)


def test_a_gru_s_state_accumulator_holds_what_its_output_list_does_not():
    """A fixed-batch GRU's accumulator of previous states is no longer counted as shared.

    Without ``return_sequences`` the layer's output list has one slot, set each step; the
    accumulator the gradient reads pushes every previous state. It shares one element with
    the output list and holds the other ``frames - 1`` itself (it was sized 0, as if the
    output list held them all: such a step simulated at 0.890 of measured).
    """
    from lmscore.shapes import duplicated, loop_body
    from lmscore.tfgraph import graphdef_from_concrete_function

    k = zoo._keras()
    k.backend.clear_session()
    k.utils.set_random_seed(5)
    frames, batch, units = 16, 4, 8
    m = k.Sequential([k.Input((frames, 3)), k.layers.GRU(units), k.layers.Dense(2)])
    cf, _ = zoo._custom_step(m, zoo._sparse_ce(), k.optimizers.SGD(0.1),
                             *zoo._specs(batch, (frames, 3), ()))
    g = lmscore.from_graphdef_bytes(graphdef_from_concrete_function(cf), source="gru")
    sizes = resolve(g, batch)
    adj = g.adjacency
    loops = [i for i, op in enumerate(g.ops) if op.type in ("While", "StatelessWhile")
             and not op.name.startswith("gradient_tape/")]
    assert len(loops) == 1
    i = loops[0]
    body = loop_body(g, i, tuple(sizes.shapes[p][q] for p, q in adj.data_in[i]))
    (k_dup, partners), = duplicated(body).items()
    element = batch * units * 4
    assert [sizes.nbytes[i][p] for p in partners] == [element]
    assert sizes.nbytes[i][k_dup] == (frames - 1) * element


def test_an_svd_gradient_s_shapes_match_tensorflow():
    """The gradient of ``svd(z, compute_uv=False)`` of a tall ``[batch, 24]`` product
    computes ``u`` and ``v`` again: left unknown, and the diagonal of the singular values
    sized by the batch, the step simulated at 3.71 of measured."""
    import tensorflow as tf

    from lmscore.tfgraph import graphdef_from_concrete_function

    w = tf.Variable(tf.random.normal([32, 24], stddev=0.1, seed=1))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.linalg.svd(tf.matmul(x, w), compute_uv=False))
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    data = graphdef_from_concrete_function(step.get_concrete_function(
        tf.TensorSpec([None, 32])))
    graph = lmscore.from_graphdef_bytes(data, source="svd")
    _compare(graph, data, 64)
    sizes = resolve(graph, 64)
    svd = [sizes.shapes[i] for i, op in enumerate(graph.ops)
           if op.type == "Svd" and op.name.startswith("gradient_tape/")]
    assert svd == [((24,), (64, 24), (24, 24))]


def test_an_extract_patches_gradient_s_shapes_match_tensorflow():
    """The gradient of ``tf.image.extract_patches`` reshapes by a shape's dimensions taken
    one by one (``Unpack``): left unknown with an unknown batch, five 1.1 MiB tensors
    counted 0 bytes, and a tuned plan measured 1.0125 of its budget."""
    import tensorflow as tf

    from lmscore.tfgraph import graphdef_from_concrete_function

    w = tf.Variable(tf.random.normal([144, 8], stddev=0.1, seed=1))
    v = tf.Variable(tf.ones([16]))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            p = tf.image.extract_patches(x * v, [1, 3, 3, 1], [1, 1, 1, 1], [1, 1, 1, 1],
                                         "SAME")
            loss = tf.reduce_sum(tf.tensordot(p, w, 1) ** 2)
        for var, g in zip((w, v), tape.gradient(loss, [w, v]), strict=True):
            var.assign_sub(0.01 * g)
        return loss

    data = graphdef_from_concrete_function(step.get_concrete_function(
        tf.TensorSpec([None, 12, 12, 16])))
    graph = lmscore.from_graphdef_bytes(data, source="extract_patches")
    _compare(graph, data, 8)
    sizes = resolve(graph, 8)
    assert sizes.unknown == ()
