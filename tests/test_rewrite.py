"""Plans and the rewrite on hand-built graphs, with exact wiring and curves."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from graphs import long_edge, t
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import dags

import lmscore
from lmscore.errors import ConfigError, PlanError
from lmscore.ir import Graph, Op, lint
from lmscore.memory import simulate
from lmscore.plan import (
    Plan,
    Swap,
    SwapIn,
    add_swap,
    candidates,
    check_plan,
    fingerprint,
    load_plan,
    move_trigger,
    plan_from_json,
    plan_from_params,
    regroup,
    remove_swap,
    save_plan,
)
from lmscore.rewrite import rewrite
from lmscore.samples import sample_dir
from lmscore.shapes import resolve


def test_plan_from_params_picks_the_long_edge_and_its_trigger():
    g = long_edge()
    plan = plan_from_params(g, 1, threshold=3, ahead=2, groupby=5)
    assert plan.swaps == (Swap("a:0", (SwapIn(("f",), "d"),)),)
    assert plan.graph == fingerprint(g)
    assert plan_from_params(g, 1, threshold=5, ahead=2).swaps == ()  # distance 5 is not > 5


def test_rewrite_wiring_exact():
    g = long_edge()
    rw = rewrite(g, plan_from_params(g, 1, threshold=3, ahead=2))
    new = rw.graph
    assert rw.swap_outs == ("lms/swapout_a_0",) and rw.swap_ins == ("lms/swapin_a_0_0",)
    out, sin = new.op("lms/swapout_a_0"), new.op("lms/swapin_a_0_0")
    assert (out.type, out.inputs, out.control_inputs) == ("Identity", ("a:0",), ())
    assert (sin.inputs, sin.control_inputs) == (("lms/swapout_a_0:0",), ("d",))
    assert out.attrs["_lms_role"] == "swap_out" and sin.attrs["_lms_role"] == "swap_in"
    assert new.op("f").inputs == ("e:0", "lms/swapin_a_0_0:0")
    assert new.op("b").inputs == ("a:0",)  # the near consumer keeps the original
    # the op the executor runs after a's last device reader (b) waits for the copy
    assert new.op("c").control_inputs == ("lms/swapout_a_0",)
    assert all(not op.control_inputs for op in new.ops if op.name not in ("c", sin.name))
    assert rw.synchronous == () and rw.skipped == ()
    lint(new)
    assert fingerprint(new) == fingerprint(g)


def test_rewritten_curves_exact():
    g = long_edge()
    before = simulate(g, 1)
    assert before.device_curve == (32, 4032, 4064, 8064, 8064, 4096, 4096, 96)
    after = simulate(rewrite(g, plan_from_params(g, 1, threshold=3, ahead=2)).graph, 1)
    # a leaves the device after b and the swap-out (level 2); the swap-in allocates when
    # its trigger d has run (level 5) and is freed after f.
    assert after.device_curve == (32, 4032, 4064, 4064, 4064, 4064, 4096, 96)
    assert after.host_curve == (0, 0, 4000, 4000, 4000, 4000, 0, 0)
    assert (after.peak_bytes, after.host_peak_bytes) == (4096, 4000)


def test_one_evaluation_of_a_plan_exact():
    """evaluate_plan: the rewrite, both simulations, the curves on the original levels."""
    from lmscore.evaluate import evaluate_plan
    from lmscore.memory import fits

    g = long_edge()
    plan = plan_from_params(g, 1, threshold=3, ahead=2)
    ev = evaluate_plan(g, plan, 1)
    assert ev.plan == rewrite(g, plan).plan
    assert ev.before.device_curve == (32, 4032, 4064, 8064, 8064, 4096, 4096, 96)
    assert ev.after.device_curve == (32, 4032, 4064, 4064, 4064, 4064, 4096, 96)
    # on the original levels: the swap-out (level 2 after the rewrite) is drawn at its
    # producer a's level 1, the swap-in (level 5) at its consumer f's level 6
    assert ev.device_curve == (32, 4064, 4064, 4064, 4064, 4064, 4096, 96)
    assert ev.host_curve == (0, 4000, 4000, 4000, 4000, 4000, 4000, 0)
    assert ev.swap_bytes == 4000
    assert ev.fits(4096) and not ev.fits(4095)
    assert ev.fits(4096) == fits(ev.after, 4096)
    empty = evaluate_plan(g, Plan(fingerprint(g)), 1, before=ev.before)
    assert empty.after is ev.before and empty.swap_bytes == 0
    assert empty.device_curve == ev.before.device_curve


def test_sync_modes_and_serialization_add_control_edges():
    g = long_edge()
    new = rewrite(g, plan_from_params(g, 1, threshold=3, ahead=2, sync_mode=3)).graph
    assert "lms/swapout_a_0" in new.op("b").control_inputs  # compute waits for the copy out
    assert "lms/swapin_a_0_0" in new.op("e").control_inputs  # the trigger's successor waits
    two = Graph(g.ops + (Op("h", "Conv2D", inputs=("a:0",), outputs=t("float", 1, 8)),))
    new = rewrite(two, Plan(fingerprint(two), serialize=(2,))).graph
    assert new.op("h").control_inputs == ("b",)


def test_synchronous_swap_in_when_no_trigger_fits():
    g = long_edge()
    plan = plan_from_params(g, 1, threshold=3, ahead=2, trigger_window=0)
    assert plan.swaps[0].swap_ins[0].trigger == "d"  # exactly ahead levels is searched
    rw = rewrite(g, move_trigger(g, plan, "a:0", 0, None))
    assert rw.synchronous == ("lms/swapin_a_0_0",)
    assert rw.graph.op("lms/swapin_a_0_0").control_inputs == ()


def test_grouping_by_levels():
    big, small = t("float", 1, 100), t("float", 1, 8)
    ops = [Op("x", "Placeholder", outputs=small), Op("a", "Conv2D", inputs=("x:0",), outputs=big)]
    prev = "a"
    for k in range(12):
        ops.append(Op(f"n{k}", "Conv2D", inputs=(f"{prev}:0",), outputs=small))
        prev = f"n{k}"
    ops += [Op(f"r{k}", "Conv2D", inputs=(f"n{k}:0", "a:0"), outputs=small) for k in (4, 6, 11)]
    g = Graph(tuple(ops))
    plan = plan_from_params(g, 1, threshold=2, ahead=1, groupby=3)
    assert [s.consumers for s in plan.swaps[0].swap_ins] == [("r4", "r6"), ("r11",)]
    rw = rewrite(g, plan)
    assert rw.swap_ins == ("lms/swapin_a_0_0", "lms/swapin_a_0_1")
    assert rw.graph.op("r11").inputs[1] == "lms/swapin_a_0_1:0"


def test_plan_json_round_trip(tmp_path):
    g = long_edge()
    plan = plan_from_params(g, 1, threshold=3, ahead=2)
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    assert load_plan(path) == plan
    assert json.loads(path.read_text())["version"] == 2


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(version=7), "version 7"),
        (lambda d: d.update(graph="0" * 16), "another graph"),
        (lambda d: d["swaps"][0].update(tensor="ghost:0"), "unknown tensor 'ghost:0'"),
        (lambda d: d["swaps"][0]["swap_ins"][0].update(consumers=["ghost"]),
         "unknown consumer 'ghost'"),
        (lambda d: d["swaps"][0]["swap_ins"][0].update(consumers=["d"]), "'d' does not read"),
        (lambda d: d["swaps"][0]["swap_ins"][0].update(trigger="ghost"), "unknown trigger"),
        (lambda d: d["swaps"][0]["swap_ins"][0].update(trigger="g"), "does not come after|reach"),
        (lambda d: d["swaps"][0]["swap_ins"][0].update(trigger="x"), "does not come after"),
        (lambda d: d.update(sync_mode=9), "sync_mode"),
        (lambda d: d.pop("swaps"), "missing field 'swaps'"),
    ],
)
def test_bad_plans_name_the_problem(mutate, message):
    g = long_edge()
    doc = json.loads(plan_from_params(g, 1, threshold=3, ahead=2).to_json())
    mutate(doc)
    with pytest.raises(PlanError, match=message):
        check_plan(g, plan_from_json(json.dumps(doc)))


def test_not_json_plan(tmp_path):
    p = tmp_path / "p.json"
    p.write_text("{not json")
    with pytest.raises(PlanError, match="not JSON"):
        load_plan(p)


@pytest.mark.parametrize(
    "knobs", [{"threshold": 0}, {"ahead": -1}, {"groupby": -2}, {"sync_mode": 4}]
)
def test_knobs_out_of_range(knobs):
    with pytest.raises(ConfigError):
        plan_from_params(long_edge(), 1, **knobs)


def test_hand_edits():
    g = long_edge()
    empty = Plan(fingerprint(g))
    plan = add_swap(g, empty, "a:0", threshold=3, ahead=2)
    assert plan.swaps == plan_from_params(g, 1, threshold=3, ahead=2).swaps
    with pytest.raises(PlanError, match="already swapped"):
        add_swap(g, plan, "a:0")
    with pytest.raises(PlanError, match="nothing to swap"):
        add_swap(g, empty, "g:0")
    # the refusal names the edit asked for (it said "cannot be recomputed" for a swap)
    with pytest.raises(PlanError, match="'x:0' cannot be swapped: input tensor"):
        add_swap(g, empty, "x:0")
    moved = move_trigger(g, plan, "a:0", 0, "c")
    assert moved.swaps[0].swap_ins[0].trigger == "c"
    with pytest.raises(PlanError, match="cannot reach|does not come after"):
        move_trigger(g, plan, "a:0", 0, "g")
    assert remove_swap(plan, "a:0").swaps == ()
    with pytest.raises(PlanError, match="in two groups"):
        regroup(g, plan, "a:0", [["f"], ["f"]])


@settings(max_examples=120, deadline=None)
@given(dags(known=True), st.integers(1, 4), st.integers(1, 3), st.integers(0, 3),
       st.integers(0, 3))
def test_every_accepted_plan_rewrites_into_a_linted_graph(g, threshold, ahead, groupby, sync):
    plan = plan_from_params(g, 2, threshold=threshold, ahead=ahead, groupby=groupby,
                            sync_mode=sync)
    rw = rewrite(g, plan)
    lint(rw.graph)
    for s in rw.plan.swaps:
        for k, grp in enumerate(s.swap_ins):
            for c in grp.consumers:
                assert s.tensor not in rw.graph.op(c).inputs
                assert any(x.startswith("lms/swapin_") for x in rw.graph.op(c).inputs)
            del k
    sim = simulate(rw.graph, 2)
    assert min(sim.device_curve) >= sim.persistent_bytes + sim.input_bytes
    assert min(sim.host_curve) >= 0
    assert sum(b.bytes for b in sim.buffers if b.host) == sum(
        sim_b.bytes for sim_b in sim.buffers
        if rw.graph.ops[sim_b.producer].attrs.get("_lms_role") == "swap_out"
    )


def test_resnet_rewrite_lowers_the_simulated_peak():
    g = lmscore.load(sample_dir() / "resnet50.pb")
    plan = plan_from_params(g, 64, threshold=40, ahead=3, groupby=5)
    rw = rewrite(g, plan)
    before, after = simulate(g, 64), simulate(rw.graph, 64)
    assert len(plan.swaps) > 100 and rw.skipped == ()
    assert after.peak_bytes < 0.5 * before.peak_bytes
    assert after.host_peak_bytes > 0


def test_swap_out_release_skips_ops_the_step_prunes():
    """The release edge goes to an op the step runs, never to a dead branch or a Shape."""
    big, small = t("float", 1, 1000), t("float", 1, 8)
    g = Graph((
        Op("x", "Placeholder", outputs=small),
        Op("w", "Placeholder", outputs=t("resource")),
        Op("a", "Conv2D", inputs=("x:0",), outputs=big),
        Op("b", "Conv2D", inputs=("a:0",), outputs=small),
        Op("dead", "IsFinite", inputs=("b:0",), outputs=t("bool", 1, 8)),  # read by nothing
        Op("shape", "Shape", inputs=("b:0",), outputs=t("int32", 2)),
        Op("c", "Conv2D", inputs=("b:0",), outputs=small),
        Op("f", "Conv2D", inputs=("c:0", "a:0"), outputs=small),
        Op("upd", "AssignSubVariableOp", inputs=("w:0", "f:0")),
    ), "pruned")
    o = lmscore.order(g)
    assert [g.ops[i].name for i in range(len(g.ops)) if not o.needed[i]] == ["dead", "shape"]
    plan = Plan(fingerprint(g), swaps=(Swap("a:0", (SwapIn(("f",), "c"),)),))
    new = rewrite(g, plan).graph
    assert new.op("c").control_inputs == ("lms/swapout_a_0",)
    assert new.op("dead").control_inputs == () and new.op("shape").control_inputs == ()


def _pruned_reader_step(*more: Op) -> Graph:
    """a (1000 floats) read by b, by f four levels later and by ``dead``, which nothing
    reads: the step prunes it. ``more`` ends the step (an update makes it a training step).
    """
    big, small = t("float", 1, 1000), t("float", 1, 8)
    return Graph((
        Op("x", "Placeholder", outputs=small),
        Op("w", "Placeholder", outputs=t("resource")),
        Op("a", "Conv2D", inputs=("x:0",), outputs=big),
        Op("b", "Conv2D", inputs=("a:0",), outputs=small),
        Op("c", "Conv2D", inputs=("b:0",), outputs=small),
        Op("d", "Conv2D", inputs=("c:0",), outputs=small),
        Op("f", "Conv2D", inputs=("d:0", "a:0"), outputs=small),
        Op("dead", "Greater", inputs=("a:0", "f:0"), outputs=t("bool", 1, 1000)),  # unread
        *more,
    ), "pruned reader")


@pytest.mark.parametrize("pin", [False, True])
def test_swap_out_release_ignores_readers_the_step_prunes(pin):
    """A pruned reader of the swapped tensor never runs, so the buffer is free without it.

    Waiting for it put the release after the backward pass: a GAN's tuned plan (the
    discriminator's tape reads the generator's activations for gradients nobody applies)
    then held the swapped tensors until their late swap-outs ran, 1.25x its budget.
    """
    g = _pruned_reader_step(Op("upd", "AssignSubVariableOp", inputs=("w:0", "f:0")))
    o = lmscore.order(g)
    assert [g.ops[i].name for i in range(len(g.ops)) if not o.needed[i]] == ["dead"]
    plan = Plan(fingerprint(g), swaps=(Swap("a:0", (SwapIn(("f",), "d"),)),),
                pin_schedule=pin)
    new = rewrite(g, plan).graph
    assert "lms/swapout_a_0" in new.op("c").control_inputs
    assert all("lms/swapout_a_0" not in op.control_inputs
               for op in new.ops if op.name not in ("c", "lms/swapin_a_0_0"))


def _release_graph() -> Graph:
    """``a`` (4000 B) read only by ``f``, late; ``c`` (4000 B) needs neither."""
    big, small = t("float", 1, 1000), t("float", 1, 8)
    return Graph((
        Op("x", "Placeholder", outputs=small),
        Op("a", "MatMul", inputs=("x:0", "x:0"), outputs=big),
        Op("c", "MatMul", inputs=("x:0", "x:0"), outputs=big),
        Op("d", "MatMul", inputs=("c:0", "x:0"), outputs=small),
        Op("e", "MatMul", inputs=("d:0", "x:0"), outputs=small),
        Op("f", "MatMul", inputs=("e:0", "a:0"), outputs=small),
    ), "release")


@pytest.mark.parametrize("pin", [False, True])
def test_swap_out_release_is_the_op_right_after_the_last_reader(pin):
    """The op after the swapped tensor's last reader waits for the copy, even one the
    executor would start before the swap-out.

    ``a`` (4000 B) is read only by ``f``, late; ``c`` (4000 B) needs neither. When ``a``
    ends, ``c`` and the swap-out are both ready and the executor starts ``c`` first:
    released at the op after the swap-out (``d``), ``a`` and ``c`` were both on the device.
    """
    g = _release_graph()
    assert simulate(g, 1).peak_bytes == 32 + 4000 + 4000 + 32  # x, a, c, d
    plan = Plan(fingerprint(g), swaps=(Swap("a:0", (SwapIn(("f",), "d"),)),),
                pin_schedule=pin)
    new = rewrite(g, plan).graph
    assert "lms/swapout_a_0" in new.op("c").control_inputs
    assert "lms/swapout_a_0" not in new.op("d").control_inputs
    assert [new.ops[i].name for i in lmscore.order(new).schedule] == [
        "x", "a", "lms/swapout_a_0", "c", "d", "e", "lms/swapin_a_0_0", "f"]
    assert simulate(new, 1).peak_bytes == 32 + 4000 + 32 + 32  # x, c, d, e: a is gone


def test_a_swapped_tensor_may_outlive_its_swap_out_on_the_emulated_accelerator():
    """The release race: the thread that handed ``a`` to the host may clear its reference
    only after the op that waited for the swap-out (``c``) and the next allocating ones
    (``d``; ``e``'s 32 bytes do not count) have allocated. Under the CPU kernels'
    emulation "fits" holds ``a`` beside them (``race_bytes``); on an accelerator the copy
    outlasts that window. The expected curve is the same under both."""
    from lmscore.memory import held_through, release_hold

    g = _release_graph()
    plan = Plan(fingerprint(g), swaps=(Swap("a:0", (SwapIn(("f",), "d"),)),))
    new = rewrite(g, plan).graph
    emulated, device = simulate(new, 1, workspace="eigen"), simulate(new, 1)
    assert emulated.device_curve == device.device_curve
    assert emulated.peak_bytes == device.peak_bytes == 32 + 4000 + 32 + 32
    assert device.race_bytes == 0
    # at d: x, c, d, and a not yet freed
    assert emulated.worst_peak_bytes == 32 + 4000 + 32 + 4000
    assert release_hold("eigen") == release_hold("onednn") == 3
    assert release_hold("accelerator") == release_hold("none") == 0
    assert held_through([2, 3, 4, 5], 1, 2) == 3 and held_through([2, 3, 4, 5], 1, 0) == 1


def test_a_pinned_release_is_never_an_op_onednn_merges():
    """The release skips a bias gradient and its filter gradient (``Graph.siblings``).

    Waiting for a swap-out, the bias gradient is left out of oneDNN's merge with the filter
    gradient and sums in another order; the next op that computes, ``d``, waits instead.
    """
    big, small = t("float", 1, 1000), t("float", 1, 8)
    g = Graph((
        Op("x", "Placeholder", outputs=small),
        Op("a", "MatMul", inputs=("x:0", "x:0"), outputs=big),
        Op("r", "MatMul", inputs=("a:0", "x:0"), outputs=small),  # a's last near reader
        Op("bg", "BiasAddGrad", inputs=("r:0",), outputs=t("float", 8)),
        Op("fg", "Conv2DBackpropFilter", inputs=("x:0", "x:0", "r:0"), outputs=small),
        Op("d", "MatMul", inputs=("fg:0", "x:0"), outputs=small),
        Op("e", "MatMul", inputs=("d:0", "bg:0"), outputs=small),
        Op("f", "MatMul", inputs=("e:0", "a:0"), outputs=small),
    ), "merged release")
    assert set(g.siblings) == {g.index["bg"], g.index["fg"]}
    plan = Plan(fingerprint(g), swaps=(Swap("a:0", (SwapIn(("f",), "e"),)),),
                pin_schedule=True)
    new = rewrite(g, plan).graph
    waits = [op.name for op in new.ops if "lms/swapout_a_0" in op.control_inputs]
    assert waits == ["d"]


def test_a_pinned_release_may_be_a_swap_in():
    """A swap-in that would run right after the swapped tensor waits for its swap-out.

    ``a`` (4000 B, one port) triggers ``b``'s swap-in and is read again only by ``g``,
    late. When ``a`` ends, ``b``'s swap-in and ``a``'s swap-out are both ready and the
    swap-in comes first: released at the next op that computes besides swap-ins (``f``),
    ``a`` and ``b``'s swap-in were both on the device (ResNet-50's conv1 batch-norm
    gradient at batch 1,232: 1.6 GiB over a plan its model fitted).
    """
    big, small = t("float", 1, 1000), t("float", 1, 8)
    g = Graph((
        Op("x", "Placeholder", outputs=small),
        Op("b", "MatMul", inputs=("x:0", "x:0"), outputs=big),
        Op("c", "MatMul", inputs=("b:0", "x:0"), outputs=small),
        Op("a", "Unpack", inputs=("c:0",), outputs=big + small),
        Op("f", "MatMul", inputs=("a:1", "b:0"), outputs=small),
        Op("g", "MatMul", inputs=("f:0", "a:0"), outputs=small),
    ), "release at a swap-in")
    plan = Plan(fingerprint(g), swaps=(Swap("b:0", (SwapIn(("f",), "a"),)),
                                       Swap("a:0", (SwapIn(("g",), "f"),))), pin_schedule=True)
    new = rewrite(g, plan).graph
    assert "lms/swapout_a_0" in new.op("lms/swapin_b_0_0").control_inputs
    assert "lms/swapout_a_0" not in new.op("f").control_inputs
    assert [new.ops[i].name for i in lmscore.order(new).schedule] == [
        "x", "b", "c", "lms/swapout_b_0", "a", "lms/swapout_a_0", "lms/swapin_b_0_0", "f",
        "lms/swapin_a_0_0", "g"]
    assert simulate(new, 1).peak_bytes == 32 + 4000 + 32 + 32  # x, b's swap-in, c, a:1


def test_readers_the_step_prunes_are_never_swap_candidates():
    """A swap-in for a reader that never runs would move bytes for nothing."""
    g = _pruned_reader_step(
        Op("g", "Conv2D", inputs=("f:0",), outputs=t("float", 1, 8)),
        Op("dead2", "Greater", inputs=("g:0", "a:0"), outputs=t("bool", 1, 1000)),
        Op("upd", "AssignSubVariableOp", inputs=("w:0", "g:0")),
    )
    o = lmscore.order(g)
    assert [g.ops[i].name for i in range(len(g.ops)) if not o.needed[i]] == ["dead", "dead2"]
    sizes = resolve(g, 1)
    # a:0's far readers: f only (dead and dead2, further still, never run)
    assert [(c.tensor, c.far, c.near) for c in candidates(g, sizes, 2)] == [
        ("a:0", ("f",), ("b",))]
    plan = plan_from_params(g, 1, threshold=2)
    assert [(s.tensor, [si.consumers for si in s.swap_ins]) for s in plan.swaps] == [
        ("a:0", [("f",)])]


def test_pinned_schedule_chains_device_ops_in_the_simulated_order():
    g = long_edge()
    plan = plan_from_params(g, 1, threshold=3, ahead=2)
    pinned = replace(plan, pin_schedule=True)
    rw, rp = rewrite(g, plan).graph, rewrite(g, pinned).graph
    order_before = [rw.ops[i].name for i in lmscore.order(rw).schedule]
    order_after = [rp.ops[i].name for i in lmscore.order(rp).schedule]
    assert order_after == order_before  # pinning keeps the simulated order
    # the same order, so the same buffers live at every step: the same peak
    assert simulate(rp, 1).peak_bytes == simulate(rw, 1).peak_bytes
    # every op of the chain waits for the one before it; the swap-out (host) and the
    # feed stay out of it
    chain = [n for n in order_before if n not in ("x", "lms/swapout_a_0")]
    for a, b in zip(chain, chain[1:], strict=False):
        assert a in rp.op(b).control_inputs, (a, b)
    assert rp.op("lms/swapout_a_0").control_inputs == ()
    lint(rp)
    text = pinned.to_json()
    assert json.loads(text)["pin_schedule"] is True and plan_from_json(text) == pinned
    assert "pin_schedule" not in plan.to_json()  # older plans keep their bytes
    with pytest.raises(PlanError, match="pin_schedule must be true or false"):
        plan_from_json(text.replace('"pin_schedule": true', '"pin_schedule": 1'))


def test_a_swish_reads_the_tensor_itself():
    # b = conv + bias; Keras' swish b * sigmoid(beta * b), a plain one b * sigmoid(b), and a
    # product of b with something else, which may read a swap-in
    f = t("float", 1, 8)
    g = Graph((
        Op("x", "Placeholder", outputs=f), Op("beta", "Const", outputs=t("float")),
        Op("b", "BiasAdd", inputs=("x:0", "x:0"), outputs=f),
        Op("scaled", "Mul", inputs=("beta:0", "b:0"), outputs=f),
        Op("sig", "Sigmoid", inputs=("scaled:0",), outputs=f),
        Op("swish", "Mul", inputs=("b:0", "sig:0"), outputs=f),
        Op("sig2", "Sigmoid", inputs=("b:0",), outputs=f),
        Op("swish2", "Mul", inputs=("sig2:0", "b:0"), outputs=f),
        Op("other", "Mul", inputs=("b:0", "x:0"), outputs=f),
    ), "swish")
    from lmscore.plan import keeps_tensor

    i = g.index
    assert keeps_tensor(g, i["swish"], i["b"], 0)
    assert keeps_tensor(g, i["swish2"], i["b"], 0)
    assert not keeps_tensor(g, i["other"], i["b"], 0)
    assert not keeps_tensor(g, i["sig2"], i["b"], 0)
    assert not keeps_tensor(g, i["swish"], i["b"], 0, exact=False)  # tuned plans: a peak


@pytest.mark.parametrize(("name", "batch", "fraction"), [("lstm", 16, None), ("bert", 8, None),
                                                         ("resnet50", 64, 0.6)])
def test_a_rewritten_step_needs_what_classifying_it_afresh_says(name, batch, fraction):
    # a rewrite's needed ops are walked back from its original's updates and loss
    # (ir.parent_of), without classifying its ops again: the same answer as a fresh graph
    from lmscore.ir import parent_of
    from lmscore.order import order
    from lmscore.tune import tune

    g = lmscore.load(sample_dir() / f"{name}.pb")
    plans = [plan_from_params(g, batch, threshold=t) for t in (2, 20)]
    if fraction is not None:
        sim = simulate(g, batch)
        budget = int(sim.persistent_bytes + fraction * (sim.peak_bytes - sim.persistent_bytes))
        plans.append(tune(g, batch, budget, safety=1.0).plan)
        assert plans[-1].recomputes  # clones too
    for plan in plans:
        new = rewrite(g, plan).graph
        assert parent_of(new) is not None
        fresh = Graph(new.ops, new.source, new.functions, new.graphdef)
        assert parent_of(fresh) is None
        assert order(new).needed == order(fresh).needed
