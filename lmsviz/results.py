"""The analysis a session's view needs, computed by lmscore and cached on the server.

:class:`Base` is the original graph at one batch size (sizes, simulation, the ordering
view's columns), :class:`After` a plan's evaluation (:func:`lmscore.evaluate.evaluate_plan`).
Both are immutable and shared, through :attr:`lmsviz.state.AppContext.results`, by every
session showing the same graph, batch and plan.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

import lmscore
from lmscore.evaluate import PlanEvaluation, evaluate_plan
from lmscore.memory import Buffer, Simulation, live_tensor
from lmscore.plan import Plan, check_plan, empty_plan, plan_from_json, recompute_refused
from lmscore.rewrite import Rewrite, rewrite
from lmscore.shapes import Sizes, resolve

from . import figures
from .state import AppContext, LoadedGraph, plan_text


@dataclass(frozen=True)
class Base:
    """The original graph at one batch size: sizes, simulation and the view's columns."""

    loaded: LoadedGraph
    batch: int
    workspace: str
    sizes: Sizes
    sim: Simulation
    ops: figures.OpTable
    positions: tuple[np.ndarray, np.ndarray]
    buffers: dict[str, tuple[int, int, int]]  # tensor -> (start level, end level, bytes)
    # hotspot rows by level, filled on demand (shared, like the rest, by every session)
    _live: dict[int, tuple[lmscore.LiveTensor, ...]] = field(
        default_factory=dict, repr=False, compare=False)
    _recompute: dict[tuple[str, int], str] = field(default_factory=dict, repr=False,
                                                   compare=False)
    _by_tensor: dict[str, Buffer] = field(default_factory=dict, repr=False, compare=False)
    _rows: dict[str, lmscore.LiveTensor] = field(default_factory=dict, repr=False,
                                                 compare=False)

    def live(self, level: int) -> tuple[lmscore.LiveTensor, ...]:
        """:func:`lmscore.hotspots` at ``level`` (remembered for up to 256 levels)."""
        rows = self._live.get(level)
        if rows is None:
            rows = lmscore.hotspots(self.loaded.graph, self.sim, level, sizes=self.sizes)
            if len(self._live) < 256:
                self._live[level] = rows
        return rows

    def row(self, tensor: str) -> lmscore.LiveTensor | None:
        """The hotspot row of the device buffer that holds ``tensor`` (remembered).

        One buffer's row (:func:`lmscore.memory.live_tensor`), not a whole level's: a
        plan's table names swapped tensors from dozens of levels.
        """
        if not self._by_tensor:
            self._by_tensor.update({t: b for b in self.sim.buffers if not b.host
                                    for t in (b.tensor, *b.views)})
        b = self._by_tensor.get(tensor)
        if b is None:
            return None
        row = self._rows.get(b.tensor)
        if row is None:
            row = self._rows[b.tensor] = live_tensor(self.loaded.graph, b, sizes=self.sizes)
        return row

    def recompute_refused(self, tensor: str, ahead: int = 1) -> str:
        """Why a hand edit would not recompute ``tensor`` ("" if it would).

        The answer is :func:`lmscore.plan.recompute_refused`, :func:`lmscore.plan.add_recompute`'s
        own (remembered for up to 4096 tensors).
        """
        key = (tensor, ahead)
        reason = self._recompute.get(key)
        if reason is None:
            reason = recompute_refused(self.loaded.graph, tensor, threshold=1, ahead=ahead)
            if len(self._recompute) < 4096:
                self._recompute[key] = reason
        return reason


@dataclass(frozen=True)
class After:
    """A plan as edited, and its evaluation (:func:`lmscore.evaluate.evaluate_plan`)."""

    plan: Plan
    evaluation: PlanEvaluation
    peak_level: int  # of the device curve on the original levels
    digest: str  # the plan's key in the caches (:func:`plan_digest` of its JSON)

    @property
    def rewrite(self) -> Rewrite:
        """The rewritten step."""
        return self.evaluation.rewrite

    @property
    def sim(self) -> Simulation:
        """The rewritten step's simulation."""
        return self.evaluation.after

    @property
    def device(self) -> tuple[int, ...]:
        """Device curve on the original levels."""
        return self.evaluation.device_curve

    @property
    def host(self) -> tuple[int, ...]:
        """Host curve on the original levels."""
        return self.evaluation.host_curve

    @property
    def swap_bytes(self) -> int:
        """Bytes moved to host memory."""
        return self.evaluation.swap_bytes


def base_of(
    app: AppContext, loaded: LoadedGraph, batch: int, workspace: str = "accelerator"
) -> Base:
    """Sizes, simulation and ordering-view columns of ``loaded`` at ``batch`` (cached).

    ``workspace`` is the simulator's kernel-workspace model (``"accelerator"`` or ``"cpu"``).
    """

    def compute() -> Base:
        graph = loaded.graph
        ordering = lmscore.order(graph)
        sizes = resolve(graph, batch)
        sim = lmscore.simulate(graph, batch, sizes=sizes, workspace=workspace)
        shapes = []
        nbytes = []
        for i, op in enumerate(graph.ops):
            parts = []
            for port, spec in enumerate(op.outputs):
                shape = sizes.shapes[i][port]
                dims = "?" if shape is None else "[" + ",".join(
                    "?" if d < 0 else str(d) for d in shape) + "]"
                parts.append(f"{dims} {spec.dtype}")
            shapes.append(", ".join(parts[:4]) + (" …" if len(parts) > 4 else "") or "no outputs")
            nbytes.append(sum(b for b in sizes.nbytes[i] if b > 0))
        table = figures.OpTable(
            names=[op.name for op in graph.ops], types=[op.type for op in graph.ops],
            levels=ordering.levels, categories=ordering.categories, shapes=shapes,
            nbytes=nbytes,
        )
        # kernel workspaces too: the table lists them, and a toggle of one must be refused
        # as such, not as an unknown tensor
        buffers = {t: (b.start, b.end, b.bytes) for b in sim.buffers
                   for t in (b.tensor, *b.views)}
        return Base(loaded, batch, workspace, sizes, sim, table,
                    figures.op_positions(ordering.levels, ordering.categories), buffers)

    return app.compute(("base", loaded.key, batch, workspace), compute,
                       f"simulating {loaded.name} at batch {batch}", len(loaded.graph.ops))


def plan_digest(plan_json: str | None) -> str:
    """SHA-256 of a plan's JSON text (how plans are keyed in caches and tuner verdicts)."""
    return hashlib.sha256((plan_json or "").encode()).hexdigest()


def plan_of(app: AppContext, loaded: LoadedGraph, plan_json: str | None) -> Plan:
    """The session's plan, parsed and checked against the graph (cached).

    Raises
    ------
    PlanError
        If the JSON is not a plan for this graph.
    """
    if not plan_json:
        return empty_plan(loaded.graph)
    digest = plan_digest(plan_json)

    def compute() -> Plan:
        plan = plan_from_json(plan_json)
        check_plan(loaded.graph, plan)
        return plan

    return app.compute(("plan", loaded.key, digest), compute, "checking the plan")


def after_of(app: AppContext, base: Base, plan: Plan, digest: str | None = None
             ) -> After | None:
    """The rewrite of ``plan`` and its simulation (cached); None for an empty plan.

    ``digest`` identifies the plan in the cache (default: the SHA-256 of its JSON).
    """
    if plan.changes_nothing():
        return None
    digest = digest or plan_digest(plan_text(plan))
    key = ("after", base.loaded.key, base.batch, base.workspace, digest)
    hit = app.results.get(key)
    if hit is not None:
        return hit
    # the rewrite does not depend on the batch size: a batch change only simulates again
    # (weight 1: the After holds the same graph and is weighed by its ops)
    rw = app.compute(("rewrite", base.loaded.key, digest),
                     lambda: rewrite(base.loaded.graph, plan), "rewriting the plan")

    def compute() -> After:
        ev = evaluate_plan(base.loaded.graph, plan, base.batch, workspace=base.workspace,
                           before=base.sim, sizes=base.sizes, rewritten=rw)
        return After(plan, ev, int(np.argmax(ev.device_curve)) if ev.device_curve else 0,
                     digest)

    return app.compute(key, compute, "simulating the plan", len(base.loaded.graph.ops))


def live_row(base: Base, tensor: str) -> lmscore.LiveTensor | None:
    """The hotspot row of ``tensor``'s buffer (its verdict on swapping).

    None unless ``tensor`` is the buffer's own tensor or the view a toggle would swap.
    """
    row = base.row(tensor)
    return row if row is not None and tensor in (row.tensor, row.swap_tensor) else None


def plan_label(plan: Plan, shown_at: int | None = None) -> str:
    """How many swaps and recomputes a plan makes and the batch it was made for.

    ``shown_at``: the batch the page shows it at, said when it is another.

    >>> plan_label(Plan("f"))
    'nothing swapped or recomputed'
    >>> plan_label(Plan("f", params={"batch_size": 32}), shown_at=16)
    'nothing swapped or recomputed, made for batch 32, shown at batch 16'
    """
    parts = []
    if plan.swaps:
        parts.append(f"{len(plan.swaps)} swapped")
    if plan.recomputes:
        parts.append(f"{len(plan.recomputes)} recomputed")
    text = ", ".join(parts) or "nothing swapped or recomputed"
    made = made_for(plan, shown_at)
    return f"{text}, {made}" if made else text


def made_for(plan: Plan, shown_at: int | None = None, only_other: bool = False) -> str:
    """The batch a plan was made for, and the one it is shown at when another.

    ``only_other``: nothing when it is shown at the batch it was made for.

    >>> made_for(Plan("f", params={"batch_size": 32}), 32, only_other=True)
    ''
    >>> made_for(Plan("f", params={"batch_size": 32}), 16, only_other=True)
    'made for batch 32, shown at batch 16'
    """
    made = (plan.params or {}).get("batch_size")
    if not isinstance(made, int) or made <= 0:
        return ""
    other = shown_at is not None and int(shown_at) != made
    if only_other and not other:
        return ""
    return f"made for batch {made}" + (f", shown at batch {shown_at}" if other else "")


def counted(n: int, word: str) -> str:
    """``n`` and ``word``, plural unless one.

    >>> counted(1, "tensor"), counted(3, "op")
    ('1 tensor', '3 ops')
    """
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
