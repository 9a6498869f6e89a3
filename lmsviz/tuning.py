"""The auto-tune job: :func:`run_tune` is the body of the background callback."""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable
from typing import Any

from lmscore.errors import LmsError
from lmscore.units import parse_bytes

from .state import AppContext


def tuner_module() -> Any | None:
    """``lmscore.tune`` when it is installed, else None."""
    try:
        tune = importlib.import_module("lmscore.tune")
    except ImportError:
        return None
    return tune if callable(getattr(tune, "tune", None)) else None


def run_tune(app: AppContext, graph_ref: dict[str, Any], settings: dict[str, Any],
             progress: Callable[[float, str], None], tuner: Any | None = None) -> dict[str, Any]:
    """Run the auto-tuner for the session's graph, batch, budget and presets.

    Returns
    -------
    dict
        The result (plan JSON, fits, predictions, graph key and batch) or ``{"error": ...}``.
    """
    tuner = tuner if tuner is not None else tuner_module()
    if tuner is None:
        return {"error": "tuner unavailable (lmscore.tune is not installed yet)"}
    try:
        budget = parse_bytes(settings.get("budget") or "")
        loaded = app.resolve(graph_ref)
        batch = int(settings["batch"])
        last = [0.0, -1.0]

        def report(fraction: float, message: str) -> None:
            now = time.monotonic()
            if fraction >= 1 or now - last[0] > 0.25 or fraction - last[1] > 0.05:
                last[0], last[1] = now, fraction
                progress(float(fraction), str(message))

        kwargs: dict[str, Any] = {"device": settings.get("device", "V100"),
                                  "link": settings.get("link", "pcie3"), "progress": report}
        if "workspace" in inspect.signature(tuner.tune).parameters:
            kwargs["workspace"] = settings.get("workspace", "accelerator")
        with app.slots.slot("auto-tune"):
            res = tuner.tune(loaded.graph, batch, budget, **kwargs)
    except LmsError as e:
        return {"error": str(e)}
    return {
        "key": loaded.key, "batch": batch, "plan": res.plan.to_json(), "fits": bool(res.fits),
        "budget_bytes": int(res.budget_bytes), "predicted_peak_bytes":
        int(res.predicted_peak_bytes), "predicted_overhead": float(res.predicted_overhead),
        "swapped_tensors": int(res.swapped_tensors), "swap_bytes": int(res.swap_bytes),
        "message": str(res.message),
    }
