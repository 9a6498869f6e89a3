"""Chen's sqrt(n) checkpointing (lmscore.checkpoint): segments, recomputations and peaks."""

from __future__ import annotations

from dataclasses import replace

import pytest
from graphs import t

import lmscore
import lmscore.samples
from lmscore.checkpoint import activations, checkpointing, chen_plan, cut_points, split
from lmscore.errors import ConfigError
from lmscore.evaluate import evaluate_plan
from lmscore.ir import Graph, Op
from lmscore.order import FORWARD, order
from lmscore.plan import Recompute, recompute_refusal
from lmscore.shapes import resolve
from lmscore.tune import tune

ACT = 4000  # bytes of one activation at batch 1 (1000 floats)


def tanh_chain(n: int = 9) -> Graph:
    """x @ w -> h1 = tanh(.) -> ... -> hn -> sum; the gradient reads every h_i once.

    ``mm`` is read by ``h1`` alone, so ``h1`` is computed in place in its buffer: the
    first activation is the buffer ``mm:0``. Each ``TanhGrad`` ``g_i`` reads ``h_i``.
    """
    f = "float"
    ops = [
        Op("x", "Placeholder", outputs=t(f, -1, 1)),
        Op("w", "VarHandleOp", outputs=t("resource")),
        Op("axes", "Const", outputs=t("int32", 2), attrs={"value": (0, 1)}),
        Op("ones", "Const", outputs=t(f), attrs={"value": (1.0,)}),
        Op("lr", "Const", outputs=t(f), attrs={"value": (0.1,)}),
        Op("r", "ReadVariableOp", inputs=("w:0",), outputs=t(f, 1, 1000)),
        Op("mm", "MatMul", inputs=("x:0", "r:0"), outputs=t(f, -1, 1000)),
    ]
    prev = "mm:0"
    for i in range(1, n + 1):
        ops.append(Op(f"h{i}", "Tanh", inputs=(prev,), outputs=t(f, -1, 1000)))
        prev = f"h{i}:0"
    ops += [
        Op("loss", "Sum", inputs=(prev, "axes:0"), outputs=t(f)),
        Op("shape", "Shape", inputs=(prev,), outputs=t("int32", 2)),
        Op("seed", "BroadcastTo", inputs=("ones:0", "shape:0"), outputs=t(f, -1, 1000)),
    ]
    grad = "seed:0"
    for i in range(n, 0, -1):
        ops.append(Op(f"g{i}", "TanhGrad", inputs=(f"h{i}:0", grad), outputs=t(f, -1, 1000)))
        grad = f"g{i}:0"
    ops += [
        Op("g_w", "MatMul", inputs=("x:0", grad), outputs=t(f, 1, 1000),
           attrs={"transpose_a": True}),
        Op("upd", "Mul", inputs=("g_w:0", "lr:0"), outputs=t(f, 1, 1000)),
        Op("apply", "AssignSubVariableOp", inputs=("w:0", "upd:0")),
    ]
    return Graph(tuple(ops), "tanh_chain")


def test_split_counts_bytes_and_cut_points():
    assert split([]) == ()
    assert split([1] * 9) == ((0, 3), (3, 6), (6, 9))
    assert split([1] * 10) == ((0, 3), (3, 6), (6, 10))  # round(sqrt(10)) = 3
    assert split([1] * 5, 9) == tuple((k, k + 1) for k in range(5))  # at most n
    # a segment ends at the nearest activation that may end one
    cuts = [False, True, False, False, False, False, False, True, False]
    assert split([1] * 9, cuts=cuts) == ((0, 2), (2, 8), (8, 9))
    assert split([1] * 4, 2, cuts=[False] * 4) == ((0, 4),)  # the last always may
    # Chen's greedy cut: a segment closes once it holds more than the budget
    assert split([3, 1, 1, 4, 1], segment_bytes=4) == ((0, 3), (3, 5))
    assert split([3, 1, 1, 4, 1], segment_bytes=4, cuts=[1, 0, 0, 1, 1]) == ((0, 4), (4, 5))


def test_chain_checkpoints_and_recomputes_exactly():
    g = tanh_chain()
    c = checkpointing(g, 1)
    assert c.activations == 9  # sqrt(9) = 3 segments of 3
    assert [s.activations for s in c.segments] == [
        ("mm:0", "h2:0", "h3:0"), ("h4:0", "h5:0", "h6:0"), ("h7:0", "h8:0", "h9:0")]
    assert c.checkpoints == ("h3:0", "h6:0", "h9:0")
    assert c.recomputed == ("mm:0", "h2:0", "h4:0", "h5:0", "h7:0", "h8:0") and not c.kept
    # each chain reaches back to its segment's checkpoint (the first to the feed and the
    # variable), and starts after the gradient op just before its reader
    assert c.plan.recomputes == (
        Recompute("h1:0", ("mm", "h1"), ("g1",), "g2"),
        Recompute("h2:0", ("mm", "h1", "h2"), ("g2",), "g3"),
        Recompute("h4:0", ("h4",), ("g4",), "g5"),
        Recompute("h5:0", ("h4", "h5"), ("g5",), "g6"),
        Recompute("h7:0", ("h7",), ("g7",), "g8"),
        Recompute("h8:0", ("h7", "h8"), ("g8",), "g9"),
    )
    assert c.clones == 11 and c.plan.params["segments"] == 3
    assert not c.plan.swaps and not c.plan.pin_schedule
    assert chen_plan(g, 1) == c.plan


def test_chain_peak_exactly():
    g = tanh_chain()
    ev = evaluate_plan(g, chen_plan(g, 1), 1)
    fixed = 4000 + 16 + 4  # the variable's read, three constants; the feed
    # before: at the gradient's seed, all nine activations, the seed and its shape (8 B)
    assert ev.before.peak_bytes == fixed + 9 * ACT + ACT + 8
    # after: the three checkpoints, the seed and its shape; the backward pass holds one
    # recomputed activation at a time beside its gradient, never more
    assert ev.after.peak_bytes == fixed + 3 * ACT + ACT + 8
    assert ev.fits(ev.after.peak_bytes) and not ev.fits(ev.after.peak_bytes - 1)


def test_chen_greedy_by_bytes_and_segment_count():
    g = tanh_chain()
    greedy = checkpointing(g, 1, segment_bytes=2 * ACT)  # closes after 3 activations
    assert greedy.checkpoints == ("h3:0", "h6:0", "h9:0")
    assert greedy.plan.params["segment_bytes"] == 2 * ACT
    one = checkpointing(g, 1, segments=1)
    assert one.checkpoints == ("h9:0",) and len(one.recomputed) == 8
    assert one.clones == sum(range(2, 10))  # h_k's chain: mm, h1 ... h_k
    with pytest.raises(ConfigError, match="segments"):
        checkpointing(g, 1, segments=0)
    with pytest.raises(ConfigError, match="segment_bytes"):
        checkpointing(g, 1, segment_bytes=-1)


def test_a_refused_op_keeps_what_needs_it():
    # h5 draws random numbers: its clone would not reproduce it, so h5 and what is
    # recomputed through it (h4 is recomputed from h3 alone, and stays dropped) is kept
    g = tanh_chain()
    ops = [Op("h5", "RandomUniform", inputs=("h4:0",), outputs=op.outputs)
           if op.name == "h5" else op for op in g.ops]
    g = Graph(tuple(ops), "tanh_chain_random")
    c = checkpointing(g, 1)
    kept = dict(c.kept)
    assert set(kept) == {"h5:0"} and "stateful" in kept["h5:0"]
    assert "h4:0" in c.recomputed and "h5:0" not in c.plan.recomputed()


def _assert_valid(graph: Graph, plan, batch: int):
    """The plan's rewrite holds: every clone is of an allowed forward op, readers rewired."""
    ev = evaluate_plan(graph, plan, batch)
    ordering = order(graph)
    for r in plan.recomputes:
        for name in r.ops:
            i = graph.index[name]
            assert ordering.categories[i] == FORWARD
            assert recompute_refusal(graph, ordering, i) == ""
    new = ev.rewrite.graph
    assert len(ev.rewrite.clones) == sum(len(r.ops) for r in plan.recomputes)
    for r in plan.recomputes:
        for c in r.consumers:
            assert r.tensor not in new.op(c).inputs
    return ev


def test_chain_rewrite_is_valid():
    g = tanh_chain()
    _assert_valid(g, chen_plan(g, 1), 1)


@pytest.fixture(scope="module")
def resnet50() -> Graph:
    return lmscore.load(lmscore.samples.find("resnet50"))


def test_resnet50_checkpoints_at_block_outputs_and_lowers_the_peak(resnet50):
    g = resnet50
    batch = 32
    sizes = resolve(g, batch)
    c = checkpointing(g, batch, sizes=sizes)
    n = c.activations
    assert abs(len(c.segments) - round(n ** 0.5)) <= 1
    # every checkpoint cuts the forward pass: a residual block's output, or the stem's
    ev = _assert_valid(g, c.plan, batch)
    buffers = activations(g, ev.before)
    acts = {b.tensor: k for k, b in enumerate(buffers)}
    cuts = cut_points(g, ev.before, buffers)
    assert all(cuts[acts[cp]] for cp in c.checkpoints)
    assert len(c.recomputed) + len(c.kept) + len(c.segments) == n
    assert ev.after.peak_bytes < 0.6 * ev.before.peak_bytes


@pytest.mark.tf
@pytest.mark.parametrize("name", ["bn_cnn", "mlp_dropout"])
def test_checkpointed_step_is_bit_identical_under_default_grappler(name):
    """The clones compute the bits the originals did (dropout masks: same seed, same mask)."""
    pytest.importorskip("tensorflow")
    zoo = pytest.importorskip("zoo")
    from test_zoo_numerics import _assert_identical, _run

    from lmscore.export import to_graphdef
    from lmscore.rewrite import rewrite

    graph = zoo.graph(name)
    batch = zoo.BY_NAME[name].batch
    c = checkpointing(graph, batch)
    assert len(c.recomputed) >= 5 and c.clones > len(c.plan.recomputes)
    rw = rewrite(graph, c.plan)
    _assert_identical(_run(graph.graphdef, batch),
                      _run(to_graphdef(rw.graph, mode="emulate"), batch))


@pytest.mark.parametrize("strategy", ["recompute", "hybrid"])
def test_tune_falls_back_to_checkpointing_where_no_per_tensor_plan_fits(strategy):
    """A 16-tanh chain with no host memory for swaps: a per-tensor recomputation clones at
    most four ops from an input still on the device, and none fits the checkpointed peak;
    the sqrt(n) plan (4 segments of 4) does, and ``tune`` returns it."""
    g = tanh_chain(16)
    ev = evaluate_plan(g, chen_plan(g, 1), 1)
    fixed = 4000 + 16 + 4
    assert (ev.before.peak_bytes, ev.after.peak_bytes) == (
        fixed + 16 * ACT + ACT + 8, fixed + 4 * ACT + ACT + 8)
    r = tune(g, 1, ev.after.peak_bytes, safety=1.0, strategy=strategy, host_memory=1)
    made_for = {"device_bytes": ev.after.peak_bytes, "workspace": "accelerator"}
    expected = replace(chen_plan(g, 1), pin_schedule=True)
    assert r.fits and r.plan == replace(expected, params={**expected.params, **made_for})
    assert r.knobs == {"baseline": "sqrt(n)"}
    assert r.predicted_peak_bytes == ev.after.peak_bytes and r.swapped_tensors == 0
    assert r.message.startswith("fits with 12 recomputed tensors (sqrt(n) checkpointing)")
    short = tune(g, 1, ev.after.peak_bytes - 1, safety=1.0, strategy=strategy, host_memory=1)
    assert not short.fits


@pytest.mark.tf
def test_a_pooling_workspace_is_kept_not_recomputed():
    """oneDNN's max pooling keeps a workspace for its gradient: memory no tensor names.
    Checkpointing keeps it, with a reason, where it once looked it up as an op (KeyError
    from ``lms tune --workspace cpu --strategy recompute`` on a U-Net under oneDNN)."""
    zoo = pytest.importorskip("zoo")
    from lmscore.memory import simulate

    graph = zoo.graph("unet2d")
    batch = zoo.BY_NAME["unet2d"].batch
    base = simulate(graph, batch, workspace="onednn")
    pools = {b.tensor for b in base.buffers if b.tensor.endswith("/workspace")}
    assert pools
    c = checkpointing(graph, batch, base=base)
    why = dict(c.kept)
    kept = pools & set(why)
    assert kept and all("kernel's workspace" in why[t] for t in kept)
    assert not pools & set(c.recomputed)
    r = tune(graph, batch, base.persistent_bytes + base.input_bytes
             + base.transient_peak_bytes // 2, workspace="onednn", strategy="recompute")
    assert r.message
