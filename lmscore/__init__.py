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

from .errors import ConfigError, GraphError, LmsError, PlanError, RunError
from .export import SwappedStep, save_rewritten_saved_model, swap, to_graphdef, write_graphdef
from .ir import Graph, Op, TensorSpec, lint
from .keras_fit import SwapFit, swap_fit
from .load import from_function, from_graphdef_bytes, from_keras, load
from .memory import Buffer, LiveTensor, Simulation, hotspots, live_at, simulate
from .order import CATEGORIES, Ordering, levels, order
from .plan import Plan, Swap, SwapIn, check_plan, load_plan, plan_from_params, save_plan
from .rewrite import Rewrite, rewrite
from .shapes import Sizes, resolve
from .tune import DEVICES, LINKS, TuneResult, max_batch, tune

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
