""""Fits" is a measured promise: tuned plans of zoo steps, run on the emulated accelerator.

For each case the step is tuned (``lmscore.tune``, default safety, the kernel workspace of
this CPU, since the emulated accelerator is this CPU) to a device of ``B`` bytes: its fixed
memory plus 60% or 40% of its simulated transient peak. Every plan the tuner reports as
fitting is exported with real copies and run on the emulated accelerator (CPU:0 device,
CPU:1 host) three times: the largest measured device peak must be at most ``B``, the
measured saving at least 90% of the predicted one, and the losses and variables after
three steps identical to the unrewritten step's.

Tuned plans pin the simulated schedule, so each run measures the same peak. A case where
nothing fits proves nothing here, so the cases are chosen to fit, and the
module checks that most of them did (under either kernel library).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import zoo

from lmscore.export import to_graphdef
from lmscore.memory import cpu_kernel_library, simulate
from lmscore.rewrite import rewrite
from lmscore.tune import tune
from lmscore.validate import PlanValidation, validate_plan

pytestmark = pytest.mark.tf

def _tuned(name: str, batch: int, fraction: float, graph=None, **kwargs):
    """Tune zoo step ``name`` (or ``graph``) to a device of its fixed memory + ``fraction``
    of its simulated transient peak (this CPU's kernel workspace): graph, device, result."""
    g = zoo.graph(name) if graph is None else graph
    base = simulate(g, batch, workspace="cpu")
    device = int(base.persistent_bytes + base.input_bytes
                 + fraction * base.transient_peak_bytes)
    return g, device, tune(g, batch, device, workspace="cpu", **kwargs)


CASES = [
    ("transformer_encoder", 32, 0.6),
    ("transformer_encoder", 32, 0.4),
    # AdamW's weight decay copies the variables the forward pass still reads; the step
    # measures at most B since lmscore.measure adds the unrecorded release of the old buffers
    ("gpt_decoder", 4, 0.6),
    ("gpt_decoder", 4, 0.4),
    # (at 40% no plan fits since a swap counts as held through the next allocations of
    # 1 KiB or more on the emulated accelerator)
    ("unet2d", 4, 0.5),
    ("unet2d", 4, 0.6),
    ("stochastic_depth_cnn", 16, 0.6),
    ("stochastic_depth_cnn", 16, 0.4),
    # 25 s: under -m slow, to keep the default suite under 15 minutes on 2 cores
    pytest.param("mobilenet_v2", 64, 0.6, marks=pytest.mark.slow),
    ("fit_mixed_transformer", 4, 0.6),
    # tied embeddings: the logits' weight gradient (a batched product reading its first
    # operand transposed) takes oneDNN's operand copies; at 60% that op alone is over B
    ("tied_lm", 8, 0.8),
    # dilated convolutions: SpaceToBatchND's tensors have batch x dilation rows
    ("dilated_conv1d", 16, 0.5),
    # a gather's rows are its indices', a segment sum's its num_segments (unknown batch)
    ("graph_network", 64, 0.4),
]
#: Two tapes: each reads the other model's activations for gradients the step prunes,
#: which must not delay the release of a swapped tensor (1.25x B under CPU load). They fit
#: only under oneDNN's kernels (under Eigen one filter gradient's im2col buffer alone
#: exceeds B), so they are not among CASES, which must mostly fit under both libraries.
ONEDNN_CASES = [("gan", 16, 0.6), ("gan", 16, 0.4)]
#: Plans with recomputed tensors (the hybrid planner's per-tensor MILP, measured).
RECOMPUTE_CASES = [("mobilenet_v2", 64, 0.7, "hybrid"),
                   pytest.param("mobilenet_v2", 64, 0.8, "recompute", marks=pytest.mark.slow)]
_FITTED: list[str] = []


def _fits_where_it_runs(name: str, batch: int, fraction: float, graph=None, **kwargs) -> bool:
    """Tune, and run a plan that fits three times: False for an honest refusal."""
    g, device, result = _tuned(name, batch, fraction, graph, **kwargs)
    if not result.fits:
        # an honest refusal: no plan simulated under the budget (checked by the tuner's own
        # property tests); test_most_cases_fitted counts the fits, so no pass is vacuous
        assert result.message.startswith("does not fit")
        return False
    assert result.predicted_peak_bytes <= device
    # numerics under default Grappler are tests/test_zoo_numerics.py's; not run twice here
    v = validate_plan(g, result.plan, batch, runs=3, grappler=False)
    measured = v.measured_device_peak_bytes["rewritten"]
    assert v.finite
    assert measured <= device, (
        f"{name} at {fraction:.0%}: measured {measured} > B {device} "
        f"(runs {v.rewritten_runs}; held at the peak, simulated freed: "
        f"{[(h.node, h.bytes) for h in v.timeline.missed[:4]]})")
    if not math.isnan(v.saving_ratio):
        assert v.saving_ratio >= 0.9, f"{name}: saving ratio {v.saving_ratio:.3f}"
    _replays_within_5_percent(name, v)
    assert v.max_abs_diff == 0.0
    assert np.isfinite(v.losses["rewritten"]).all()
    return True


def _replays_within_5_percent(name: str, v: PlanValidation) -> None:
    """The memory model of the rewritten step, with each run's executor order replayed.

    A tuned plan pins the order of the device's kernels, so the prediction itself (the
    simulator's order) holds too. Judged on most runs, not all: once in about 50 runs of
    the GAN at 40%, beside other test runs, one run measured 5.2% over (still under B,
    which every run must stay under; not reproduced, likely a host copy, on its own
    thread, finishing late).
    """
    assert len(v.replayed_runs) == len(v.rewritten_runs)
    predicted = v.simulated_device_peak_bytes["rewritten"]
    close = [abs(replayed / measured - 1) <= 0.05 and abs(predicted / measured - 1) <= 0.05
             for measured, replayed in zip(v.rewritten_runs, v.replayed_runs, strict=True)]
    assert 2 * sum(close) > len(close), (name, v.rewritten_runs, v.replayed_runs, predicted)
    original = v.measured_device_peak_bytes["original"]
    assert abs(v.replayed_original_bytes / original - 1) <= 0.05, (
        name, original, v.replayed_original_bytes)


@pytest.mark.parametrize("name, batch, fraction", CASES)
def test_tuned_plan_fits_where_it_runs(name: str, batch: int, fraction: float) -> None:
    if _fits_where_it_runs(name, batch, fraction):
        _FITTED.append(f"{name}:{fraction}")


#: Every strategy's plans are promises too (hybrid's are CASES'): each of these measured
#: 0.917, 0.888, 0.944 and 0.731 of B under both kernel libraries, bit-identical.
STRATEGY_CASES = [("gpt_decoder", 4, 0.4, "tflms"),
                  ("transformer_encoder", 32, 0.4, "knobs"),
                  ("gpt_decoder", 4, 0.4, "swap"),
                  ("transformer_encoder", 32, 0.6, "recompute")]


@pytest.mark.parametrize("name, batch, fraction, strategy", STRATEGY_CASES)
def test_every_strategys_plan_fits_where_it_runs(name, batch, fraction, strategy) -> None:
    if not _fits_where_it_runs(name, batch, fraction, strategy=strategy):
        pytest.skip(f"{name} at {fraction:.0%}, {strategy}: no plan fits (an honest refusal)")


#: Bundled samples, at their own batch sizes (sample_graphs/samples.json). At 60% `tune`
#: refuses the MLP, the LSTM and VGG-16, and the 3-D U-Net under Eigen's kernels (their
#: im2col buffers); the others are measured with both kernel libraries. ResNet-50 (three
#: runs of a 9,208-op step, 47 s) and the 3-D U-Net (16 s) run with ``-m slow``, to keep
#: the default suite under 15 minutes on 2 cores.
SAMPLE_CASES = [("bert", 0.6), pytest.param("resnet50", 0.4, marks=pytest.mark.slow),
                pytest.param("unet3d", 0.6, marks=pytest.mark.slow)]


@pytest.mark.parametrize("sample, fraction", SAMPLE_CASES)
def test_tuned_plan_of_a_sample_fits_where_it_runs(sample: str, fraction: float) -> None:
    import lmscore
    from lmscore.samples import sample_dir, samples

    entry = next(s for s in samples() if s["name"] == sample)
    g = lmscore.load(sample_dir() / entry["file"])
    if not _fits_where_it_runs(sample, entry["batch_size"], fraction, g):
        pytest.skip(f"{sample} at {fraction:.0%}: no plan fits (an honest refusal)")


@pytest.mark.parametrize("name, batch, fraction", ONEDNN_CASES)
def test_two_tape_plan_fits_where_it_runs(name: str, batch: int, fraction: float) -> None:
    if not _fits_where_it_runs(name, batch, fraction):
        assert cpu_kernel_library() == "eigen", "no plan under oneDNN's kernels"
        pytest.skip("one filter gradient's im2col buffer alone exceeds B under Eigen")


@pytest.mark.parametrize("name, batch, fraction, strategy", RECOMPUTE_CASES)
def test_plan_with_recomputes_fits_where_it_runs(name, batch, fraction, strategy) -> None:
    g, device, result = _tuned(name, batch, fraction, strategy=strategy)
    if not result.fits and strategy == "recompute":
        # an honest refusal, as in test_tuned_plan_fits_where_it_runs (MobileNetV2 at 80%
        # fits with per-tensor recomputations under oneDNN's kernels; under Eigen's only
        # with sqrt(n) checkpointing, the fallback, which this test then measures)
        assert result.message.startswith("does not fit")
        return
    assert result.fits and result.recomputed_tensors > 0, result.message
    v = validate_plan(g, result.plan, batch, runs=3, grappler=False)
    assert v.recomputed_tensors == result.recomputed_tensors
    measured = v.measured_device_peak_bytes["rewritten"]
    assert measured <= device and v.saving_ratio >= 0.9
    _replays_within_5_percent(name, v)
    assert v.max_abs_diff == 0.0


#: Tuned plans of convolutions with biases, run the way ``lmscore.swap`` runs them: default
#: Grappler, and oneDNN's layout pass where oneDNN is on. That pass merges each filter
#: gradient with its bias gradient; when a pinned order ran the global norm's ``L2Loss``
#: of the bias gradient between the two and a swap-in for the filter gradient waited for
#: it, the merged kernel waited for itself and TensorFlow ended the step without a loss
#: ("Retval[0] does not have value", l2_clip_cnn at 60%; at 85% now: on the emulated
#: accelerator a swap frees its buffer only after the next allocations, which no plan
#: at 60-80% of this small CNN covers, lmscore.memory.release_hold).
#: (l2_clip_cnn fits only under oneDNN's kernels, so it is measured here, not in CASES,
#: which must mostly fit under both libraries.)
USER_RUNTIME_CASES = [
    # Open: with a swap held through three allocations, the plan at 85% also recomputes the
    # average pooling the next convolution's filter gradient reads; under oneDNN and
    # default Grappler the weights end 2e-8 apart after 3 steps (identical with Grappler
    # off, and without the recompute)
    pytest.param("l2_clip_cnn", 16, 0.85, marks=pytest.mark.xfail(
        strict=False, reason="a recomputed AvgPool under oneDNN and Grappler: 2e-8")),
    ("unet2d", 4, 0.5), ("dilated_conv1d", 16, 0.5)]


@pytest.mark.parametrize("name, batch, fraction", USER_RUNTIME_CASES)
def test_tuned_convnet_plan_is_bit_identical_under_the_users_runtime(name, batch, fraction):
    g, device, result = _tuned(name, batch, fraction)
    if not result.fits:
        assert result.message.startswith("does not fit")
        pytest.skip(result.message)  # Eigen's im2col buffers: see the cases above
    assert result.plan.pin_schedule and result.plan.swaps
    from test_zoo_numerics import _assert_identical, _run  # 3 steps, default Grappler

    exported = to_graphdef(rewrite(g, result.plan).graph, mode="emulate")
    _assert_identical(_run(g.graphdef, batch), _run(exported, batch))


def test_plan_in_a_memory_aware_order_fits_where_it_runs() -> None:
    """A plan that pins a memory-aware order of the ops (lmscore.schedule), measured.

    The message-passing graph network at 45% (both kernel libraries): no per-tensor plan
    fits in the executor's order, so the tuner plans again in a memory-aware one. (The
    2-D U-Net's swaps did so at 40% until swaps counted as held through the next two
    allocations of 1 KiB or more on the emulated accelerator; none fits there now. The
    graph network did so at 40% until they counted as held through three: at 40% no plan
    fits now.)
    """
    g, device, result = _tuned("graph_network", 64, 0.45)
    assert result.fits and result.plan.schedule, result.message
    v = validate_plan(g, result.plan, 64, runs=3, grappler=False)
    measured = v.measured_device_peak_bytes["rewritten"]
    assert measured <= device and v.saving_ratio >= 0.9, (measured, device, v.saving_ratio)
    assert v.max_abs_diff == 0.0


def test_a_swap_with_a_swap_in_per_idle_stretch_runs_as_simulated() -> None:
    """A tensor copied out once and in twice (lmscore.planners.decisions), measured.

    The GPT decoder at 35% (both kernel libraries): the per-tensor planner frees a tensor
    over two idle stretches, a swap-in for each. (The stochastic-depth CNN at 30%, then the
    graph network at 35%, did this until a swap's buffer counted as held through the next
    two allocations, then through the next two of 1 KiB or more, on the emulated
    accelerator; no plan covers those budgets now.)
    """
    g, device, result = _tuned("gpt_decoder", 4, 0.35)
    assert result.fits, result.message
    assert any(len(s.swap_ins) > 1 for s in result.plan.swaps)
    v = validate_plan(g, result.plan, 4, runs=3, grappler=False)
    measured = v.measured_device_peak_bytes["rewritten"]
    assert measured <= device and v.saving_ratio >= 0.9, (measured, device, v.saving_ratio)
    assert v.max_abs_diff == 0.0


def test_most_cases_fitted() -> None:
    """Run after the cases: at least half of them produced a plan that was measured."""
    ran = [c for c in CASES if not hasattr(c, "marks")]
    if not _FITTED:
        pytest.skip("run with the parametrized cases")
    assert len(_FITTED) >= len(ran) // 2, _FITTED
