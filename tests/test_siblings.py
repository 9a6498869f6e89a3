"""Ops TensorFlow may merge into one kernel never wait for each other in a rewritten step.

oneDNN's layout pass merges a filter gradient with the ``BiasAddGrad`` beside it when both
have the same control inputs, without checking for a path from one to the other. A swap-in
triggered after the ``BiasAddGrad`` and read by the filter gradient, or a pinned order that
runs other ops between the two, makes the merged kernel wait for itself: TensorFlow ended
such a step without its results ("Retval[0] does not have value"; a CNN with
``clip_by_global_norm``, tuned to 60%, under default Grappler with oneDNN on).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from graphs import t

from lmscore.errors import GraphError, PlanError
from lmscore.ir import Graph, Op, lint
from lmscore.order import order
from lmscore.plan import Swap, SwapIn, check_plan, empty_plan, find_trigger
from lmscore.schedule import chained_ops, scheduled

F = "float"


def bias_grad_step() -> Graph:
    """A convolution with a bias, its two gradients side by side, and a global-norm piece.

    ``g_b`` (BiasAddGrad) and ``g_w`` (Conv2DBackpropFilter) read the same ``g_relu``;
    ``l2b`` = L2Loss(g_b); ``d`` reads the forward ``relu1`` and ``l2b``; ``g_w`` also waits
    (control) for a chain ``i1..i4`` of the gradient, so it comes late (level 12).
    """
    act4 = t(F, 2, 4, 4, 2)
    ops = [
        Op("x", "Placeholder", outputs=act4),
        Op("w", "Placeholder", outputs=t("resource")),
        Op("bv", "Placeholder", outputs=t("resource")),
        Op("axes", "Const", outputs=t("int32", 4), attrs={"value": (0, 1, 2, 3)}),
        Op("ones", "Const", outputs=t(F), attrs={"value": (1.0,)}),
        Op("lr", "Const", outputs=t(F), attrs={"value": (0.1,)}),
        Op("fshape", "Const", outputs=t("int32", 4), attrs={"value": (3, 3, 2, 2)}),
        Op("relu1", "Relu", inputs=("x:0",), outputs=act4),
        Op("r", "ReadVariableOp", inputs=("w:0",), outputs=t(F, 3, 3, 2, 2)),
        Op("rb", "ReadVariableOp", inputs=("bv:0",), outputs=t(F, 2)),
        Op("conv", "Conv2D", inputs=("relu1:0", "r:0"), outputs=act4),
        Op("ba", "BiasAdd", inputs=("conv:0", "rb:0"), outputs=act4),
        Op("act", "Relu", inputs=("ba:0",), outputs=act4),
        Op("loss", "Sum", inputs=("act:0", "axes:0"), outputs=t(F)),
        Op("shape_act", "Shape", inputs=("act:0",), outputs=t("int32", 4)),
        Op("g_tile", "BroadcastTo", inputs=("ones:0", "shape_act:0"), outputs=act4),
        Op("g_relu", "ReluGrad", inputs=("g_tile:0", "act:0"), outputs=act4),
        Op("g_b", "BiasAddGrad", inputs=("g_relu:0",), outputs=t(F, 2)),
        Op("l2b", "L2Loss", inputs=("g_b:0",), outputs=t(F)),
        Op("i1", "Identity", inputs=("g_relu:0",), outputs=act4),
        Op("i2", "Identity", inputs=("i1:0",), outputs=act4),
        Op("i3", "Identity", inputs=("i2:0",), outputs=act4),
        Op("i4", "Identity", inputs=("i3:0",), outputs=act4),
        Op("d", "Mul", inputs=("relu1:0", "l2b:0"), outputs=act4),
        Op("dsum", "Sum", inputs=("d:0", "axes:0"), outputs=t(F)),
        Op("g_w", "Conv2DBackpropFilter", inputs=("relu1:0", "fshape:0", "g_relu:0"),
           control_inputs=("i4",), outputs=t(F, 3, 3, 2, 2)),
        Op("lr2", "Mul", inputs=("lr:0", "dsum:0"), outputs=t(F)),
        Op("upd", "Mul", inputs=("g_w:0", "lr2:0"), outputs=t(F, 3, 3, 2, 2)),
        Op("apply", "AssignSubVariableOp", inputs=("w:0", "upd:0")),
        Op("updb", "Mul", inputs=("g_b:0", "lr:0"), outputs=t(F, 2)),
        Op("applyb", "AssignSubVariableOp", inputs=("bv:0", "updb:0")),
        Op("out", "Identity", inputs=("loss:0",), control_inputs=("apply", "applyb"),
           outputs=t(F)),
    ]
    return Graph(tuple(ops), "bias_grad_step")


def _names(g: Graph, *names: str) -> tuple[int, ...]:
    return tuple(g.index[n] for n in names)


def test_the_filter_gradient_and_the_bias_gradient_are_siblings():
    g = bias_grad_step()
    b, c = _names(g, "g_b", "g_w")
    assert g.siblings == {b: (c,), c: (b,)}
    lv = order(g).levels
    assert [lv[g.index[n]] for n in ("g_relu", "g_b", "l2b", "d", "g_w")] == [7, 8, 9, 10, 12]
    # a filter gradient reading another tensor (a deconvolution's) is no sibling
    other = replace(g.op("g_w"), inputs=("relu1:0", "fshape:0", "i1:0"))
    assert Graph(tuple(other if op.name == "g_w" else op for op in g.ops)).siblings == {}


def test_lint_names_a_path_between_siblings():
    g = bias_grad_step()
    lint(g)
    waits = tuple(replace(op, control_inputs=(*op.control_inputs, "l2b"))
                  if op.name == "g_w" else op for op in g.ops)
    with pytest.raises(GraphError, match=r"node 'g_w' waits for 'g_b'.*merge the two"):
        lint(Graph(waits, "bias_grad_step"))


def test_a_trigger_never_waits_for_a_consumers_sibling():
    """d (level 10) is the group's first consumer: one level ahead is l2b, which waits for
    g_b; its control edge would make g_w wait for g_b. Level 8 holds g_b itself; the
    trigger is g_relu (level 7)."""
    g = bias_grad_step()
    assert find_trigger(g, "relu1:0", ("d", "g_w"), 1, 10, exact=False) == "g_relu"
    # the same group without the sibling: l2b, one level ahead
    assert find_trigger(g, "relu1:0", ("d",), 1, 10, exact=False) == "l2b"
    bad = replace(empty_plan(g), swaps=(Swap("relu1:0", (SwapIn(("d", "g_w"), "l2b"),)),))
    with pytest.raises(PlanError, match=r"trigger 'l2b' waits for 'g_b', which TensorFlow "
                                        r"may merge with consumer 'g_w'"):
        check_plan(g, bad)
    check_plan(g, replace(bad, swaps=(Swap("relu1:0", (SwapIn(("d",), "l2b"),)),)))


def test_a_pinned_order_chains_siblings_as_one():
    g = bias_grad_step()
    ordering = order(g)
    names = [g.ops[i].name for i in chained_ops(g, ordering, ordering.schedule)]
    # (the gradient seed's Shape is shape arithmetic: out of the chain)
    assert names[:6] == ["relu1", "conv", "ba", "act", "loss", "g_tile"]
    assert names[6:] == ["g_relu", "g_b", "i1", "l2b", "updb", "i2", "d", "applyb", "i3",
                         "dsum", "i4", "lr2", "g_w", "upd", "apply", "out"]
    step = scheduled(g, names)
    lint(step)
    # g_b moves beside g_w; what waits for it (l2b, updb, d, applyb, dsum, lr2) after both
    new = [step.ops[i].name for i in chained_ops(step, order(step), order(step).schedule)]
    assert new[6:] == ["g_relu", "i1", "i2", "i3", "i4", "g_b", "g_w", "l2b", "updb", "d",
                       "applyb", "dsum", "lr2", "upd", "apply", "out"]
    assert step.op("g_b").control_inputs == ("i4",)
    assert step.op("g_w").control_inputs == ("i4",)  # its own, and the chain's
    assert step.op("l2b").control_inputs == ("g_b", "g_w")
    assert step.op("l2b").attrs["_lms_after"] == ("g_b", "g_w")
    assert step.op("updb").control_inputs == ("l2b",)


def test_what_waits_for_a_sibling_through_an_unchained_op_moves_after_it():
    """An op that waits for ``g_b`` through an op left out of the chain (``l2b`` here, as a
    variable read after an update is) moves after the pair too: kept ahead of ``g_b``, the
    chain closed a cycle (an AdamW step's memory-aware order: "the graph has a cycle")."""
    g = bias_grad_step()
    ordering = order(g)
    names = [g.ops[i].name for i in chained_ops(g, ordering, ordering.schedule)
             if g.ops[i].name != "l2b"]
    step = scheduled(g, names)
    lint(step)
    new = [step.ops[i].name for i in order(step).schedule]
    assert new.index("g_w") < new.index("d") and new.index("g_b") < new.index("d")


def shared_gradient_step() -> Graph:
    """:func:`bias_grad_step` with a second convolution of ``relu1`` beside the first,
    whose output is added to the first's (an attention gate): both read one gradient, so
    either bias gradient may merge with either filter gradient."""
    g = bias_grad_step()
    act4 = t(F, 2, 4, 4, 2)
    ops = list(g.ops)
    at = g.index["ba"]
    ops[at:at + 1] = [
        Op("conv2", "Conv2D", inputs=("relu1:0", "r2:0"), outputs=act4),
        Op("ba2", "BiasAdd", inputs=("conv2:0", "rb2:0"), outputs=act4),
        Op("ba1", "BiasAdd", inputs=("conv:0", "rb:0"), outputs=act4),
        Op("ba", "AddV2", inputs=("ba1:0", "ba2:0"), outputs=act4),
    ]
    extra = [
        Op("w2", "Placeholder", outputs=t("resource")),
        Op("bv2", "Placeholder", outputs=t("resource")),
        Op("r2", "ReadVariableOp", inputs=("w2:0",), outputs=t(F, 3, 3, 2, 2)),
        Op("rb2", "ReadVariableOp", inputs=("bv2:0",), outputs=t(F, 2)),
    ]
    tail = [
        Op("g_b2", "BiasAddGrad", inputs=("g_relu:0",), outputs=t(F, 2)),
        Op("l2b2", "L2Loss", inputs=("g_b2:0",), outputs=t(F)),
        Op("g_w2", "Conv2DBackpropFilter", inputs=("relu1:0", "fshape:0", "g_relu:0"),
           outputs=t(F, 3, 3, 2, 2)),
        Op("upd2", "Mul", inputs=("g_w2:0", "l2b2:0"), outputs=t(F, 3, 3, 2, 2)),
        Op("apply2", "AssignSubVariableOp", inputs=("w2:0", "upd2:0")),
        Op("updb2", "Mul", inputs=("g_b2:0", "lr:0"), outputs=t(F, 2)),
        Op("applyb2", "AssignSubVariableOp", inputs=("bv2:0", "updb2:0")),
    ]
    out = replace(ops[-1], control_inputs=(*ops[-1].control_inputs, "apply2", "applyb2"))
    return Graph(tuple(extra + ops[:-1] + tail + [out]), "shared_gradient_step")


def test_siblings_of_a_shared_gradient_are_chained_as_one():
    g = shared_gradient_step()
    b1, b2, c1, c2 = _names(g, "g_b", "g_b2", "g_w", "g_w2")
    assert g.siblings == {b1: (c1, c2), b2: (c1, c2), c1: (b1, b2), c2: (b1, b2)}
    ordering = order(g)
    names = [g.ops[i].name for i in chained_ops(g, ordering, ordering.schedule)]
    members = {"g_b", "g_b2", "g_w", "g_w2"}
    where = [k for k, n in enumerate(names) if n in members]
    assert where[-1] - where[0] > 3  # the executor's order runs other ops among them
    step = scheduled(g, names)
    lint(step)
    new = [step.ops[i].name for i in chained_ops(step, order(step), order(step).schedule)]
    where = [k for k, n in enumerate(new) if n in members]
    assert where == list(range(where[0], where[0] + 4))
    before, after = new[where[0] - 1], new[where[-1] + 1]
    for m in members:
        assert before in step.op(m).control_inputs
        assert not members & set(step.op(m).control_inputs)
    assert members <= set(step.op(after).control_inputs)
    # a trigger for a swap-in the second filter gradient reads never waits for a bias
    # gradient of the group, though only the other convolution's is its own
    assert find_trigger(g, "relu1:0", ("d", "g_w2"), 1, 10, exact=False) == "g_relu"
