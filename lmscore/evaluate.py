"""One evaluation of a plan: rewrite the step, simulate it before and after, compare.

Everything that needs to know what a plan does (``lms rewrite``, ``lms tune``'s check and
plot, the Grappler comparison, validation and the web app) asks :func:`evaluate_plan`, so
that there is one answer: the same rewrite, the same two simulations, the same curves on
the original graph's levels, and the one "fits" (:func:`lmscore.memory.fits`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from .ir import Graph, split_tensor
from .memory import Simulation, fits, simulate
from .order import order
from .plan import Plan
from .rewrite import Rewrite, rewrite
from .shapes import Sizes, extend_sizes


@dataclass(frozen=True)
class PlanEvaluation:
    """What a plan does to a step, as simulated.

    Attributes
    ----------
    rewrite : Rewrite
        The rewritten step (``rewrite.plan`` is the plan as applied: swaps whose edges
        would close a cycle are left out and listed in ``rewrite.skipped``).
    before, after : Simulation
        The step unmodified and rewritten (``after`` is ``before`` for a plan that
        changes nothing).
    swap_bytes : int
        Bytes the plan moves to host memory.
    graph : Graph
        The original step.
    """

    rewrite: Rewrite
    before: Simulation
    after: Simulation
    swap_bytes: int
    graph: Graph = field(repr=False, compare=False)

    @functools.cached_property
    def _curves(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        # drawn only for those who show them (the web app), not for every tuner check
        return project_to_original_levels(self.graph, self.rewrite, self.after)

    @property
    def device_curve(self) -> tuple[int, ...]:
        """``after``'s device curve over the original levels: :func:`project_to_original_levels`."""
        return self._curves[0]

    @property
    def host_curve(self) -> tuple[int, ...]:
        """``after``'s host curve over the original graph's levels."""
        return self._curves[1]

    @property
    def plan(self) -> Plan:
        """The plan as applied."""
        return self.rewrite.plan

    def fits(self, device_bytes: int, safety: float = 1.0,
             host_bytes: int | None = None) -> bool:
        """Whether the rewritten step fits a device of ``device_bytes``: :func:`fits`."""
        return fits(self.after, device_bytes, safety, host_bytes)


def evaluate_plan(
    graph: Graph,
    plan: Plan,
    batch_size: int,
    *,
    workspace: str = "accelerator",
    before: Simulation | None = None,
    sizes: Sizes | None = None,
) -> PlanEvaluation:
    """Rewrite ``graph`` by ``plan`` and simulate it before and after.

    Parameters
    ----------
    graph : Graph
        The original step.
    plan : Plan
    batch_size : int
    workspace : str, optional
        Kernel workspace model of both simulations (see :func:`lmscore.memory.simulate`).
    before : Simulation, optional
        The unmodified step's simulation at this batch size and workspace, if the caller
        has it already.
    sizes : Sizes, optional
        The original graph's resolved sizes at this batch size: the rewritten graph's are
        extended from them (its new ops are copies of existing tensors).

    Returns
    -------
    PlanEvaluation
    """
    if before is None:
        before = simulate(graph, batch_size, sizes=sizes, workspace=workspace)
    rw = rewrite(graph, plan)
    if rw.plan.changes_nothing():
        after = before  # the rewrite adds nothing
    else:
        after = simulate(rw.graph, batch_size, workspace=workspace,
                         sizes=extend_sizes(sizes, rw.graph) if sizes is not None else None)
    swap_bytes = sum(b.bytes for b in after.buffers if b.host)
    return PlanEvaluation(rw, before, after, swap_bytes, graph)


def project_to_original_levels(
    graph: Graph, rw: Rewrite, sim: Simulation
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Device and host curves of a rewritten graph, drawn over the original graph's levels.

    A rewrite moves ops to later levels, so its curves have their own x-axis. Each op of
    the original graph is placed at its original level with the memory of the level it
    runs at after the rewrite (the largest such value per original level); a swap-out
    counts at its producer's level, a swap-in and a recomputing clone at the level of the
    first consumer they serve.
    """
    lv0 = order(graph).levels
    lv1 = order(rw.graph).levels
    index0 = graph.index
    dev1 = np.asarray(sim.device_curve, dtype=np.int64)
    host1 = np.asarray(sim.host_curve, dtype=np.int64)
    new_level = np.empty(len(rw.graph.ops), dtype=np.int64)
    old_level = np.empty(len(rw.graph.ops), dtype=np.int64)
    consumers = rw.graph.adjacency.consumers
    recomputed_for = {r.tensor: r.consumers for r in rw.plan.recomputes}
    for j, op in enumerate(rw.graph.ops):
        new_level[j] = lv1[j]
        i = index0.get(op.name)
        if i is not None:
            old_level[j] = lv0[i]
            continue
        producer = index0[split_tensor(str(op.attrs.get("_lms_tensor", op.inputs[0])))[0]]
        if "_lms_clone_of" in op.attrs:  # a clone runs for the recomputed tensor's readers
            readers = [index0[c] for c in recomputed_for[str(op.attrs["_lms_tensor"])]]
            old_level[j] = min(lv0[c] for c in readers)
            continue
        readers = [index0[rw.graph.ops[c].name] for c in consumers.get((j, 0), ())
                   if rw.graph.ops[c].name in index0]
        old_level[j] = min((lv0[c] for c in readers), default=lv0[producer]) if (
            op.attrs.get("_lms_role") == "swap_in") else lv0[producer]
    n = len(order(graph).by_level)
    device = np.zeros(n, dtype=np.int64)
    host = np.zeros(n, dtype=np.int64)
    np.maximum.at(device, old_level, dev1[new_level])
    np.maximum.at(host, old_level, host1[new_level])
    return tuple(device.tolist()), tuple(host.tolist())
