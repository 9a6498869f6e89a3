"""lmscore: load, order, simulate and rewrite TensorFlow training steps for large model support.

The public API, importable without TensorFlow::

    graph = lmscore.load("step.pb")            # GraphDef, SavedModel dir or zip
    ordering = lmscore.order(graph)             # levels and categories
    sim = lmscore.simulate(graph, batch_size=64)
    lmscore.hotspots(graph, sim)                # tensors alive at the peak
    plan = lmscore.plan_from_params(graph, 64, threshold=40, ahead=3)
    new = lmscore.rewrite(graph, plan).graph    # swap-outs, swap-ins, triggers
    best = lmscore.tune(graph, 512, 16 * 2**30)  # the fastest plan that fits
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

from .errors import ConfigError, GraphError, LmsError, PlanError, RunError
from .ir import Graph, Op, TensorSpec, lint
from .load import from_function, from_graphdef_bytes, from_keras, load
from .memory import Buffer, LiveTensor, Simulation, hotspots, live_at, simulate
from .order import CATEGORIES, Ordering, levels, order
from .shapes import Sizes, resolve

#: Names imported from their module on first use: planning, rewriting, tuning and export
#: pull in numpy and more (a tenth of a second), which ``lms inspect`` never needs.
_LAZY = {
    "SwappedStep": "export", "save_rewritten_saved_model": "export", "swap": "export",
    "to_graphdef": "export", "write_graphdef": "export",
    "SwapFit": "keras_fit", "swap_fit": "keras_fit",
    "Plan": "plan", "Swap": "plan", "SwapIn": "plan", "check_plan": "plan",
    "load_plan": "plan", "plan_from_params": "plan", "save_plan": "plan",
    "Rewrite": "rewrite", "rewrite": "rewrite",
    "DEVICES": "tune", "LINKS": "tune", "TuneResult": "tune", "max_batch": "tune",
    "tune": "tune",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    setattr(sys.modules[__name__], name, value)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class _Package(types.ModuleType):
    """The package, whose functions keep the names of the modules they live in.

    Importing a submodule binds it on its package; ``lmscore.tune`` and ``lmscore.rewrite``
    (like ``load`` and ``order``) are the functions, whichever is imported first.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _SHADOWED:
            value = getattr(value, name)
        super().__setattr__(name, value)


_SHADOWED = frozenset({"load", "order", "rewrite", "tune"})
sys.modules[__name__].__class__ = _Package

__all__ = [
    "CATEGORIES", "DEVICES", "LINKS", "Buffer", "ConfigError", "Graph", "GraphError",
    "LiveTensor", "LmsError", "Op", "Ordering", "Plan", "PlanError", "Rewrite", "RunError",
    "Simulation", "Sizes", "Swap", "SwapFit", "SwapIn", "SwappedStep", "TensorSpec", "TuneResult",
    "check_plan", "from_function", "from_graphdef_bytes", "from_keras", "hotspots", "levels",
    "lint", "live_at", "load", "load_plan", "max_batch", "order", "plan_from_params",
    "resolve", "rewrite", "save_plan", "save_rewritten_saved_model", "simulate", "swap",
    "swap_fit", "to_graphdef", "tune", "write_graphdef",
]
__version__ = "0.1.0"
