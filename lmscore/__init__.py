"""lmscore: load, order, simulate and rewrite TensorFlow training steps for large model support.

The public API, importable without TensorFlow::

    graph = lmscore.load("step.pb")            # GraphDef, SavedModel dir or zip
    ordering = lmscore.order(graph)             # levels and categories
    sim = lmscore.simulate(graph, batch_size=64)
    lmscore.hotspots(graph, sim)                # tensors alive at the peak
"""

from .errors import ConfigError, GraphError, LmsError, PlanError, RunError
from .ir import Graph, Op, TensorSpec, lint
from .load import from_function, from_graphdef_bytes, from_keras, load
from .memory import Buffer, LiveTensor, Simulation, hotspots, live_at, simulate
from .order import CATEGORIES, Ordering, levels, order
from .shapes import Sizes, resolve

__all__ = [
    "CATEGORIES", "Buffer", "ConfigError", "Graph", "GraphError", "LiveTensor", "LmsError",
    "Op", "Ordering", "PlanError", "RunError", "Simulation", "Sizes", "TensorSpec",
    "from_function", "from_graphdef_bytes", "from_keras", "hotspots", "levels", "lint",
    "live_at", "load", "order", "resolve", "simulate",
]
__version__ = "0.1.0"
