"""A memory-aware order of the device ops: the scheduler, plans that carry one, exactly."""

from __future__ import annotations

import json

import pytest
from graphs import TINY_CATEGORIES, t, tiny_step

from lmscore.errors import PlanError
from lmscore.evaluate import evaluate_plan
from lmscore.ir import Graph, Op
from lmscore.memory import simulate
from lmscore.order import order
from lmscore.plan import Plan, Swap, SwapIn, check_plan, fingerprint, plan_from_json
from lmscore.schedule import _buffer_model, memory_schedule, scheduled
from lmscore.shapes import resolve
from lmscore.tune import tune

BIG, SMALL = t("float", 1, 1000), t("float", 1, 8)


def branches() -> Graph:
    """x -> a1 (4000 B) -> s1 ; x -> a2 (4000 B) -> s2 ; j = s1 + s2.

    The executor runs a1 and a2 first (both ready at level 1): both big buffers at once.
    """
    return Graph((
        Op("x", "Placeholder", outputs=SMALL),
        Op("a1", "MatMul", inputs=("x:0", "x:0"), outputs=BIG),
        Op("a2", "MatMul", inputs=("x:0", "x:0"), outputs=BIG),
        Op("s1", "MatMul", inputs=("a1:0", "x:0"), outputs=SMALL),
        Op("s2", "MatMul", inputs=("a2:0", "x:0"), outputs=SMALL),
        Op("j", "AddV2", inputs=("s1:0", "s2:0"), outputs=SMALL),
    ), "branches")


def test_memory_schedule_finishes_a_branch_before_the_next():
    g = branches()
    base = simulate(g, 1)
    assert [g.ops[i].name for i in order(g).schedule] == ["x", "a1", "a2", "s1", "s2", "j"]
    # x 32 + a1 4000 + a2 4000 + s1 32
    assert base.peak_bytes == 8064
    names = memory_schedule(g, base)
    # a1 and a2 both allocate 4000 B (the executor's order breaks the tie); then s1 frees
    # 4000 - 32 B and goes first; the feed x is not chained (it is there before the step)
    assert names == ("a1", "s1", "a2", "s2", "j")
    step = scheduled(g, names)
    assert step.op("s1").control_inputs == ("a1",)
    assert step.op("a2").control_inputs == ("s1",)
    assert step.op("a1").control_inputs == ()
    assert step.op("a2").attrs["_lms_after"] == ("s1",)
    assert [step.ops[i].name for i in order(step).schedule] == ["x", "a1", "s1", "a2", "s2",
                                                                "j"]
    # x 32 + s1 32 + a2 4000 + s2 32
    assert simulate(step, 1).peak_bytes == 4096


def test_an_order_keeps_what_each_op_is():
    """Control edges that only fix the order change no category (update stays update)."""
    g = tiny_step()
    o = order(g)
    names = [g.ops[i].name for i in o.schedule if o.categories[i] in
             ("forward", "backward", "update")]
    step = scheduled(g, names)
    cats = order(step).categories
    assert {op.name: cats[i] for i, op in enumerate(step.ops)} == TINY_CATEGORIES
    assert step.op("upd").control_inputs == ("g_w",)


def test_a_plan_carries_its_schedule_and_the_rewrite_applies_it():
    g = branches()
    names = memory_schedule(g, simulate(g, 1))
    plan = Plan(fingerprint(g), schedule=names, pin_schedule=True)
    assert not plan.changes_nothing()
    again = plan_from_json(plan.to_json())
    assert again == plan and json.loads(plan.to_json())["schedule"] == list(names)
    ev = evaluate_plan(g, plan, 1)
    assert ev.after.peak_bytes == 4096 and ev.before.peak_bytes == 8064
    assert ev.rewrite.graph.op("a2").control_inputs == ("s1",)


def test_a_schedule_against_the_graph_is_refused():
    g = branches()
    fp = fingerprint(g)
    with pytest.raises(PlanError, match="schedule: op 'j' is listed before 's1', which it "
                                        "depends on"):
        check_plan(g, Plan(fp, schedule=("a1", "j", "s1")))
    with pytest.raises(PlanError, match="schedule: op 'a1' is listed twice"):
        check_plan(g, Plan(fp, schedule=("a1", "s1", "a1")))
    with pytest.raises(PlanError, match="schedule: unknown op 'zz'"):
        check_plan(g, Plan(fp, schedule=("a1", "zz")))
    with pytest.raises(PlanError, match="schedule needs plan version 2"):
        check_plan(g, Plan(fp, schedule=("a1", "s1"), version=1))
    doc = json.loads(Plan(fp).to_json())
    doc["schedule"] = [1, 2]
    with pytest.raises(PlanError, match="schedule must be a list of op names"):
        plan_from_json(json.dumps(doc), "p.json")


def test_swaps_apply_to_the_step_in_its_schedule():
    """A swap's trigger may be an op that only the schedule puts before its consumer."""
    g = Graph((*branches().ops, Op("k", "MatMul", inputs=("j:0", "a1:0"), outputs=SMALL)),
              "branches+late")
    names = ("a1", "s1", "a2", "s2", "j", "k")
    # s2 reaches k only through the schedule's edges (s2 -> j -> k): a trigger either way
    plan = Plan(fingerprint(g), swaps=(Swap("a1:0", (SwapIn(("k",), "s2"),)),),
                schedule=names, pin_schedule=True)
    ev = evaluate_plan(g, plan, 1)
    new = ev.rewrite.graph
    # its trigger, then the op before it in the pinned order
    assert new.op("lms/swapin_a1_0_0").control_inputs == ("s2", "j")
    assert new.op("k").inputs == ("j:0", "lms/swapin_a1_0_0:0")
    # a1 goes to the host after s1; a2 (4000) is alone on the device until s2 ends
    assert ev.after.peak_bytes < ev.before.peak_bytes


def test_the_tuner_reorders_when_no_plan_fits_in_the_executors_order():
    g = branches()
    # 6000 B: the executor's order needs 8064 and nothing can be swapped (each big tensor
    # is read right after it is made); in the memory-aware order the step needs 4096
    r = tune(g, 1, 6000, safety=1.0, strategy="swap")
    assert r.fits and r.predicted_peak_bytes == 4096 and r.baseline_peak_bytes == 8064
    assert r.plan.schedule == ("a1", "s1", "a2", "s2", "j") and r.plan.pin_schedule
    assert r.knobs["schedule"] == "memory-aware"
    assert "memory-aware order" in r.message
    # a budget under the memory-aware order's peak: still an honest refusal
    assert not tune(g, 1, 4000, safety=1.0, strategy="swap").fits


def test_an_op_that_would_overwrite_its_input_pays_for_its_result_unless_it_reads_last():
    """``s`` writes into ``g`` in place only if it runs after ``m``, as the executor runs it.

    Charged nothing for its result (it was in place in the executor's order), ``s`` ran
    first, before ``m`` had read ``g``: three buffers at once, not two.
    """
    g = Graph((
        Op("x", "Placeholder", outputs=BIG),
        Op("g", "MatMul", inputs=("x:0", "x:0"), outputs=BIG),
        Op("m", "MatMul", inputs=("g:0", "g:0"), outputs=BIG),
        Op("s", "AddN", inputs=("x:0", "g:0"), outputs=BIG),
    ), "in place")
    base = simulate(g, 1)
    assert [b.tensor for b in base.buffers] == ["g:0", "m:0"]  # s in place in g
    assert base.buffers[0].views == ("s:0",)
    # m and s each allocate 4000 B while g has another reader: the executor's order breaks
    # the tie, and s, then g's last reader, writes into g
    names = memory_schedule(g, base)
    assert names == ("g", "m", "s")
    assert simulate(scheduled(g, names), 1).peak_bytes == base.peak_bytes == 4000 * 3


def test_the_schedulers_buffers_keep_views_and_split_in_place_results():
    g = Graph((
        Op("x", "Placeholder", outputs=BIG),
        Op("g", "MatMul", inputs=("x:0", "x:0"), outputs=BIG),
        Op("a", "MatMul", inputs=("g:0", "x:0"), outputs=SMALL),
        Op("m", "Relu", inputs=("g:0",), outputs=BIG),  # in place: g's last reader
        Op("v", "Reshape", inputs=("m:0",), outputs=BIG),  # a view of m's result
        Op("s", "MatMul", inputs=("v:0", "x:0"), outputs=SMALL),
    ), "views")
    sim = simulate(g, 1)
    assert [(b.tensor, b.views) for b in sim.buffers[:1]] == [("g:0", ("m:0", "v:0"))]
    nbytes, producers, readers = _buffer_model(g, resolve(g, 1), sim)
    names = [g.ops[p].name for p in producers]
    assert list(zip(names, nbytes, [sorted(g.ops[r].name for r in rs) for rs in readers],
                    strict=True)) == [
        ("g", 4000, ["a", "m"]), ("m", 4000, ["s", "v"]), ("a", 32, []), ("s", 32, [])]


def test_a_rewritten_step_keeps_its_originals_categories_and_a_clone_its_originals():
    from lmscore.plan import Recompute
    from lmscore.rewrite import rewrite
    from lmscore.schedule import _categories_by_origin

    g = tiny_step()
    plan = Plan(fingerprint(g), recomputes=(Recompute("act:0", ("act",), ("g_relu",), "g_tile"),),
                swaps=(Swap("mm:0", (SwapIn(("act",), None),)),), pin_schedule=True)
    rw = rewrite(g, plan).graph
    got = dict(zip((op.name for op in rw.ops), _categories_by_origin(rw, order(rw)),
                   strict=True))
    assert {k: got[k] for k in TINY_CATEGORIES} == TINY_CATEGORIES
    added = {op.name: op for op in rw.ops if op.name not in TINY_CATEGORIES}
    clone = next(n for n, op in added.items() if op.attrs.get("_lms_clone_of") == "act")
    assert got[clone] == "forward"
    assert all(got[n] == "" for n in added if n != clone)  # the swap's ops: their role
    # what classifying the rewritten step again says of its original ops
    again = dict(zip((op.name for op in rw.ops), order(rw).categories, strict=True))
    assert {k: again[k] for k in TINY_CATEGORIES} == TINY_CATEGORIES


def test_shape_arithmetic_stays_out_of_the_chain():
    """Integers computed from integers or from a shape alone are left out of a pinned chain:
    Grappler folds them, and a folded op inheriting the chain's edges could wait for
    itself. Ops that read floating-point values stay in, whatever they return."""
    from lmscore.schedule import shape_arithmetic

    f = t("float", 4, 8)
    g = Graph((
        Op("x", "Placeholder", outputs=f),
        Op("relu", "Relu", inputs=("x:0",), outputs=f),
        Op("shape", "Shape", inputs=("relu:0",), outputs=t("int32", 2)),
        Op("one", "Const", outputs=t("int32", 1), attrs={"value": (1,)}),
        Op("batch", "StridedSlice", inputs=("shape:0", "one:0", "one:0", "one:0"),
           outputs=t("int32")),
        Op("dims", "Pack", inputs=("batch:0", "batch:0"), outputs=t("int32", 2)),
        Op("argmax", "ArgMax", inputs=("relu:0", "one:0"), outputs=t("int64", 4)),
        Op("ok", "Greater", inputs=("relu:0", "relu:0"), outputs=t("bool", 4, 8)),
        Op("out", "Reshape", inputs=("relu:0", "dims:0"), outputs=f),
    ))
    assert [op.name for i, op in enumerate(g.ops) if shape_arithmetic(g, i)] == [
        "shape", "one", "batch", "dims"]
    step = scheduled(g, ["relu", "shape", "batch", "dims", "argmax", "ok", "out"])
    waits = {op.name: op.control_inputs for op in step.ops if op.control_inputs}
    # the Shape holds relu's buffer until it runs: the chain waits for it (one way)
    assert waits == {"argmax": ("relu", "shape"), "ok": ("argmax",), "out": ("ok",)}


def test_the_chain_waits_for_a_shape_read_once_its_inputs_are_there():
    """A ``ShapeN`` of two computed tensors holds both until it runs: the chain unit after
    the later one waits for it (and nothing of the chain before), so it runs where the
    simulation puts it. A shape read the step prunes gets no edge, which would make it run."""
    f = t("float", 4, 8)
    i2 = t("int32", 2)
    g = Graph((
        Op("x", "Placeholder", outputs=f),
        Op("a", "Relu", inputs=("x:0",), outputs=f),
        Op("b", "Tanh", inputs=("a:0",), outputs=f),
        Op("c", "Sigmoid", inputs=("b:0",), outputs=f),
        Op("d", "Exp", inputs=("c:0",), outputs=f),
        Op("shapes", "ShapeN", inputs=("a:0", "c:0"), outputs=i2 + i2),
        Op("out", "Reshape", inputs=("d:0", "shapes:1"), outputs=f),
    ))
    step = scheduled(g, ["a", "b", "c", "d", "out"])
    waits = {op.name: op.control_inputs for op in step.ops if op.control_inputs}
    assert waits == {"b": ("a",), "c": ("b",), "d": ("c", "shapes"), "out": ("d",)}
    assert [step.ops[i].name for i in order(step).schedule] == [
        "x", "a", "b", "c", "shapes", "d", "out"]

    pruned = tiny_step()
    pruned = Graph((*pruned.ops, Op("unused", "Shape", inputs=("mm:0",), outputs=i2)))
    assert not order(pruned).needed[pruned.index["unused"]]
    step = scheduled(pruned, ["mm", "act", "loss", "g_tile", "g_relu", "g_w", "upd",
                              "apply", "out"])
    waits = {op.name: op.control_inputs for op in step.ops if op.control_inputs}
    assert waits["loss"] == ("act", "shape_act")
    assert not any("unused" in w for w in waits.values())


@pytest.mark.tf
def test_a_pinned_order_runs_under_default_grappler():
    """A transposed 1-D convolution's output shape (the batch read by ``Shape``, packed and
    concatenated) chained in a memory-aware order failed under default Grappler
    ("Incomplete graph, missing 1 inputs for .../conv_transpose/concat"), and ran with
    Grappler off."""
    zoo = pytest.importorskip("zoo")

    from lmscore.export import to_graphdef
    from lmscore.load import from_graphdef_bytes
    from lmscore.measure import measure
    from lmscore.rewrite import rewrite
    from lmscore.tfgraph import graphdef_from_concrete_function

    k = zoo._keras()
    k.utils.set_random_seed(710)
    layers = k.layers
    m = k.Sequential([
        k.Input((256, 4)),
        layers.Conv1D(32, 5, strides=2, padding="same", activation="relu"),
        layers.Conv1D(64, 5, strides=2, padding="same", activation="relu"),
        layers.Conv1DTranspose(32, 5, strides=2, padding="same", activation="relu"),
        layers.Conv1DTranspose(16, 5, strides=2, padding="same", activation="relu"),
        layers.Reshape((16, 16, 16)),
        layers.Conv2DTranspose(32, 3, strides=2, padding="same", activation="relu"),
        layers.Conv2DTranspose(16, 3, strides=2, padding="same", activation="relu"),
        layers.Conv2D(4, 3, padding="same")], name="tdec")
    cf, _ = zoo._custom_step(m, k.losses.MeanSquaredError(), k.optimizers.Adam(1e-3),
                             *zoo._specs(None, (256, 4), (64, 64, 4), y_dtype="float32"))
    data = graphdef_from_concrete_function(cf)
    g = from_graphdef_bytes(data, source="tdec", text=False)
    sizes = resolve(g, 64)
    names = memory_schedule(g, simulate(g, 64, sizes=sizes, workspace="cpu"), sizes)
    pinned = rewrite(g, Plan(fingerprint(g), schedule=tuple(names), pin_schedule=True)).graph
    before = measure(data, 64, steps=2, grappler=True)
    after = measure(to_graphdef(pinned), 64, steps=2, grappler=True)
    assert after.losses == before.losses


def test_no_trigger_at_shape_arithmetic():
    """A swap-in's trigger is never shape arithmetic: out of a pinned chain it runs as soon
    as its inputs exist, and Grappler may fold it. At the level ``ahead`` asks for, the
    float op is taken over the shape's integers, in tuned plans (``exact=False``) too."""
    from lmscore.plan import find_trigger

    f = t("float", 4, 8)
    g = Graph((
        Op("x", "Placeholder", outputs=f),
        Op("a", "Relu", inputs=("x:0",), outputs=f),                        # level 1
        Op("dims", "Shape", inputs=("a:0",), outputs=t("int32", 2)),        # level 2
        Op("b", "Relu", inputs=("a:0",), outputs=f),                        # level 2
        Op("c", "Reshape", inputs=("b:0", "dims:0"), outputs=f),            # level 3
        Op("d", "AddV2", inputs=("c:0", "a:0"), outputs=f),                 # level 4
        Op("loss", "Sum", inputs=("d:0", "dims:0"), outputs=t("float")),
    ))
    for exact in (True, False):
        got = find_trigger(g, "a:0", ["d"], ahead=2, window=1, exact=exact)
        assert got != "dims"
    assert find_trigger(g, "a:0", ["d"], ahead=2, window=0, exact=False) == "b"
