"""Validation: the simulator's prediction next to what TensorFlow really allocates.

:func:`validate` runs the graph on the CPU (:func:`lmscore.measure.measure`, TensorFlow's
allocation records of one traced step) and simulates it at the same batch size. Two
figures are compared:

- the *step* peak: feeds plus the transient allocations of the step (activations,
  gradients, temporaries), i.e. what the simulator has to predict;
- the *device* peak: the step peak plus persistent memory (variables, optimizer state,
  constants), i.e. what must fit in the accelerator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .errors import RunError
from .ir import Graph
from .memory import simulate


@dataclass(frozen=True)
class Validation:
    """Measured and simulated peaks of one graph at one batch size.

    Attributes
    ----------
    batch_size : int
    simulated_peak_bytes, measured_peak_bytes : int
        Device peak (persistent + feeds + transient).
    ratio : float
        ``simulated_peak_bytes / measured_peak_bytes``.
    simulated_transient_peak_bytes, measured_transient_peak_bytes : int
        Step peak (feeds + transient), without persistent memory.
    transient_ratio : float
        Their ratio: the accuracy of the liveness model itself.
    simulated_persistent_bytes, measured_persistent_bytes : int
    simulated_peak_level : int
    losses : tuple of float
        The loss after each step.
    finite : bool
        Whether losses and variables stayed finite (a NaN run proves nothing).
    """

    batch_size: int
    simulated_peak_bytes: int
    measured_peak_bytes: int
    ratio: float
    simulated_transient_peak_bytes: int
    measured_transient_peak_bytes: int
    transient_ratio: float
    simulated_persistent_bytes: int
    measured_persistent_bytes: int
    simulated_peak_level: int
    losses: tuple[float, ...]
    finite: bool

    def as_dict(self) -> dict[str, Any]:
        """The ``lms validate --json`` object."""
        d = asdict(self)
        d["losses"] = list(self.losses)
        return d


def validate(graph: Graph, batch_size: int, *, steps: int = 2, seed: int = 0) -> Validation:
    """Run ``graph`` under TensorFlow and compare its measured peak with the simulation.

    Parameters
    ----------
    graph : Graph
        An imported training step (it keeps the GraphDef it came from).
    batch_size : int
    steps : int
        Steps to run; the last one is traced (the first warms up constants).
    seed : int
        Seed of the synthetic inputs and variable values.

    Returns
    -------
    Validation

    Raises
    ------
    RunError
        If TensorFlow cannot run the graph; the message says why.
    """
    if graph.graphdef is None:
        raise RunError(f"{graph.source}: no GraphDef to run (build the graph with lmscore.load)")
    from .measure import measure

    sim = simulate(graph, batch_size)
    m = measure(graph.graphdef, batch_size, steps=max(steps, 2), seed=seed)
    device = "CPU:0"
    measured_step = int(m.peak_bytes.get(device, 0))
    measured_persistent = int(m.persistent_bytes.get(device, 0))
    sim_step = sim.peak_bytes - sim.persistent_bytes
    measured_total = measured_step + measured_persistent
    return Validation(
        batch_size=batch_size,
        simulated_peak_bytes=sim.peak_bytes,
        measured_peak_bytes=measured_total,
        ratio=sim.peak_bytes / measured_total if measured_total else float("inf"),
        simulated_transient_peak_bytes=sim_step,
        measured_transient_peak_bytes=measured_step,
        transient_ratio=sim_step / measured_step if measured_step else float("inf"),
        simulated_persistent_bytes=sim.persistent_bytes,
        measured_persistent_bytes=measured_persistent,
        simulated_peak_level=sim.peak_level,
        losses=tuple(m.losses),
        finite=m.finite,
    )
