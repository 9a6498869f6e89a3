"""The auto-tuner: fits, does not fit, never claims a fit the simulator does not show."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from graphs import long_edge, t
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import dags

from lmscore.errors import ConfigError
from lmscore.ir import Graph, Op
from lmscore.memory import simulate
from lmscore.planners import options
from lmscore.rewrite import rewrite
from lmscore.shapes import resolve
from lmscore.tune import DEVICES, bound_batch, max_batch, op_seconds, tune
from lmscore.units import parse_bytes


def transient_after(graph, result, batch):
    sim = simulate(rewrite(graph, result.plan).graph, batch, workspace="none")
    return sim.peak_bytes - sim.persistent_bytes


def test_swaps_only_what_the_budget_needs():
    g = long_edge()  # unswapped transient peak 8032 B; swapping a:0 gives 4064 B
    r = tune(g, 1, 6000, safety=1.0)
    assert r.fits and r.budget_bytes == 6000
    assert [s.tensor for s in r.plan.swaps] == ["a:0"]
    assert r.predicted_peak_bytes == 4096 and transient_after(g, r, 1) <= 6000
    assert r.predicted_overhead >= 0 and r.swap_bytes == 4000


def test_fits_without_swapping():
    r = tune(long_edge(), 1, 10_000, safety=1.0)
    assert r.fits and r.plan.swaps == () and r.predicted_overhead == 0
    assert "fits without swapping" in r.message


def test_tune_leaves_the_garbage_collector_as_it_found_it():
    import gc

    assert gc.isenabled()
    assert tune(long_edge(), 1, 6000, safety=1.0).fits
    assert gc.isenabled()
    with pytest.raises(ConfigError):
        tune(long_edge(), 1, 6000, strategy="nope")
    assert gc.isenabled()
    gc.disable()
    try:
        tune(long_edge(), 1, 6000, safety=1.0)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_nothing_fits_names_the_bounding_op():
    # f reads e (32 B) and a (4000 B) and writes 32 B; with the 32 B feed: 4096 B.
    r = tune(long_edge(), 1, 3000, safety=1.0)
    assert not r.fits and r.plan.swaps == ()
    assert r.bound_op == "f" and r.min_peak_bytes == 4096
    assert "does not fit" in r.message and "'f'" in r.message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"device": "TPU"}, "unknown device"), ({"link": "wifi"}, "unknown link"),
     ({"strategy": "magic"}, "unknown strategy"), ({"safety": 0}, "safety")],
)
def test_bad_options(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        tune(long_edge(), 1, 6000, **kwargs)


def test_budget_units():
    assert parse_bytes("16GiB") == 16 * 2**30
    assert parse_bytes("800MiB") == 800 * 2**20
    with pytest.raises(ConfigError, match="not a size"):
        parse_bytes("lots")


@settings(max_examples=60, deadline=None)
@given(dags(known=True), st.integers(1, 3), st.floats(0.3, 1.2),
       st.sampled_from(["hybrid", "swap", "recompute", "knobs", "tflms"]))
def test_never_claims_a_fit_the_simulator_does_not_show(g, batch, scale, strategy):
    base = simulate(g, batch, workspace="none")
    budget = int(base.persistent_bytes + scale * (base.peak_bytes - base.persistent_bytes)) + 1
    r = tune(g, batch, budget, safety=1.0, strategy=strategy)
    if r.fits:
        assert transient_after(g, r, batch) <= r.budget_bytes
    else:
        assert r.message.startswith("does not fit")


def test_hybrid_beats_the_knobs_on_resnet():
    """Per tensor, swap or recompute: less predicted overhead than TFLMS at the same budget."""
    import lmscore
    from lmscore.samples import sample_dir

    g = lmscore.load(sample_dir() / "resnet50.pb")
    base = simulate(g, 64)
    device = int(base.persistent_bytes + base.input_bytes + 0.6 * base.transient_peak_bytes)
    hybrid = tune(g, 64, device)
    knobs = tune(g, 64, device, strategy="knobs")
    tflms = tune(g, 64, device, strategy="tflms")
    assert hybrid.fits and knobs.fits and tflms.fits
    assert hybrid.strategy == "hybrid" and hybrid.recomputed_tensors > 0
    assert hybrid.predicted_overhead <= knobs.predicted_overhead / 2
    assert transient_after(g, hybrid, 64) <= hybrid.budget_bytes


@pytest.mark.parametrize(("name", "batch"), [("resnet50", 128), ("bert", 128)])
def test_swap_is_never_slower_than_the_knobs(name, batch):
    """The swap planner's MILP costs each copy as if it had the link alone: over PCIe 3 its
    plans for these two moved less than the knobs' yet were predicted slower (84.6% against
    70.8%, 69.3% against 46.4%). Swap keeps the knobs' plan where that is faster."""
    import lmscore
    from lmscore.samples import sample_dir

    g = lmscore.load(sample_dir() / f"{name}.pb")
    budget = int(0.6 * simulate(g, batch).peak_bytes)
    swap = tune(g, batch, budget, strategy="swap", link="pcie3")
    knobs = tune(g, batch, budget, strategy="knobs", link="pcie3")
    assert swap.fits and knobs.fits and swap.strategy == "swap"
    assert swap.recomputed_tensors == 0
    assert swap.predicted_step_seconds <= knobs.predicted_step_seconds + 1e-9
    assert transient_after(g, swap, batch) <= swap.budget_bytes


def test_default_is_never_slower_than_tflms_on_resnet():
    import lmscore
    from lmscore.samples import sample_dir

    g = lmscore.load(sample_dir() / "resnet50.pb")
    ours = tune(g, 128, 8 * 2**30)
    tflms = tune(g, 128, 8 * 2**30, strategy="tflms")
    assert ours.fits and tflms.fits
    assert ours.predicted_step_seconds <= tflms.predicted_step_seconds + 1e-9
    assert transient_after(g, ours, 128) <= ours.budget_bytes
    secs = op_seconds(g, lmscore.resolve(g, 128), DEVICES["V100"])
    assert sum(secs) == pytest.approx(ours.baseline_step_seconds)


def test_max_batch_monotone_on_the_tiny_graph():
    g = long_edge()  # no batch dimension: every batch size costs the same
    without, with_rw = max_batch(g, 10_000, safety=1.0, limit=64)
    assert without == with_rw == 64


def test_max_batch_is_the_tuners_answer_and_the_bound_only_saves_tries():
    """Without rewriting, the largest batch whose step ``tune`` leaves unswapped; with the
    bound given, the same two batches, the bound tried first."""
    import lmscore
    from lmscore.samples import sample_dir

    g = lmscore.load(sample_dir() / "mlp.pb")
    budget = 2**26
    without, with_rw = max_batch(g, budget, link="nvlink2")
    for b, fits_plain in ((without, True), (without + 1, False)):
        r = tune(g, b, budget, strategy="tflms", link="nvlink2")
        assert (r.fits and not r.plan.swaps) == fits_plain
    assert tune(g, with_rw, budget, link="nvlink2").fits
    assert not tune(g, with_rw + 1, budget, link="nvlink2").fits
    bound, op = bound_batch(g, budget)
    tried: dict = {}
    assert max_batch(g, budget, link="nvlink2", bound=bound, tuned=tried) == (without, with_rw)
    assert max(tried, default=0) <= bound
    # two batches at a time, one in a forked process: the same batches, and what stops it
    forked: dict = {}
    assert max_batch(g, budget, link="nvlink2", bound=bound, tuned=forked,
                     workers=2) == (without, with_rw)
    assert with_rw == bound or not forked[with_rw + 1].fits
    assert max_batch(g, budget, rewrite_plans=False) == (without, without)


def test_tune_cli_json_contract(tmp_path):
    plan = tmp_path / "plan.json"
    r = subprocess.run(
        [sys.executable, "-m", "lmscore.cli", "tune", "mlp", "--budget", "64MiB",
         "--batch-size", "2048", "--json", "--max-batch", "--plan-out", str(plan)],
        capture_output=True, text=True,
    )
    assert r.returncode in (0, 1), r.stderr
    d = json.loads(r.stdout)
    for key in ("fits", "budget_bytes", "predicted_peak_bytes", "predicted_overhead",
                "swapped_tensors", "swap_bytes", "max_batch_without", "max_batch_with"):
        assert key in d
    assert d["max_batch_with"] >= d["max_batch_without"] > 0
    assert json.loads(plan.read_text())["version"] == 2
    bad = subprocess.run([sys.executable, "-m", "lmscore.cli", "tune", "mlp", "--budget", "x"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not a size" in bad.stderr


@pytest.mark.parametrize("strategy", ["hybrid", "swap", "knobs", "tflms"])
def test_host_memory_limit(strategy):
    g = long_edge()  # swapping a:0 (4000 B) fits 6000 B; recomputing it (x -> a) too
    r = tune(g, 1, 6000, safety=1.0, strategy=strategy, host_memory=4000)
    assert r.fits and r.host_limit_bytes == 4000 and r.predicted_host_peak_bytes == 4000
    assert "host 3.91 KiB of 3.91 KiB" in r.message
    r = tune(g, 1, 6000, safety=1.0, strategy=strategy, host_memory=3999)
    if strategy == "hybrid":  # the recomputation needs no host memory
        assert r.fits and r.plan.swaps == () and [x.tensor for x in r.plan.recomputes] == ["a:0"]
        assert r.predicted_host_peak_bytes == 0
    else:
        assert not r.fits and r.limited_by == "host"
        assert "host memory stops it" in r.message and "3.91 KiB on the host" in r.message


def test_a_candidate_the_host_stops_is_planned_for_the_device_only_to_say_so(monkeypatch):
    # hybrid fits long_edge by recomputing a:0; swapping it needs 4000 B of host memory
    import importlib

    tune_module = importlib.import_module("lmscore.tune")  # the package exports tune()

    calls: list[tuple] = []
    original = tune_module._per_tensor

    def spy(strategy, *args, **kwargs):
        calls.append(args)
        return original(strategy, *args, **kwargs)

    monkeypatch.setattr(tune_module, "_per_tensor", spy)
    assert tune(long_edge(), 1, 6000, safety=1.0, strategy="hybrid", host_memory=3999).fits
    args = calls[0]
    told = original("swap", *args)  # diagnosed: the device's own plan, and what stops it
    assert not told.fits and told.limited_by == "host" and told.plan.swaps
    quiet = original("swap", *args, diagnose=False)  # what hybrid asks with a fit in hand
    assert not quiet.fits and quiet.plan.swaps == () and quiet.plan.recomputes == ()


def test_host_memory_default_is_tensorflows(monkeypatch):
    monkeypatch.delenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", raising=False)
    assert tune(long_edge(), 1, 6000, safety=1.0).host_limit_bytes == 128 * 2**30
    monkeypatch.setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "1")
    assert tune(long_edge(), 1, 6000, safety=1.0).host_limit_bytes == 2**20
    monkeypatch.setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "lots")
    with pytest.raises(ConfigError, match="TF_GPU_HOST_MEM_LIMIT_IN_MB: expected a positive"):
        tune(long_edge(), 1, 6000)


def test_a_device_smaller_than_the_persistent_memory_says_so():
    from lmscore import load, samples

    g = load(samples.find("mlp"))
    r = tune(g, 32, 4 * 2**20)  # the MLP's variables and Adam's slots take 7.66 MiB
    assert not r.fits
    assert r.message == ("does not fit: its persistent memory alone (7.66 MiB: variables, "
                         "optimizer slots, constants) fills the 4.00 MiB device")


@pytest.mark.parametrize("name", ["mlp", "lstm", "bert", "resnet50"])
@pytest.mark.parametrize("batch", [1, 8])
def test_the_bound_never_exceeds_the_unplanned_peak(name, batch):
    # per tensor, views and in-place results counted twice: the MLP's optimizer IdentityN
    # bounded every plan at 16.1 MB, above the 13.4 MB the step itself peaks at
    from lmscore import load, samples

    g = load(samples.find(name))
    sim = simulate(g, batch)
    r = tune(g, batch, sim.worst_peak_bytes, safety=1.0)
    assert r.fits and r.min_peak_bytes <= sim.worst_peak_bytes


@pytest.mark.parametrize(("name", "batch", "verified"), [("resnet50", 706, 0), ("unet3d", 150, 1)])
def test_hybrid_verifies_the_knob_plan_only_when_it_could_win(monkeypatch, name, batch,
                                                              verified):
    """The knobs' plan is simulated in full only when the time model puts it ahead."""
    import importlib

    import lmscore
    from lmscore.samples import sample_dir

    tune_module = importlib.import_module("lmscore.tune")  # lmscore.tune is also the function
    g = lmscore.load(sample_dir() / f"{name}.pb")
    calls = []
    real = tune_module._verify
    monkeypatch.setattr(tune_module, "_verify", lambda *a: calls.append(1) or real(*a))
    hybrid = tune(g, batch, device="V100", link="nvlink2")
    assert len(calls) == verified
    monkeypatch.setattr(tune_module, "_verify", real)
    knobs = tune(g, batch, device="V100", link="nvlink2", strategy="knobs")
    assert hybrid.fits and knobs.fits
    assert hybrid.predicted_step_seconds <= knobs.predicted_step_seconds
    # unet3d at 150: the knobs' plan wins (6.7% against the per-tensor plan's more)
    assert (hybrid.knobs.get("threshold") is not None) == (verified == 1)


@pytest.mark.parametrize(("batch", "fraction"), [(32, 0.7), (128, 0.6)])
def test_hybrid_is_never_slower_than_its_own_kinds_of_option(batch, fraction):
    """Where swaps share a slow link, the MILP's plan costs more than it predicted.

    ResNet-50 on PCIe 3: the MILP costs each swap as if it had the link alone and mixes
    swaps in (10.4% predicted by the full evaluation at batch 128, 7.5% at 32); the
    recomputations alone cost 7.4% and 4.5%. Hybrid then weighs the one-kind plans too.
    """
    import lmscore
    from lmscore.memory import simulate
    from lmscore.samples import sample_dir

    g = lmscore.load(sample_dir() / "resnet50.pb")
    budget = int(simulate(g, batch).peak_bytes * fraction)
    results = {s: tune(g, batch, budget, device="V100", link="pcie3", strategy=s)
               for s in ("hybrid", "swap", "recompute")}
    assert results["hybrid"].fits and results["recompute"].fits
    assert results["hybrid"].predicted_step_seconds <= min(
        r.predicted_step_seconds for r in results.values() if r.fits)


def _read_four_times() -> Graph:
    """``a`` (4000 B) read by r1..r4, each after a stretch that allocates b_k (4000 B).

    The chain's values take 1 KiB each, so that every op counts as an allocation for the
    release hold (lmscore.memory.RELEASE_RACE_MIN_BYTES).
    """
    big, small, chain = t("float", 1, 1000), t("float", 1, 8), t("float", 1, 256)
    ops = [Op("x", "Placeholder", outputs=small),
           Op("a", "MatMul", inputs=("x:0", "x:0"), outputs=big)]
    prev = "x:0"
    for k in range(1, 5):
        ops += [Op(f"b{k}", "MatMul", inputs=(prev, "x:0"), outputs=big),
                Op(f"s{k}", "MatMul", inputs=(f"b{k}:0", "x:0"), outputs=chain),
                Op(f"t{k}", "MatMul", inputs=(f"s{k}:0", "x:0"), outputs=chain),
                Op(f"u{k}", "MatMul", inputs=(f"t{k}:0", "x:0"), outputs=chain),
                Op(f"r{k}", "MatMul", inputs=(f"u{k}:0", "a:0"), outputs=chain)]
        prev = f"r{k}:0"
    return Graph(tuple(ops), "read four times")


def test_a_buffer_idle_four_times_gets_options_over_all_four_when_three_do_not_cover(
        monkeypatch):
    g = _read_four_times()
    base = simulate(g, 1)
    assert base.peak_bytes == 32 + 4000 + 4000 + 1024  # x, a, b_k, the chain's value
    sizes = resolve(g, 1)
    seconds = op_seconds(g, sizes, DEVICES["V100"])
    spans = [(o.lo, o.hi) for o in options(g, sizes, base, seconds, 12e9, ("swap",))]
    assert spans == [(2, 5), (7, 10), (12, 15)]  # the three longest (a tie: the first)
    assert [(o.lo, o.hi) for o in options(g, sizes, base, seconds, 12e9, ("swap",),
                                          max_gaps=4)] == [*spans, (17, 20)]
    # on the emulated accelerator a swap frees its buffer after the next three allocations
    # (lmscore.memory.release_hold): every op here allocates
    assert [(o.lo, o.hi) for o in options(g, sizes, base, seconds, 12e9, ("swap",),
                                          hold=2)] == [(4, 5), (9, 10), (14, 15)]
    # widening with the stretches made already makes only the fourth, in the same order
    made: dict = {}
    narrow = options(g, sizes, base, seconds, 12e9, ("swap",), made=made)
    assert [(o.lo, o.hi) for o in narrow] == spans and len(made) == 3
    wide = options(g, sizes, base, seconds, 12e9, ("swap",), max_gaps=4, made=made)
    assert wide == options(g, sizes, base, seconds, 12e9, ("swap",), max_gaps=4)
    assert len(made) == 4 and wide[:3] == narrow
    # a must be off the device beside every b_k: one swap-out, a swap-in per stretch
    r = tune(g, 1, 6080, safety=1.0, strategy="swap", host_memory=10**9)
    assert r.fits and r.predicted_peak_bytes == 32 + 4000 + 1024 + 1024
    assert [(s.tensor, [(i.consumers, i.trigger) for i in s.swap_ins])
            for s in r.plan.swaps] == [
        ("a:0", [(("r1",), "u1"), (("r2",), "u2"), (("r3",), "u3"), (("r4",), "u4")])]
    monkeypatch.setattr(sys.modules["lmscore.tune"], "WIDE_GAPS", 3)  # none wider: no plan
    assert not tune(g, 1, 6080, safety=1.0, strategy="swap", host_memory=10**9).fits


def test_a_loops_run_ahead_is_no_part_of_its_bound():
    """How far a loop's early part runs ahead follows the schedule, which a plan changes:
    counted in the loop's working set, the LSTM's bound reached its unplanned peak (and a
    loop's bound passed a knob plan's own peak: the page said "fits" where ``tune`` said
    no plan could)."""
    from lmscore import load, samples

    g = load(samples.find("lstm"))
    sim = simulate(g, 16)
    assert any(b.ahead for b in sim.buffers)
    assert tune_module()._lower_bound(g, sim)[0] <= sim.peak_bytes


def tune_module():
    import importlib

    return importlib.import_module("lmscore.tune")  # lmscore.tune is also the function
