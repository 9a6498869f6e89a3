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
from .memory import Buffer, Simulation, fits, simulate, workspace_reason
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
        return project_to_original_levels(self.graph, self.rewrite, self.after,
                                          self._original_levels)

    @functools.cached_property
    def _original_levels(self) -> tuple[np.ndarray, np.ndarray]:
        return original_levels(self.graph, self.rewrite)

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

    @functools.cached_property
    def level_positions(self) -> tuple[int, ...]:
        """For each original level, the rewritten step's schedule position drawn there.

        :attr:`device_curve` shows at an original level the largest device peak of the
        rewritten levels whose ops count there; this is that peak's position in
        ``after``'s schedule (-1 for a level no op counts at).
        """
        new_level, old_level = self._original_levels
        value = np.asarray(self.after.device_curve, dtype=np.int64)[new_level]
        order_ = np.lexsort((value, old_level))  # by level, the largest value last
        last = np.r_[np.flatnonzero(np.diff(old_level[order_])), len(order_) - 1]
        best = order_[last] if len(order_) else np.empty(0, dtype=np.int64)
        peak_pos = np.asarray(self.after.level_peak_position, dtype=np.int64)
        out = np.full(len(self.device_curve), -1, dtype=np.int64)
        out[old_level[best]] = peak_pos[new_level[best]]
        return tuple(out.tolist())

    def on_device(self, level: int | None = None) -> tuple[Resident, ...]:
        """What the rewritten step really holds on the device, largest first.

        Parameters
        ----------
        level : int, optional
            A level of the original graph (where :attr:`device_curve` draws it); default
            the rewritten step's peak.

        Returns
        -------
        tuple of Resident
            Swapped tensors are gone once swapped out; swap-ins and recomputed tensors are
            there while their readers need them. Persistent memory and feeds are not
            listed (``after.persistent_bytes``, ``after.input_bytes``).
        """
        if level is None:
            pos = self.after.peak_position
        elif 0 <= level < len(self.level_positions):
            pos = self.level_positions[level]
        else:
            return ()
        if pos < 0:
            return ()
        live = [b for b in self.after.buffers if _live_at_position(b, pos)]
        live.sort(key=lambda b: -b.bytes)
        return tuple(resident(self.rewrite.graph, b) for b in live)

    def dominant(self, k: int = 3) -> tuple[tuple[Resident, ...], ...]:
        """The ``k`` largest residents at each original level (:meth:`on_device`'s first ``k``)."""
        return top_residents(self.rewrite.graph, self.after, self.level_positions, k)


#: What a device buffer of a rewritten step is (:attr:`Resident.kind`).
KEPT, SWAP_IN, RECOMPUTED, WORKSPACE = "kept", "swap-in", "recomputed", "workspace"


@dataclass(frozen=True)
class Resident:
    """A buffer on the device, said in the original graph's terms.

    Attributes
    ----------
    tensor : str
        The buffer's tensor in the (rewritten) graph simulated.
    bytes : int
    kind : {"kept", "swap-in", "recomputed", "workspace"}
        An original tensor, a swap-in's copy, a recomputing clone's output, or memory that
        is no tensor of the graph (a kernel's workspace, a loop's results).
    of : str
        The original tensor it holds: the tensor itself when kept, the swapped tensor for a
        swap-in, the clone's original output when recomputed ("" for a workspace).
    serves : str
        For a clone: the recomputed tensor it is computed for (it may be an intermediate).
    held : str
        For a workspace: what it holds (:func:`lmscore.memory.workspace_reason`).
    """

    tensor: str
    bytes: int
    kind: str
    of: str
    serves: str = ""
    held: str = ""

    @property
    def what(self) -> str:
        """One phrase: ``"kept a:0"``, ``"swap-in of a:0"``, ``"recomputed a:0"``.

        >>> Resident("lms/swapin_a_0_0:0", 8, SWAP_IN, "a:0").what
        'swap-in of a:0'
        >>> Resident("lms/recompute_b_0/a:0", 8, RECOMPUTED, "a:0", "b:0").what
        'recomputed a:0 (for b:0)'
        """
        if self.kind == SWAP_IN:
            return f"swap-in of {self.of}"
        if self.kind == RECOMPUTED:
            return f"recomputed {self.of}" + (f" (for {self.serves})"
                                              if self.serves and self.serves != self.of else "")
        if self.kind == WORKSPACE:
            return self.tensor
        return f"kept {self.of}"


def _live_at_position(b: Buffer, pos: int) -> bool:
    """Whether a device buffer is allocated at schedule position ``pos`` (as :func:`live_at`)."""
    return not b.host and (b.first == pos if b.scratch else b.first <= pos <= b.last)


def resident(graph: Graph, b: Buffer) -> Resident:
    """A simulated buffer of ``graph`` (original or rewritten) as a :class:`Resident`."""
    name, port = split_tensor(b.tensor)
    i = graph.index.get(name)
    if b.scratch or i is None:
        return Resident(b.tensor, b.bytes, WORKSPACE, "", held=workspace_reason(b))
    attrs = graph.ops[i].attrs
    if attrs.get("_lms_role") == "swap_in":
        return Resident(b.tensor, b.bytes, SWAP_IN, str(attrs["_lms_tensor"]))
    if "_lms_clone_of" in attrs:
        serves = str(attrs.get("_lms_tensor", ""))
        of = f"{attrs['_lms_clone_of']}:{port}"
        for view in b.views:  # the recomputed tensor itself may be an in-place result
            vname, vport = split_tensor(view)
            j = graph.index.get(vname)
            if j is not None and f"{graph.ops[j].attrs.get('_lms_clone_of')}:{vport}" == serves:
                of = serves
        return Resident(b.tensor, b.bytes, RECOMPUTED, of, serves)
    return Resident(b.tensor, b.bytes, KEPT, b.tensor)


def top_residents(
    graph: Graph, sim: Simulation, positions: tuple[int, ...] | list[int], k: int = 3
) -> tuple[tuple[Resident, ...], ...]:
    """The ``k`` largest device buffers alive at each of ``positions``, largest first.

    One pass over the buffers from the largest down, filling every position that still has
    room, so the cost does not grow with ``positions x buffers``.

    Parameters
    ----------
    graph : Graph
        The graph ``sim`` simulated.
    sim : Simulation
    positions : sequence of int
        Schedule positions (``sim.level_peak_position`` for its own levels); -1 gives ().
    k : int

    Returns
    -------
    tuple of tuple of Resident
        One tuple per position.
    """
    pos = np.asarray(positions, dtype=np.int64)
    m = len(pos)
    picked = np.full((m, max(k, 0)), -1, dtype=np.int64)
    count = np.zeros(m, dtype=np.int64)
    count[pos < 0] = k
    by_pos = np.argsort(pos, kind="stable")
    sorted_pos = pos[by_pos]
    bufs = [b for b in sim.buffers if not b.host and b.bytes > 0]
    bufs.sort(key=lambda b: -b.bytes)
    full = int((count >= k).sum())
    # each buffer's range of positions, found for all of them at once
    firsts = np.fromiter((b.first for b in bufs), dtype=np.int64, count=len(bufs))
    lasts = np.fromiter((b.first if b.scratch else b.last for b in bufs), dtype=np.int64,
                        count=len(bufs))
    los = np.searchsorted(sorted_pos, firsts, "left").tolist()
    his = np.searchsorted(sorted_pos, lasts, "right").tolist()
    for n, (lo, hi) in enumerate(zip(los, his, strict=True)):
        if full >= m:
            break
        if lo >= hi:
            continue
        sel = by_pos[lo:hi]
        sel = sel[count[sel] < k]
        if len(sel):
            picked[sel, count[sel]] = n
            count[sel] += 1
            full += int((count[sel] >= k).sum())
    cache: dict[int, Resident] = {}

    def one(n: int) -> Resident:
        r = cache.get(n)
        if r is None:
            r = cache[n] = resident(graph, bufs[n])
        return r

    return tuple(tuple(one(int(n)) for n in row if n >= 0) for row in picked)


def dominant_by_level(graph: Graph, sim: Simulation, k: int = 3
                      ) -> tuple[tuple[Resident, ...], ...]:
    """The ``k`` largest device buffers at each level's peak of ``sim`` (a step of ``graph``).

    For the unmodified step; a plan's are :meth:`PlanEvaluation.dominant`.
    """
    return top_residents(graph, sim, sim.level_peak_position, k)


def evaluate_plan(
    graph: Graph,
    plan: Plan,
    batch_size: int,
    *,
    workspace: str = "accelerator",
    before: Simulation | None = None,
    sizes: Sizes | None = None,
    rewritten: Rewrite | None = None,
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
    rewritten : Rewrite, optional
        ``rewrite(graph, plan)`` if the caller has it already (it does not depend on the
        batch size or the workspace model).

    Returns
    -------
    PlanEvaluation
    """
    if before is None:
        before = simulate(graph, batch_size, sizes=sizes, workspace=workspace)
    rw = rewritten if rewritten is not None else rewrite(graph, plan)
    if rw.plan.changes_nothing():
        after = before  # the rewrite adds nothing
    else:
        after = simulate(rw.graph, batch_size, workspace=workspace,
                         sizes=extend_sizes(sizes, rw.graph) if sizes is not None else None)
    swap_bytes = sum(b.bytes for b in after.buffers if b.host)
    return PlanEvaluation(rw, before, after, swap_bytes, graph)


def project_to_original_levels(
    graph: Graph, rw: Rewrite, sim: Simulation,
    levels: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Device and host curves of a rewritten graph, drawn over the original graph's levels.

    A rewrite moves ops to later levels, so its curves have their own x-axis. Each op of
    the original graph is placed at its original level with the memory of the level it
    runs at after the rewrite (the largest such value per original level); a swap-out
    counts at its producer's level, a swap-in and a recomputing clone at the level of the
    first consumer they serve. ``levels``: :func:`original_levels` of ``graph`` and ``rw``,
    if the caller has them.
    """
    new_level, old_level = levels if levels is not None else original_levels(graph, rw)
    dev1 = np.asarray(sim.device_curve, dtype=np.int64)
    host1 = np.asarray(sim.host_curve, dtype=np.int64)
    n = len(order(graph).by_level)
    device = np.zeros(n, dtype=np.int64)
    host = np.zeros(n, dtype=np.int64)
    np.maximum.at(device, old_level, dev1[new_level])
    np.maximum.at(host, old_level, host1[new_level])
    return tuple(device.tolist()), tuple(host.tolist())


def original_levels(graph: Graph, rw: Rewrite) -> tuple[np.ndarray, np.ndarray]:
    """Each op of a rewritten graph: its level there, and where it counts on the original.

    An op of the original graph counts at its own level; a swap-out at its producer's, a
    swap-in and a recomputing clone at the level of the first consumer they serve (see
    :func:`project_to_original_levels`).

    Returns
    -------
    new_level, old_level : ndarray of int64
        Indexed like ``rw.graph.ops``.
    """
    lv0 = order(graph).levels
    ops1 = rw.graph.ops
    index0 = graph.index
    new_level = np.asarray(order(rw.graph).levels, dtype=np.int64)
    old_level = np.empty(len(ops1), dtype=np.int64)
    consumers = rw.graph.adjacency.consumers
    recomputed_for = {r.tensor: r.consumers for r in rw.plan.recomputes}
    # A rewrite keeps the original ops first, at their positions (Graph.derive): their
    # levels are copied at once and only the added ops are looked at one by one.
    start = 0
    n0 = len(graph.ops)
    if len(ops1) >= n0 and all(a is b or a.name == b.name
                               for a, b in zip(graph.ops, ops1, strict=False)):
        old_level[:n0] = lv0
        start = n0
    for j in range(start, len(ops1)):
        op = ops1[j]
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
    return new_level, old_level
