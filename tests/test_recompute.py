"""Recomputation: plan version 2, the rewrite's clones, and the per-tensor MILP, exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from graphs import long_edge, t

from lmscore.errors import PlanError
from lmscore.evaluate import evaluate_plan
from lmscore.ir import Graph, Op
from lmscore.order import order
from lmscore.plan import (
    Plan,
    Recompute,
    add_recompute,
    check_plan,
    empty_plan,
    fingerprint,
    plan_from_json,
    recompute_refusal,
    remove_recompute,
)
from lmscore.planners import Option, solve
from lmscore.shapes import extend_sizes, resolve

BIG, SMALL = t("float", 1, 1000), t("float", 1, 8)


def chain() -> Graph:
    """x -> a (4000 B) -> b = tanh(a), in place -> c -> d -> e -> f(e, b): b read at 3 and 6."""
    return Graph((
        Op("x", "Placeholder", outputs=SMALL),
        Op("a", "MatMul", inputs=("x:0", "x:0"), outputs=BIG),
        Op("b", "Tanh", inputs=("a:0",), outputs=BIG),
        Op("c", "MatMul", inputs=("b:0", "x:0"), outputs=SMALL),
        Op("d", "MatMul", inputs=("c:0", "x:0"), outputs=SMALL),
        Op("e", "MatMul", inputs=("d:0", "x:0"), outputs=SMALL),
        Op("f", "MatMul", inputs=("e:0", "b:0"), outputs=SMALL),
    ), "chain")


def test_recompute_of_a_chain_wiring_and_curves_exact():
    g = chain()
    plan = Plan(fingerprint(g), recomputes=(Recompute("b:0", ("a", "b"), ("f",), "d"),))
    ev = evaluate_plan(g, plan, 1)
    new = ev.rewrite.graph
    assert ev.rewrite.clones == ("lms/recompute_b_0/a", "lms/recompute_b_0/b")
    ca, cb = new.op("lms/recompute_b_0/a"), new.op("lms/recompute_b_0/b")
    # the first clone reads the kept feed and waits for the trigger; the second reads it
    assert (ca.type, ca.inputs, ca.control_inputs) == ("MatMul", ("x:0", "x:0"), ("d",))
    assert (cb.type, cb.inputs, cb.control_inputs) == ("Tanh", ("lms/recompute_b_0/a:0",), ())
    assert ca.attrs["_lms_clone_of"] == "a" and cb.attrs["_lms_tensor"] == "b:0"
    assert new.op("f").inputs == ("e:0", "lms/recompute_b_0/b:0")
    assert new.op("c").inputs == ("b:0", "x:0")  # the near reader keeps the original
    # before: a/b's 4000 B live from level 1 to f at 6. After: freed after c (level 3),
    # made again after d by the clones (levels 5 and 6, tanh in place), read by f at 7.
    assert ev.before.device_curve == (32, 4032, 4032, 4064, 4096, 4096, 4096)
    assert ev.after.device_curve == (32, 4032, 4032, 4064, 96, 4064, 4064, 4096)
    assert ev.device_curve == (32, 4032, 4032, 4064, 96, 4064, 4096)  # clones at f's level
    assert ev.host_curve == (0,) * 7 and ev.swap_bytes == 0
    sizes = resolve(g, 1)
    assert extend_sizes(sizes, new) == resolve(new, 1)


def test_hand_edit_recomputes_the_long_edge():
    g = long_edge()
    plan = add_recompute(g, empty_plan(g), "a:0", threshold=3, ahead=2)
    assert plan.version == 2
    assert plan.recomputes == (Recompute("a:0", ("a",), ("f",), "d"),)
    ev = evaluate_plan(g, plan, 1)
    # what the swap of a:0 gives on the device, with nothing on the host
    assert ev.after.device_curve == (32, 4032, 4064, 4064, 4064, 4064, 4096, 96)
    assert ev.host_curve == (0,) * 8
    with pytest.raises(PlanError, match="already recomputed"):
        add_recompute(g, plan, "a:0", threshold=3)
    assert remove_recompute(plan, "a:0").recomputes == ()
    with pytest.raises(PlanError, match="no consumer more than 5"):
        add_recompute(g, empty_plan(g), "a:0", threshold=5)


def _step_with(op: Op) -> Graph:
    return Graph((
        Op("x", "Placeholder", outputs=SMALL),
        Op("seed", "Placeholder", outputs=t("int32", 2)),
        Op("v", "VarHandleOp", outputs=t("resource")),
        op,
        Op("y", "MatMul", inputs=(f"{op.name}:0", "x:0"), outputs=SMALL),
    ), "refusals")


@pytest.mark.parametrize(("op", "reason"), [
    (Op("r", "RandomUniform", inputs=("x:0",), outputs=BIG), "stateful"),
    (Op("r", "ReadVariableOp", inputs=("v:0",), outputs=BIG), "persistent op"),
    (Op("r", "StatelessRandomUniformV2", inputs=("x:0", "seed:0", "seed:0", "seed:0"),
        outputs=BIG), ""),
    (Op("r", "StatelessWhile", inputs=("x:0",), outputs=BIG), "a loop or function call"),
    (Op("r", "NoSuchOp", inputs=("x:0",), outputs=BIG), "unknown op type"),
])
def test_what_is_never_recomputed(op, reason):
    g = _step_with(op)
    assert recompute_refusal(g, order(g), g.index["r"]) == reason or (
        reason and reason in recompute_refusal(g, order(g), g.index["r"]))


def test_plan_v2_json_and_version_1():
    g = chain()
    plan = Plan(fingerprint(g), recomputes=(Recompute("b:0", ("a", "b"), ("f",), "d"),))
    assert plan_from_json(plan.to_json()) == plan
    doc = json.loads(plan.to_json())
    assert doc["version"] == 2 and doc["recomputes"][0]["ops"] == ["a", "b"]
    v1 = plan_from_json(json.dumps({"version": 1, "graph": fingerprint(g), "swaps": []}))
    assert v1.version == 1 and v1.recomputes == ()
    check_plan(g, v1)
    with pytest.raises(PlanError, match="recomputes need plan version 2"):
        plan_from_json(json.dumps({**doc, "version": 1}))


@pytest.mark.parametrize(("recompute", "message"), [
    (Recompute("b:0", ("a",), ("f",), "d"), "producer 'b' is not among"),
    (Recompute("b:0", ("b", "a"), ("f",), "d"), "'a' is listed after 'b'"),
    (Recompute("b:0", ("c", "a", "b"), ("f",), "d"), "'c' does not lead to the tensor"),
    (Recompute("b:0", ("a", "b"), ("e",), "d"), "'e' does not read it"),
    (Recompute("b:0", ("a", "b"), ("f",), "ghost"), "unknown trigger 'ghost'"),
    (Recompute("b:0", ("a", "b"), ("f",), "a"), "does not come after the producer"),
    (Recompute("b:0", ("a", "ghost", "b"), ("f",), "d"), "unknown op 'ghost'"),
    (Recompute("x:0", ("x",), ("a",), "d"), "'x' cannot be recomputed: input op"),
])
def test_bad_recomputes_name_the_problem(recompute, message):
    g = chain()
    with pytest.raises(PlanError, match=message):
        check_plan(g, Plan(fingerprint(g), recomputes=(recompute,)))


def _option(tensor, lo, hi, nbytes, seconds, keeps=()):
    return Option(tensor, "swap", lo, hi, nbytes, seconds, ("c",), "t", (), keeps)


def test_milp_picks_the_cheapest_cover():
    live = np.array([0, 10, 10, 5])
    a = _option("a", 1, 2, 4, 1.0)  # covers both over-budget positions alone
    b = _option("b", 1, 1, 5, 0.5)
    c = _option("c", 2, 2, 5, 0.6)  # b + c cost 1.1 > 1.0
    sol = solve([a, b, c], live, 6)
    assert sol.feasible and sol.chosen == (a,) and sol.seconds == 1.0
    cheaper = _option("c", 2, 2, 5, 0.4)
    assert set(solve([a, b, cheaper], live, 6).chosen) == {b, cheaper}
    # one option per tensor, and a recomputation's input stays on the device
    b2 = _option("a", 1, 1, 5, 0.1)
    assert solve([a, b2], live, 6).chosen == (a,)
    both = np.array([0, 16, 16, 8])  # needs 12 B freed at 1-2: both options of 6 B
    free_a = _option("a", 1, 3, 6, 0.1)
    assert solve([free_a, _option("k", 1, 2, 6, 0.1)], both, 4).feasible
    assert not solve([free_a, _option("k", 1, 2, 6, 0.1, keeps=("a",))], both, 4).feasible
    assert solve([], live, 10).chosen == () and solve([], live, 10).feasible
    assert not solve([b], live, 6).feasible


def test_milp_keeps_the_host_within_its_limit():
    live = np.array([0, 10, 10, 5])
    a = _option("a", 1, 2, 4, 1.0)
    b = _option("b", 1, 1, 5, 0.5)
    c = _option("c", 2, 2, 5, 0.4)  # b + c: 1.0 B less on the device, 0.9 s
    assert set(solve([a, b, c], live, 6).chosen) == {b, c}
    assert set(solve([a, b, c], live, 6, host_limit=5).chosen) == {b, c}  # one at a time
    assert solve([a, b, c], live, 6, host_limit=4).chosen == (a,)  # b, c hold 5 B each
    assert not solve([a, b, c], live, 6, host_limit=3).feasible
    rec = Option("r", "recompute", 1, 2, 4, 2.0, ("c",), "t", ("x",))
    assert solve([a, rec], live, 6, host_limit=0).chosen == (rec,)  # clones hold no host
