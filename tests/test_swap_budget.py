"""``lmscore.swap(step, budget=...)``: the tuner's plan for a device of that size, or a refusal.

The step is a small custom-loop Keras model (six convolutions and two dense layers, Adam)
at batch 64; the budget is its fixed memory plus 60% of its simulated transient peak, as
in ``tests/test_zoo_fits.py``.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest

from lmscore import export
from lmscore.errors import ConfigError, PlanError
from lmscore.memory import simulate
from lmscore.plan import plan_from_params

pytestmark = pytest.mark.tf

BATCH = 64


def _step():
    """A fresh step and its variables (same seed: two calls give the same initial weights)."""
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    from lmscore import tfgraph

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((32, 32, 3))]
        + [keras.layers.Conv2D(8, 3, activation="relu", padding="same") for _ in range(6)]
        + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(32, activation="relu"),
           keras.layers.Dense(10)])
    optimizer = keras.optimizers.Adam()
    specs = (tf.TensorSpec([BATCH, 32, 32, 3], name="x"),
             tf.TensorSpec([BATCH], tf.int32, name="y"))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = tfgraph.train_step_function(model, loss, optimizer, specs)
    return step, list(model.variables) + list(optimizer.variables)


def _data():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((BATCH, 32, 32, 3)).astype(np.float32),
            rng.integers(0, 10, BATCH).astype(np.int32))


def _budget(step) -> tuple[int, object]:
    """Fixed memory + 60% of the transient peak, and the unmodified step's simulation."""
    from lmscore.load import from_function

    base = simulate(from_function(step), BATCH)
    return int(base.persistent_bytes + base.input_bytes + 0.6 * base.transient_peak_bytes), base


def _train(step, variables, runs: int = 3):
    x, y = _data()
    losses = [float(step(x, y).numpy()) for _ in range(runs)]
    return losses, [v.numpy().copy() for v in variables]


def test_budget_plans_swaps_and_trains_like_the_original():
    original, vars_a = _step()
    step, vars_b = _step()
    budget, base = _budget(step)
    swapped = export.swap(step, budget=budget)
    (tuned,) = swapped.tuning
    assert tuned.fits and tuned.strategy == "hybrid"
    assert swapped.plan.swaps or swapped.plan.recomputes
    assert swapped.plan.pin_schedule
    assert tuned.baseline_peak_bytes == base.peak_bytes
    assert tuned.predicted_peak_bytes <= budget < base.peak_bytes
    # the summary says what was decided, in one line
    assert "\n" not in swapped.summary
    assert f"batch {BATCH}" in swapped.summary and "predicted overhead" in swapped.summary
    assert f"{len(swapped.plan.swaps)} tensors swapped" in swapped.summary
    # an unpinned copy of the same plan on the same variables: the swaps and
    # recomputations alone change nothing, whatever the kernels
    unpinned = export.swap(step, plan=replace(swapped.plan, pin_schedule=False))
    want_losses, want = _train(original, vars_a)
    got_losses, got = _train(swapped, vars_b)
    assert np.isfinite(want_losses).all()
    # bit-identical under either kernel library: oneDNN's own graph pass merges each
    # Conv2DBackpropFilter with its BiasAddGrad, and the pinned order chains the two as one
    # (no control edge between them, the same ones into both), so it still does
    assert got_losses == want_losses
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a, b)
    # the unpinned plan from the same state on: bit-identical under either kernel library
    for a, b in zip(vars_a, vars_b, strict=True):
        a.assign(b)
    want_losses, want = _train(original, vars_a)
    got_losses, got = _train(unpinned, vars_b)
    assert got_losses == want_losses
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a, b)


def test_budget_below_the_bound_refuses_naming_the_op():
    step, _variables = _step()  # the step references its variables weakly
    budget, base = _budget(step)
    with pytest.raises(export.NoFitError) as info:
        export.swap(step, budget=base.persistent_bytes + 1024)
    err = info.value
    assert isinstance(err, PlanError)
    assert "\n" not in str(err) and str(err).startswith("budget: ")
    assert err.result.bound_op and repr(err.result.bound_op) in str(err)
    assert err.result.min_peak_bytes > base.persistent_bytes + 1024


def test_no_budget_without_a_gpu_is_the_knob_plan(caplog):
    from lmscore.load import from_function

    step, _variables = _step()  # the step references its variables weakly
    with caplog.at_level(logging.INFO, logger="lmscore"):
        swapped = export.swap(step)
    want = plan_from_params(from_function(step), BATCH)
    assert swapped.plan.swapped() == want.swapped() and swapped.plan.swaps
    assert not swapped.plan.pin_schedule and not swapped.tuning
    assert "knob plan (threshold 5, ahead 1, groupby 5, sync_mode 0)" in swapped.summary
    assert [r.getMessage() for r in caplog.records if r.name == "lmscore"] == [swapped.summary]


def test_no_budget_with_a_gpu_tunes_for_its_memory(monkeypatch):
    """The device's memory as TensorFlow reports it stands in for the budget."""
    import tensorflow as tf

    assert export._accelerator_memory(tf, "/device:CPU:0") is None
    if not tf.config.list_logical_devices("GPU"):
        assert export._accelerator_memory(tf, "/device:GPU:0") is None
    step, _variables = _step()  # the step references its variables weakly
    budget, _ = _budget(step)
    monkeypatch.setattr(export, "_accelerator_memory", lambda tf, device: budget)
    swapped = export.swap(step, device="/device:GPU:0")
    assert swapped.tuning and swapped.tuning[0].device_memory_bytes == budget
    assert "(/device:GPU:0 memory)" in swapped.summary
    # knobs still mean the knob plan
    assert not export.swap(step, threshold=3).tuning


def test_budget_sizes_and_tune_options():
    step, _variables = _step()  # the step references its variables weakly
    roomy = export.swap(step, budget="8GiB", strategy="swap", preset="A100", link="nvlink2",
                        safety=0.8)
    assert roomy.tuning[0].device_memory_bytes == 8 * 2**30
    assert roomy.plan.changes_nothing() and "0 tensors swapped" in roomy.summary


@pytest.mark.parametrize("kwargs, match", [
    ({"budget": "lots"}, "budget: not a size"),
    ({"budget": 0}, "budget: must be positive"),
    ({"budget": True}, "budget: expected bytes"),
    ({"budget": "1GiB", "threshold": 3}, "threshold: a knob cannot be given with a budget"),
    ({"budget": "1GiB", "include_scopes": ["a/"]}, "include_scopes: a knob cannot"),
    ({"strategy": "swap"}, "strategy: a tuning option needs a budget"),
    ({"preset": "A100"}, "preset: a tuning option needs a budget"),
    ({"budget": "1GiB", "strategy": "fastest"}, "unknown strategy"),
    ({"budget": "1GiB", "preset": "TPU"}, "unknown device"),
])
def test_bad_arguments_are_one_line(kwargs, match):
    step, _variables = _step()  # the step references its variables weakly
    with pytest.raises(ConfigError, match=match) as info:
        export.swap(step, **kwargs)
    assert "\n" not in str(info.value)


def test_budget_with_a_plan_is_refused():
    step, _variables = _step()  # the step references its variables weakly
    plan = export.swap(step).plan
    with pytest.raises(ConfigError, match="budget: cannot be given with a plan"):
        export.swap(step, plan=plan, budget="1GiB")
    with pytest.raises(ConfigError, match="strategy: cannot be given with a plan"):
        export.swap(step, plan=plan, strategy="swap")
