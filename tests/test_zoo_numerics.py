"""Rewritten zoo steps compute bit for bit what the original steps compute, under Grappler.

The user's runtime (:func:`lmscore.swap`, a ``tf.function``) runs TensorFlow's default
Grappler, and oneDNN's layout pass on x86 CPUs, over the rewritten step. Both decide by the
graph's structure, so an edge the rewrite adds can change which kernels run and the last
bits of every result (measured before the fixes, 3 steps: a Conv3D U-Net 0.109, mixed
precision GELU 6e-4, transformers 7e-9). Each step here is traced in this process
(``zoo.graph``), planned from the TFLMS knobs, rewritten, exported for the emulated
accelerator and run three training steps next to the original with default Grappler
(``measure(..., grappler=True)``): losses and every variable must be equal (``np.
array_equal``) and finite. Both oneDNN settings hold (``TF_ENABLE_ONEDNN_OPTS=0`` and
``=1``); the kernels are whatever this process runs.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")
zoo = pytest.importorskip("zoo")

from lmscore.export import to_graphdef  # noqa: E402
from lmscore.measure import measure  # noqa: E402
from lmscore.plan import plan_from_params  # noqa: E402
from lmscore.rewrite import rewrite  # noqa: E402
from lmscore.validate import divergence, validate_plan  # noqa: E402

pytestmark = pytest.mark.tf

#: Each traces, plans and runs twice in 2-9 s on 2 cores (MobileNets and EfficientNet take
#: a minute or more each and are left to the slow memory tests).
MODELS = [
    "mlp_dropout", "bn_cnn", "unet2d", "unet3d", "transformer_encoder", "gpt_decoder",
    "gru_lstm", "stacked_lstm", "bigru_rnn", "mixed_precision_cnn", "fit_cnn",
    "fit_mixed_transformer", "stochastic_depth_cnn", "dilated_conv1d", "fit_two_heads",
    "huber_regression", "l2_clip_cnn",
]
STEPS = 3


def _run(data: bytes, batch: int):
    return measure(data, batch, steps=STEPS, devices=2, inter_op_threads=2, grappler=True)


def _assert_identical(before, after) -> None:
    assert before.finite and after.finite
    assert np.array_equal(before.losses, after.losses), (before.losses, after.losses)
    assert before.variables.keys() == after.variables.keys()
    worst = {
        name: float(np.max(np.abs(value.astype(np.float64) - after.variables[name])))
        for name, value in before.variables.items()
        if not np.array_equal(value, after.variables[name])
    }
    assert not worst, sorted(worst.items(), key=lambda kv: -kv[1])[:3]


@pytest.mark.parametrize("name", MODELS)
def test_rewritten_step_is_bit_identical_under_default_grappler(name):
    graph = zoo.graph(name)
    batch = zoo.BY_NAME[name].batch
    plan = plan_from_params(graph, batch, threshold=5, ahead=1)
    rw = rewrite(graph, plan)
    assert rw.plan.swaps and not rw.skipped
    # triggered swap-ins and release edges are what can disturb Grappler: there must be some
    assert len(rw.synchronous) < len(rw.swap_ins)
    exported = to_graphdef(rw.graph, mode="emulate")
    _assert_identical(_run(graph.graphdef, batch), _run(exported, batch))


def test_validate_plan_reports_grappler_numerics_and_no_divergence():
    graph = zoo.graph("bn_cnn")
    plan = plan_from_params(graph, 8, threshold=5, ahead=1)
    v = validate_plan(graph, plan, 8, runs=1)
    assert v.max_abs_diff == 0.0 and v.max_abs_diff_grappler == 0.0
    assert v.losses_grappler is not None and len(v.losses_grappler["rewritten"]) == 3
    assert not v.diverged and v.divergence == ""
    # Grappler's own effect on the original, the yardstick of the difference above
    assert 0.0 <= v.grappler_own_diff < 1e-3
    d = v.as_dict()
    assert d["max_abs_diff_grappler"] == 0.0 and d["diverged"] is False
    assert d["grappler_own_diff"] == v.grappler_own_diff


def test_divergence_is_named():
    assert divergence([1.1, 3.0e7, 2.0e15]) == (
        "the loss grew from 1.1 to 2e+15 in 3 steps (more than 100x)"
    )
    assert divergence([2.3, 2.2, 2.4]) == ""
    assert divergence([2.3, float("nan")]) != ""
    assert divergence([2.3, 2.2], finite=False) != ""
    assert divergence([0.0, 0.0]) == ""


def _recompute_everything(graph, threshold: int = 3):
    """Every forward tensor with a far reader that may be recomputed, by its producer."""
    from lmscore.errors import PlanError
    from lmscore.order import order
    from lmscore.plan import add_recompute, empty_plan, recompute_refusal

    ordering = order(graph)
    plan = empty_plan(graph)
    for i, op in enumerate(graph.ops):
        if recompute_refusal(graph, ordering, i):
            continue
        for port in range(len(op.outputs)):
            try:
                plan = add_recompute(graph, plan, f"{op.name}:{port}", threshold=threshold)
            except PlanError:
                continue  # no far reader, or no trigger
    return plan


@pytest.mark.parametrize("name", ["mlp_dropout", "bn_cnn", "transformer_encoder"])
def test_recomputed_step_is_bit_identical_under_default_grappler(name):
    """Clones, dropout masks included (a stateless op reading the same seed), compute the
    same bits as the originals."""
    graph = zoo.graph(name)
    batch = zoo.BY_NAME[name].batch
    plan = _recompute_everything(graph)
    rw = rewrite(graph, plan)
    assert len(plan.recomputes) >= 10 and rw.clones
    assert any(graph.op(r.tensor.rpartition(":")[0]).type.startswith("StatelessRandom")
               or "StatelessRandom" in " ".join(graph.op(o).type for o in r.ops)
               for r in plan.recomputes) or name == "bn_cnn"
    exported = to_graphdef(rw.graph, mode="emulate")
    _assert_identical(_run(graph.graphdef, batch), _run(exported, batch))
