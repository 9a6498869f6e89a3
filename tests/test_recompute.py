"""Recomputation: plan version 2, the rewrite's clones, and the per-tensor MILP, exactly."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from graphs import long_edge, t
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lmscore import planners
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
from lmscore.planners import Option, decisions, solve
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


def test_two_idle_stretches_of_a_buffer_are_two_swap_ins_of_one_swap():
    live = np.array([0, 10, 5, 5, 10, 5])
    # one buffer idle at 1 and at 4 (readers at 2-3 and 5): both stretches must be freed
    s1 = Option("a", "swap", 1, 1, 5, 0.1, ("r2", "r3", "r5"), "t1")
    s2 = Option("a", "swap", 4, 4, 5, 0.1, ("r5",), "t4")
    sol = solve([s1, s2], live, 6)
    assert sol.feasible and set(sol.chosen) == {s1, s2}
    swaps, recomputes = decisions(sol.chosen)
    assert recomputes == () and len(swaps) == 1
    assert [(g.consumers, g.trigger) for g in swaps[0].swap_ins] == [
        (("r2", "r3"), "t1"), (("r5",), "t4")]
    # a recomputation frees the buffer once: with a swap of its other stretch, it is not
    # enough
    r2 = Option("a", "recompute", 4, 4, 5, 0.1, ("r5",), "t4", ("p",))
    assert not solve([s1, r2], live, 6).feasible
    # two options of one stretch exclude each other
    assert not solve([s1, Option("a", "swap", 1, 1, 5, 0.2, ("r2",), "t0")], live, 6).feasible


def test_a_recomputation_reads_its_input_before_any_of_its_swaps():
    live = np.array([0, 9, 9, 0, 9])
    # "a" swapped at 1 and back by 2; the clones of "k" run at 3 and read the original
    # "a", so the swap would free nothing
    swap_a = _option("a", 1, 1, 6, 0.1)
    rec = Option("k", "recompute", 2, 2, 6, 0.1, ("c",), "t", ("k0",), ("a",))
    assert not solve([swap_a, rec], live[:4], 4).feasible
    assert solve([swap_a, replace(rec, keeps=())], live[:4], 4).feasible
    # a swap after the clones have run is fine
    late = _option("a", 4, 4, 6, 0.1)
    assert set(solve([late, rec], np.array([0, 0, 9, 0, 9]), 4).chosen) == {late, rec}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 8), st.integers(0, 3),
                          st.integers(1, 6), st.booleans()), min_size=1, max_size=8),
       st.lists(st.integers(0, 20), min_size=9, max_size=9), st.integers(0, 12))
# options of one tensor that free different bytes: the proof must count the most of them
@example(raw=[(0, 1, 0, 1, False), (0, 1, 2, 2, False), (0, 1, 0, 1, False)],
         live=[0, 0, 0, 13, 0, 0, 0, 0, 0], budget=11)
def test_the_quick_infeasibility_proof_agrees_with_highs(raw, live, budget):
    opts = [Option(f"t{k}", "swap" if swap else "recompute", lo, min(8, lo + span), nbytes,
                   0.1, ("c",), "t", ()) for k, lo, span, nbytes, swap in raw]
    live = np.array(live)
    short = planners._uncovered(opts, live, budget)
    quick = planners._uncovered
    try:  # HiGHS alone, without the quick proof
        planners._uncovered = lambda *a: -1
        full = solve(opts, live, budget)
    finally:
        planners._uncovered = quick
    if short >= 0:
        assert not full.feasible
    assert solve(opts, live, budget).feasible == full.feasible


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.sampled_from([0, 3, 6]), st.integers(1, 2),
                          st.integers(1, 9), st.booleans(), st.integers(1, 9)),
                min_size=1, max_size=8),
       st.lists(st.integers(0, 20), min_size=9, max_size=9), st.integers(0, 12))
# one buffer over two stretches: two recomputations, a recomputation and a swap, two swaps
@example(raw=[(0, 0, 1, 9, False, 1), (0, 3, 1, 9, False, 1)],
         live=[10, 10, 0, 10, 10, 0, 0, 0, 0], budget=5)
@example(raw=[(0, 0, 1, 9, False, 1), (0, 3, 1, 9, True, 1)],
         live=[10, 10, 0, 10, 10, 0, 0, 0, 0], budget=5)
@example(raw=[(0, 0, 1, 9, True, 1), (0, 3, 1, 9, True, 1), (1, 3, 1, 9, False, 3)],
         live=[10, 10, 0, 10, 10, 0, 0, 0, 0], budget=5)
def test_the_milp_optimum_is_the_best_choice_of_compatible_options(raw, live, budget):
    # options of two buffers, over idle stretches starting at 0, 3 or 6: two options of
    # one buffer go together only over different stretches and when both are swaps
    opts = [Option(f"t{k}", "swap" if swap else "recompute", lo, lo + span, nbytes,
                   cost / 10, ("c",), "t", (), (), f"buf{b}")
            for k, (b, lo, span, nbytes, swap, cost) in enumerate(raw)]
    live = np.array(live)

    def compatible(a, b):
        return a.buffer != b.buffer or (a.lo != b.lo and a.kind == b.kind == "swap")

    best = None
    for mask in range(2 ** len(opts)):  # every choice of options
        chosen = [o for k, o in enumerate(opts) if mask >> k & 1]
        if not all(compatible(a, b) for j, a in enumerate(chosen) for b in chosen[j + 1:]):
            continue
        freed = np.zeros(len(live), dtype=np.int64)
        for o in chosen:
            freed[o.lo:o.hi + 1] += o.bytes
        if (live - freed).max() <= budget:
            cost = sum(o.seconds for o in chosen)
            best = cost if best is None else min(best, cost)
    sol = solve(opts, live, budget)
    assert sol.feasible == (best is not None)
    if sol.feasible:
        assert all(compatible(a, b) for j, a in enumerate(sol.chosen)
                   for b in sol.chosen[j + 1:])
        assert sol.seconds == pytest.approx(best, abs=1e-9)


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


def test_highs_stopped_early_returns_its_feasible_choice(monkeypatch):
    # 400 options over 120 positions: HiGHS needs branching to prove its optimum; told that
    # any gap will do at once, it stops at its first choice, which must still cover the
    # budget everywhere and cannot beat the proven optimum
    rng = np.random.default_rng(0)
    n = 120
    live = rng.integers(50, 100, size=n) * 1000
    opts = []
    for k in range(400):
        lo = int(rng.integers(0, n - 5))
        hi = int(min(n - 1, lo + rng.integers(3, 40)))
        opts.append(Option(f"t{k}", "swap" if k % 2 else "recompute", lo, hi,
                           int(rng.integers(1, 30)) * 1000, float(rng.uniform(0.01, 1.0)),
                           ("c",), "t", (), (), f"buf{k}"))
    monkeypatch.setattr(planners, "PATIENT_SECONDS", 60.0)  # the optimum, however loaded
    best = solve(opts, live, 40_000)
    monkeypatch.setattr(planners, "PATIENT_SECONDS", 0.0)
    monkeypatch.setattr(planners, "GAP_PER_SECOND", 1e9)
    quick = solve(opts, live, 40_000)
    assert best.feasible and best.status == "Optimal"
    assert quick.feasible and quick.status == "Interrupted by user"
    freed = np.zeros(n, dtype=np.int64)
    for o in quick.chosen:
        freed[o.lo:o.hi + 1] += o.bytes
    assert (live - freed).max() <= 40_000
    assert quick.seconds >= best.seconds - 1e-9


def test_highs_finds_the_plan_it_once_called_infeasible():
    """The MILP of the zoo's EfficientNetB0 at batch 49,974 over PCIe 3 (memory-aware order,
    818 options): HiGHS 1.13-1.16 at their default feasibility tolerance call it infeasible
    in 0.08 s; a choice exists (11.38 s of swaps, found by HiGHS 1.12), so ``tune`` said
    the batch does not fit."""
    import pathlib

    from scipy.sparse import coo_array

    d = np.load(pathlib.Path(__file__).parent / "data" / "milp_efficientnet_b0_49974.npz")
    n = len(d["cost"])
    chain = coo_array((d["a_val"], (d["a_row"], d["a_col"])), shape=tuple(d["a_shape"]))
    pairs = coo_array((np.ones(len(d["b_row"])), (d["b_row"], d["b_col"])),
                      shape=tuple(d["b_shape"]))
    got = planners._highs(d["cost"], [(chain, 0.0, 0.0), (pairs, -np.inf, 1.0)], d["lower"],
                          d["upper"], int(d["n_int"]), 20.0)
    assert got.x is not None, got.message
    x = got.x.copy()
    x[:int(d["n_int"])] = np.round(x[:int(d["n_int"])])
    assert np.abs(chain @ x).max() < 1e-6 and (pairs @ x).max() <= 1 + 1e-9
    assert (x >= d["lower"] - 1e-9).all() and (x <= d["upper"] + 1e-9).all()
    assert d["cost"] @ x == pytest.approx(11381.44, rel=2e-3)
    assert n == x.size


def test_highs_answers_a_plan_its_heuristic_once_looped_on():
    """A small CNN's MILP at one batch of ``--max-batch`` (58 options): HiGHS 1.15's root
    reduced-cost heuristic looped for ever in the presolve of its sub-MIP, past the time
    limit (``--max-batch`` hung in 8 of 15 runs). Solved in a child process, so that a
    loop fails the test instead of hanging it."""
    import pathlib
    import subprocess
    import sys

    data = pathlib.Path(__file__).parent / "data" / "milp_presolve_loop.npz"
    code = f"""
import numpy as np
from scipy.sparse import coo_array
from lmscore import planners
d = np.load({str(data)!r})
chain = coo_array((d["a_val"], (d["a_row"], d["a_col"])), shape=tuple(d["a_shape"]))
pairs = coo_array((np.ones(len(d["b_row"])), (d["b_row"], d["b_col"])),
                  shape=tuple(d["b_shape"]))
got = planners._highs(d["cost"], [(chain, 0.0, 0.0), (pairs, -np.inf, 1.0)], d["lower"],
                      d["upper"], int(d["n_int"]), 20.0)
print(got.message, got.x is not None)
"""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except subprocess.TimeoutExpired:
        pytest.fail("HiGHS did not answer within 60 s (its time limit is 20 s)")
    assert out.split() == ["Optimal", "True"]
