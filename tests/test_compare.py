"""What a plan leaves on the device, plans side by side, batch sweeps, edges and search."""

from __future__ import annotations

import pytest
from graphs import long_edge, tiny_step
from test_recompute import chain

from lmscore.browse import Match, data_edges, find
from lmscore.compare import batch_sweep, compare_plans
from lmscore.errors import ConfigError
from lmscore.evaluate import (
    KEPT,
    RECOMPUTED,
    SWAP_IN,
    Resident,
    dominant_by_level,
    evaluate_plan,
)
from lmscore.memory import simulate
from lmscore.plan import Plan, Recompute, empty_plan, fingerprint, plan_from_params
from lmscore.shapes import resolve
from lmscore.tune import plan_seconds


def swapped_long_edge():
    g = long_edge()
    return g, evaluate_plan(g, plan_from_params(g, 1, threshold=3, ahead=2), 1)


def recomputed_chain():
    g = chain()
    plan = Plan(fingerprint(g), recomputes=(Recompute("b:0", ("a", "b"), ("f",), "d"),))
    return g, evaluate_plan(g, plan, 1)


def what(rows: tuple[Resident, ...]) -> list[tuple[str, int]]:
    return [(r.what, r.bytes) for r in rows]


def test_on_device_after_a_swap_level_by_level():
    _, ev = swapped_long_edge()
    # a:0 leaves after its near reader b; its swap-in comes back for f (level 6), drawn
    # from the trigger's level on; the feed x (32 B) is held by the caller, not listed
    assert [what(ev.on_device(level)) for level in range(8)] == [
        [],
        [("kept a:0", 4000), ("kept b:0", 32)],
        [("kept a:0", 4000), ("kept b:0", 32)],
        [("kept c:0", 4000), ("kept b:0", 32)],
        [("kept c:0", 4000), ("kept d:0", 32)],
        [("swap-in of a:0", 4000), ("kept e:0", 32)],
        [("swap-in of a:0", 4000), ("kept e:0", 32), ("kept f:0", 32)],
        [("kept f:0", 32), ("kept g:0", 32)],
    ]
    peak = ev.on_device()
    assert what(peak) == what(ev.on_device(6))
    assert (peak[0].kind, peak[0].of, peak[0].tensor) == (SWAP_IN, "a:0", "lms/swapin_a_0_0:0")
    assert ev.on_device(8) == () and ev.on_device(-1) == ()


@pytest.mark.parametrize("make", [swapped_long_edge, recomputed_chain])
def test_what_is_on_the_device_adds_up_to_the_drawn_curve(make):
    _, ev = make()
    fixed = ev.after.persistent_bytes + ev.after.input_bytes
    for level, drawn in enumerate(ev.device_curve):
        assert fixed + sum(r.bytes for r in ev.on_device(level)) == drawn, level
    assert fixed + sum(r.bytes for r in ev.on_device()) == ev.after.peak_bytes


def test_a_recomputed_tensor_is_named_as_the_original_it_replaces():
    _, ev = recomputed_chain()
    # b = tanh(a) runs in place: the clones' one buffer holds the recomputed b:0
    rows = ev.on_device(5)
    assert what(rows) == [("recomputed b:0", 4000), ("kept e:0", 32)]
    assert (rows[0].kind, rows[0].serves, rows[0].tensor) == (
        RECOMPUTED, "b:0", "lms/recompute_b_0/a:0")
    assert what(ev.on_device(4)) == [("kept c:0", 32), ("kept d:0", 32)]  # b:0 is gone
    assert rows[1].kind == KEPT


@pytest.mark.parametrize("make", [swapped_long_edge, recomputed_chain])
def test_dominant_is_the_largest_residents_of_every_level(make):
    _, ev = make()
    for k in (1, 2, 5):
        dom = ev.dominant(k)
        assert len(dom) == len(ev.device_curve)
        for level, top in enumerate(dom):
            full = ev.on_device(level)
            assert sorted(r.bytes for r in top) == sorted(r.bytes for r in full[:k])
            assert [r.bytes for r in top] == sorted((r.bytes for r in top), reverse=True)


def test_dominant_by_level_of_the_unplanned_step():
    g = long_edge()
    dom = dominant_by_level(g, simulate(g, 1), 1)
    assert [what(row) for row in dom] == [
        [], [("kept a:0", 4000)], [("kept a:0", 4000)], [("kept a:0", 4000)],
        [("kept a:0", 4000)], [("kept a:0", 4000)], [("kept a:0", 4000)], [("kept f:0", 32)],
    ]


def test_compare_plans_peaks_bytes_and_the_tuners_overhead():
    g = long_edge()
    early = plan_from_params(g, 1, threshold=3, ahead=2)  # swap-in triggered after d
    late = plan_from_params(g, 1, threshold=3, ahead=1)  # after e, right before f
    none, hidden, stalled = compare_plans(
        g, {"no plan": empty_plan(g), "early": early, "late": late}, 1, device_bytes=4096,
        link="pcie3", safety=1.0)  # (exact byte budgets: no margin)
    assert (none.name, none.peak_bytes, none.peak_level, none.swap_bytes) == (
        "no plan", 8064, 3, 0)
    assert (hidden.peak_bytes, hidden.peak_level, hidden.swap_bytes,
            hidden.host_peak_bytes) == (4096, 6, 4000, 4000)
    assert (none.fits, hidden.fits) == (False, True)
    assert hidden.device_curve == (32, 4064, 4064, 4064, 4064, 4064, 4096, 96)
    assert none.overhead == 0.0 and none.step_seconds == pytest.approx(none.base_seconds)
    # the tuner's model: the copy hides behind d and e, not behind e alone
    assert hidden.overhead == 0.0
    base, planned = plan_seconds(g, late, 1, link="pcie3")
    assert (stalled.base_seconds, stalled.step_seconds) == (base, planned)
    assert stalled.overhead == pytest.approx(planned / base - 1) and stalled.overhead > 0
    # a faster link moves the same bytes in less time
    (fast,) = compare_plans(g, {"late": late}, 1, link="nvlink2")
    assert 0 < fast.overhead < stalled.overhead and fast.fits is None


def test_compare_plans_counts_what_a_recompute_clones():
    g, ev = recomputed_chain()
    (rec,) = compare_plans(g, {"hand": ev.plan}, 1)
    assert (rec.recomputed_tensors, rec.cloned_ops, rec.recompute_bytes) == (1, 2, 4000)
    assert (rec.swapped_tensors, rec.swap_bytes, rec.peak_bytes) == (0, 0, 4096)
    assert rec.overhead > 0  # the clones' compute time


def test_batch_sweep_of_the_tiny_step():
    # (the budgets here are exact byte counts: safety 1.0, no margin)
    g = tiny_step()
    # transient memory grows by 24 bytes per sample and the feed by 16: 108, 132, ... B
    sw = batch_sweep(g, 200, safety=1.0)
    assert sw.batches == (1, 2, 3, 4, 5, 6, 8)
    assert sw.peak_bytes == (108, 132, 156, 188, 220, 252, 316)
    assert sw.max_without == 4  # 188 <= 200 < 220
    assert sw.bound >= sw.max_without and sw.plan_peak_bytes is None
    assert list(sw.step_seconds) == sorted(sw.step_seconds)
    assert batch_sweep(g, 107, safety=1.0, bound=False).max_without == 0
    fixed = batch_sweep(g, 200, safety=1.0, batches=[3, 1, 3], bound=False)
    assert (fixed.batches, fixed.peak_bytes, fixed.bound) == ((1, 3), (108, 156), 0)


def test_batch_sweep_evaluates_a_plan_at_every_batch():
    g = long_edge(-1)  # 4000 B a sample for a and c
    plan = plan_from_params(g, 1, threshold=3, ahead=2)
    sw = batch_sweep(g, 8192, safety=1.0, plan=plan, batches=[1, 2], bound=False)
    assert sw.peak_bytes == (8064, 16128) and sw.plan_peak_bytes == (4096, 8192)
    assert (sw.max_without, sw.max_with_plan) == (1, 2)


def test_batch_sweep_refuses_a_graph_whose_batch_is_fixed():
    # every batch would be the same step: the web app drew batches 1 to 65,536 at one peak
    with pytest.raises(ConfigError, match="batch dimension is fixed at 1"):
        batch_sweep(long_edge(), 4096, batches=[1, 2], bound=False)


def test_data_edges_with_sizes():
    g = tiny_step()
    e = data_edges(g, resolve(g, 2))
    assert len(e) == 18  # MatMul(x, x)-style duplicates would count once
    pairs = {(g.ops[s].name, g.ops[d].name): b for s, d, b in zip(
        e.src.tolist(), e.dst.tolist(), e.nbytes.tolist(), strict=True)}
    assert pairs[("x", "mm")] == 32 and pairs[("act", "g_relu")] == 16
    assert pairs[("r", "mm")] == 32
    assert ("apply", "out") not in pairs  # a control edge


def test_find_ranks_exact_then_prefix_then_contained():
    g = tiny_step()
    assert [m.name for m in find(g, "g_")] == ["g_w", "g_tile", "g_relu"]
    assert [m.name for m in find(g, " ACT ")] == ["act", "shape_act"]
    assert find(g, "act:0") == (Match("act:0", 7, 0),)
    assert find(g, "act:0").__getitem__(0).is_tensor
    assert find(g, "act:5") == ()  # no such output; and no name contains it
    assert find(g, "") == () and find(g, "zzz") == ()
    assert len(find(g, "a", limit=2)) == 2


def batched_long_edge():
    """long_edge with a batch dimension: a:0 and c:0 are 4000 B per sample."""
    return long_edge(-1)


def test_batch_sweep_counts_the_plans_host_memory():
    g = batched_long_edge()
    plan = plan_from_params(g, 1, threshold=3, ahead=2)  # a:0 to the host
    sw = batch_sweep(g, 9000, safety=1.0, plan=plan, batches=[1, 2, 3], bound=False,
                     host_bytes=1 << 30)
    assert sw.plan_host_bytes == (4000, 8000, 12000) and sw.host_bytes == 1 << 30
    assert sw.max_with_plan == 2  # batch 3: 12288 B on the device
    # host memory for one sample's swap only: the plan fits batch 1 alone
    sw = batch_sweep(g, 9000, safety=1.0, plan=plan, batches=[1, 2, 3], bound=False,
                     host_bytes=5000)
    assert sw.max_with_plan == 1 and sw.next_batch == 0 and sw.next_message == ""


def test_batch_sweep_asks_the_tuner_what_stops_the_next_batch():
    g = batched_long_edge()
    plan = plan_from_params(g, 1, threshold=3, ahead=2)
    kw = {"plan": plan, "batches": [1, 2, 3], "bound": False, "ask_tuner": True,
          "strategy": "swap", "safety": 1.0}
    seen = []
    # batch 3 fits the device with a:0 swapped (12288 B) but holds 12000 B on the host
    sw = batch_sweep(g, 12400, host_bytes=10_000, progress=lambda f, m: seen.append((f, m)),
                     **kw)
    assert (sw.max_with_plan, sw.next_batch, sw.next_limited_by) == (2, 3, "host")
    assert "host memory stops it" in sw.next_message
    assert seen[-1] == (1.0, "done") and any("batch 3" in m for _, m in seen)
    # with host memory to spare the plan fits batch 3, and the device stops batch 4
    sw = batch_sweep(g, 12400, host_bytes=1 << 30, **kw)
    assert (sw.max_with_plan, sw.next_batch, sw.next_limited_by) == (3, 4, "device")
    # a larger device: the tuner fits batch 4
    sw = batch_sweep(g, 17000, host_bytes=1 << 30, **kw)
    assert (sw.next_batch, sw.next_limited_by) == (4, "")
    assert sw.next_message.startswith("fits")
