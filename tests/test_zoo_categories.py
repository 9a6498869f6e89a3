"""Categories and the loss on the zoo, against what is known from how each step was built.

Every node is renamed to a meaningless name first, so names cannot help the tool. Checked:
the loss is the op that computes the loss value (or an Identity of it); every op of the
forward pass that produces a floating-point tensor of rank >= 1 on the way to the loss is
``forward``; every such op TensorFlow's gradient tape created (named ``gradient_tape/``
before renaming) is ``backward``. Integer and shape bookkeeping (``Shape`` of a forward
tensor in the gradient's scope, the indices of a sparse gradient) is not checked: it
belongs to either side and holds no memory worth planning.
"""

from __future__ import annotations

import pytest
import zoo

from lmscore.ir import Graph, Op
from lmscore.order import BACKWARD, FORWARD, order

pytestmark = pytest.mark.tf

_FLOATS = {"float", "half", "bfloat16", "double"}


def renamed(g: Graph) -> tuple[Graph, dict[str, str]]:
    new = {op.name: f"n{i}" for i, op in enumerate(g.ops)}

    def ref(t: str) -> str:
        name, _, port = t.rpartition(":")
        return f"{new[name]}:{port}"

    ops = tuple(
        Op(new[op.name], op.type, op.device, tuple(ref(t) for t in op.inputs),
           tuple(new[c] for c in op.control_inputs), op.outputs, op.attrs)
        for op in g.ops
    )
    return Graph(ops, source=g.source, functions=g.functions), new


def _loss_chain(g: Graph, built_loss: str) -> set[str]:
    """The loss identity and the ops it reads through Identity chains."""
    i = g.index[built_loss]
    chain = {built_loss}
    adj = g.adjacency
    while g.ops[i].type == "Identity" and adj.data_in[i]:
        i = adj.data_in[i][0][0]
        chain.add(g.ops[i].name)
    return chain


def _ancestors(g: Graph, i: int) -> set[int]:
    seen, stack = {i}, [i]
    while stack:
        for p, _ in g.adjacency.data_in[stack.pop()]:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return seen


#: EfficientNet-B0's (12 s) under -m slow: the default suite measured 14:02 on 2 cores.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow)
                                  if n == "efficientnet_b0" else n for n in zoo.SMALL])
def test_categories_and_loss_as_built(name: str) -> None:
    built = zoo.build_info(name)
    _check(name, zoo.graph(name), built["loss"], built["forward_prefixes"])


def _check(name: str, g: Graph, loss: str, forward_prefixes: tuple[str, ...]) -> None:
    loss_name = next(op.name for op in g.ops if op.name.rpartition("/")[2] == loss)
    r, new = renamed(g)
    o = order(r)
    back = {v: k for k, v in new.items()}
    assert o.loss is not None, f"{name}: no loss found"
    assert back[o.loss] in _loss_chain(g, loss_name), f"{name}: loss {back[o.loss]}"
    on_path = _ancestors(g, g.index[loss_name])
    wrong = []
    for i, op in enumerate(g.ops):
        spec = op.outputs[0] if op.outputs else None
        if spec is None or spec.dtype not in _FLOATS or not spec.shape:
            continue
        cat = o.categories[i]
        if op.type == "Const":  # constants are persistent memory, wherever they are
            continue
        if op.name.startswith("gradient_tape/") and cat != BACKWARD:
            wrong.append((op.name, op.type, cat))
        elif (i in on_path and op.name.startswith(forward_prefixes)
              and cat != FORWARD and op.type != "ReadVariableOp"):
            wrong.append((op.name, op.type, cat))
    assert not wrong, f"{name}: {len(wrong)} ops: {wrong[:5]}"


def test_a_constant_one_of_the_loss_is_not_the_seed_without_gradient_kernels() -> None:
    """``mean((x @ w)**2) + mean(1 + x @ v)``: matrix products only, no gradient kernel to
    tell the seed by. The ``1`` of the second term reaches more ops than the seed (the
    loss, and its gradient through the mean's shape) and was taken for it: the loss
    became a gradient's ``tf.identity``, the forward pass backward."""
    import tensorflow as tf

    from lmscore.load import from_graphdef_bytes
    from lmscore.tfgraph import graphdef_from_concrete_function

    k = zoo._keras()
    w = tf.Variable(tf.random.normal((64, 32), seed=1) * 0.1, name="w")
    v = tf.Variable(tf.random.normal((64, 8), seed=2) * 0.1, name="v")
    opt = k.optimizers.SGD(0.01)
    opt.build([w, v])

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                value = tf.identity(tf.reduce_mean((x @ w) ** 2)
                                    + tf.reduce_mean(1.0 + x @ v), name="zoo_loss")
        opt.apply_gradients(zip(tape.gradient(value, [w, v]), [w, v], strict=True))
        return value

    cf = tf.function(step).get_concrete_function(*zoo._specs(None, (64,), ()))
    g = from_graphdef_bytes(graphdef_from_concrete_function(cf), source="one_plus",
                            text=False)
    _check("one_plus", g, "zoo_loss", ("fwd/",))


def test_a_matrix_exponential_leaves_the_loss_and_the_seed_as_they_are() -> None:
    """``x @ expm(A - A^T) @ W``: the exponential's gradient runs a loop and a ``tf.cond``
    whose gradient by an input nobody differentiates is a scalar nothing reads. Taken for
    a returned value, it made the seed a constant of the loss; a constant 1 of the
    backward pass became the seed, the loss that gradient's ``Identity`` and eleven
    gradient ops forward."""
    import tensorflow as tf

    from lmscore.load import from_graphdef_bytes
    from lmscore.tfgraph import graphdef_from_concrete_function

    k = zoo._keras()
    a = tf.Variable(tf.random.normal((16, 16), stddev=0.1, seed=1), name="a")
    w = tf.Variable(tf.random.normal((16, 3), stddev=0.1, seed=2), name="w")
    opt = k.optimizers.SGD(0.01)
    opt.build([a, w])

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                logits = x @ tf.linalg.expm(a - tf.transpose(a)) @ w
                value = tf.identity(tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)), name="zoo_loss")
        opt.apply_gradients(zip(tape.gradient(value, [a, w]), [a, w], strict=True))
        return value

    cf = tf.function(step).get_concrete_function(*zoo._specs(None, (16,), ()))
    g = from_graphdef_bytes(graphdef_from_concrete_function(cf), source="expm", text=False)
    assert any(op.type == "StatelessIf" and op.name.startswith("gradient_tape/")
               for op in g.ops), "the exponential's gradient has no tf.cond any more"
    _check("expm", g, "zoo_loss", ("fwd/",))


def test_a_running_average_of_the_loss_is_not_the_loss() -> None:
    """``ema.assign(0.9 * ema + 0.1 * tf.stop_gradient(loss))``: the average is a float
    scalar computed from the loss and only written; the walk back from it stopped at the
    ``0.9 * ema`` term, taken for a penalty added to the loss, and the average became the
    loss. No gradient is of a value behind ``tf.stop_gradient``."""
    import tensorflow as tf

    from lmscore.load import from_graphdef_bytes
    from lmscore.tfgraph import graphdef_from_concrete_function

    k = zoo._keras()
    k.utils.set_random_seed(14)
    model = k.Sequential([k.Input((64,)), k.layers.Dense(32, activation="relu"),
                          k.layers.Dense(10)], name="ema")
    opt = k.optimizers.Adam(1e-3)
    opt.build(model.trainable_variables)
    ema = tf.Variable(0.0)

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                value = tf.identity(tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x, training=True))),
                    name="zoo_loss")
        ema.assign(0.9 * ema + 0.1 * tf.stop_gradient(value))
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(*zoo._specs(None, (64,), ()))
    cf.zoo_objects = (model, opt, ema)
    g = from_graphdef_bytes(graphdef_from_concrete_function(cf), source="ema", text=False)
    _check("ema", g, "zoo_loss", ("fwd/",))


def test_the_gradient_through_a_learned_scale_is_backward() -> None:
    """Keras ``Attention(use_scale=True)`` multiplies the scores by a scalar weight: the
    gradient through it, the incoming gradient times that weight, read by the backward
    matrix products, was called update (optimizer arithmetic scales gradients by state
    too, but never feeds a matrix product)."""
    from lmscore.load import from_graphdef_bytes
    from lmscore.tfgraph import graphdef_from_concrete_function

    k = zoo._keras()
    k.utils.set_random_seed(12)
    inp = k.Input((32,), dtype="int32")
    q = k.layers.Embedding(500, 16)(inp)  # what the gradient leads to is a sparse update
    att = k.layers.Attention(use_scale=True)([q, q])
    m = k.Model(inp, k.layers.Dense(4)(k.layers.GlobalAveragePooling1D()(att)), name="katt")
    cf, prefixes = zoo._custom_step(m, zoo._sparse_ce(), k.optimizers.Adam(1e-3),
                                    *zoo._specs(None, (32,), (), x_dtype="int32"))
    g = from_graphdef_bytes(graphdef_from_concrete_function(cf), source="katt", text=False)
    _check("katt", g, "zoo_loss", prefixes)
