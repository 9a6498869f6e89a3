"""Grappler's memory optimizer as a baseline: decisions, plans and the sample graphs."""

from __future__ import annotations

import pytest
from graphs import tiny_step

import lmscore
from lmscore import samples
from lmscore.errors import ConfigError, RunError
from lmscore.grappler import (
    Decision,
    GrapplerResult,
    device_properties,
    grappler_baseline,
    parse_decisions,
    plan_from_decisions,
)
from lmscore.plan import Swap, SwapIn, check_plan
from lmscore.rewrite import rewrite
from lmscore.tune import DEVICES

LOG = """\
I0000 00:00:1.0    11 memory_optimizer.cc:1060] Not enough time to swap: skipping a/b
I0000 00:00:1.1    11 memory_optimizer.cc:1133] Will swap fanout g/ReluGrad:1 of tensor \
f/Relu:0 of size 51380224
I0000 00:00:1.2    11 memory_optimizer.cc:1133] Will swap fanout g/Conv2DBackpropFilter:0 \
of tensor f/Relu:0 of size 51380224
I0000 00:00:1.3    11 memory_optimizer.cc:1133] Will swap fanout g/ReluGrad:1 of tensor \
f/Relu:0 of size 51380224
I0000 00:00:1.4    11 memory_optimizer.cc:1133] Will swap fanout sgd/Sub:0 of tensor \
sgd/Mul:2 of size 37632
"""


def test_parse_decisions_keeps_order_and_drops_repeats():
    assert parse_decisions(LOG) == (
        Decision("g/ReluGrad", 1, "f/Relu:0", 51380224),
        Decision("g/Conv2DBackpropFilter", 0, "f/Relu:0", 51380224),
        Decision("sgd/Sub", 0, "sgd/Mul:2", 37632),
    )
    assert parse_decisions("nothing here") == ()


def test_plan_keeps_a_trigger_that_comes_after_the_producer():
    g = tiny_step()
    plan, skipped = plan_from_decisions(g, [Decision("g_relu", 1, "act:0", 16, "g_tile")], 2)
    assert skipped == ()
    assert plan.swaps == (Swap("act:0", (SwapIn(("g_relu",), "g_tile"),)),)
    check_plan(g, plan)
    assert rewrite(g, plan).swap_ins


def test_trigger_before_the_producer_makes_the_swap_in_synchronous():
    g = tiny_step()
    plan, _ = plan_from_decisions(g, [Decision("g_relu", 1, "act:0", 16, "r")], 2)
    assert plan.swaps[0].swap_ins[0].trigger is None
    assert plan.params["synchronous_swap_ins"] == 1


def test_one_swap_per_tensor_and_one_swap_in_per_consumer():
    g = tiny_step()
    ds = [Decision("g_relu", 1, "act:0"), Decision("shape_act", 0, "act:0"),
          Decision("g_relu", 1, "act:0")]
    plan, _ = plan_from_decisions(g, ds, 2)
    assert [s.tensor for s in plan.swaps] == ["act:0"]
    assert [si.consumers for si in plan.swaps[0].swap_ins] == [("shape_act",), ("g_relu",)]
    check_plan(g, plan)


def test_decisions_that_do_not_fit_the_graph_are_skipped():
    g = tiny_step()
    ds = [Decision("loss", 0, "mm:0"), Decision("g_relu", 1, "nope:0"),
          Decision("ghost", 0, "act:0")]
    plan, skipped = plan_from_decisions(g, ds, 2)
    assert plan.swaps == ()
    assert [reason for _, reason in skipped] == [
        "the consumer does not read the tensor", "the tensor is not in the graph",
        "the consumer is not in the graph",
    ]


def test_emulated_trigger_is_the_latest_fanin_that_leaves_time_for_the_copy():
    g = tiny_step()
    plan, _ = plan_from_decisions(g, [Decision("g_relu", 1, "act:0", 16)], 2,
                                  emulate_triggers=True)
    # g_tile finishes last among g_relu's other inputs; of its fanins, shape_act is last
    assert plan.swaps[0].swap_ins[0].trigger == "shape_act"
    huge, _ = plan_from_decisions(g, [Decision("g_relu", 1, "act:0", 10**15)], 2,
                                  emulate_triggers=True)
    assert huge.swaps[0].swap_ins[0].trigger is None


def test_virtual_gpu_runs_at_the_preset_speed():
    for dev in DEVICES.values():
        p = device_properties(dev, 123)
        flops = p["num_cores"] * p["frequency"] * 1e6 * 64 * 2
        assert flops == pytest.approx(dev.flops, rel=1e-3)
        assert p["bandwidth"] * 1e3 == pytest.approx(dev.bandwidth)
        assert p["memory_size"] == 123 and p["type"] == "GPU"


def test_arguments_and_graphs_without_graphdef_are_refused():
    g = tiny_step()
    with pytest.raises(ConfigError, match="budget"):
        grappler_baseline(g, 2, 0)
    with pytest.raises(ConfigError, match="device"):
        grappler_baseline(g, 2, 1000, device="Z80")
    with pytest.raises(RunError, match="no GraphDef"):
        grappler_baseline(g, 2, 1000)


# --- The sample graphs (TensorFlow in a subprocess) ---------------------------------------


@pytest.fixture(scope="module")
def mlp() -> tuple[lmscore.Simulation, GrapplerResult]:
    graph = lmscore.load(samples.sample_dir() / "mlp.pb")
    base = lmscore.simulate(graph, 256, workspace="none")
    budget = (base.persistent_bytes + base.peak_bytes) // 2
    return base, grappler_baseline(graph, 256, budget)


@pytest.fixture(scope="module")
def resnet50() -> tuple[lmscore.Graph, GrapplerResult]:
    graph = lmscore.load(samples.sample_dir() / "resnet50.pb")
    return graph, grappler_baseline(graph, 64, 4 * 2**30)


@pytest.mark.tf
def test_mlp_lives_too_short_for_grappler(mlp):
    base, r = mlp
    assert r.source == "log"
    assert (r.inserted_swaps, r.logged_decisions, r.swapped_tensors) == (0, 0, 0)
    assert r.plan.swaps == ()
    # its own estimate is over the budget: what stops it is the 1 ms lifetime rule
    assert r.grappler_peak_bytes > r.budget_bytes
    assert "1 ms" in r.note and "\n" not in r.note
    assert r.predicted_peak_bytes == base.peak_bytes == r.baseline_peak_bytes
    assert r.swap_bytes == 0 and r.predicted_overhead == 0.0 and not r.fits


@pytest.mark.tf
def test_resnet50_swaps_are_inserted_and_evaluated(resnet50):
    graph, r = resnet50
    assert r.source == "rewrite"
    assert 0 < r.inserted_swaps <= r.logged_decisions
    assert len(r.decisions) == r.inserted_swaps
    assert 0 < r.swapped_tensors == len(r.plan.swaps) <= r.inserted_swaps
    check_plan(graph, r.plan)
    assert r.plan.params["mode"] == "rewrite" and r.plan.params["swap_out_waiters"]
    swapped = {d.tensor for d in r.decisions}
    assert set(r.plan.swapped()) <= swapped
    assert r.swap_bytes > 0 and r.predicted_host_peak_bytes > 0
    assert r.predicted_peak_bytes < r.baseline_peak_bytes
    assert r.predicted_overhead >= 0.0
    assert r.grappler_peak_bytes > r.budget_bytes
    assert r.note.startswith("Grappler inserted") and "\n" not in r.note
