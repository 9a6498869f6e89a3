"""Measured against simulated device memory of one run, on the measured time axis.

When a rewritten step does not save what the simulation predicts, the question is which
buffers TensorFlow still held at its peak that the simulation had already freed, and when
the swap-outs and swap-ins really ran. :func:`compare` answers it from one
:class:`lmscore.measure.Measurement` and the :class:`lmscore.memory.Simulation` of the same
graph:

* the measured device curve comes from the allocation records, in microseconds;
* the simulated curve is replayed on the same axis: each op of the simulated schedule is
  placed at the time its kernel first allocated in the run, ops that allocate nothing
  between their neighbours (so the two curves share one axis, executor time);
* at the measured peak, the op that was running is mapped back to its schedule position,
  and every buffer alive there in the run is compared with the simulated lifetime of the
  buffer of the same tensor.

No TensorFlow here: the inputs are results of :mod:`lmscore.measure` and
:mod:`lmscore.memory`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .ir import Graph
from .memory import Buffer, Simulation
from .order import order

__all__ = ["Held", "SwapRun", "Timeline", "compare", "live_curve"]


@dataclass(frozen=True)
class Held:
    """A buffer alive at the measured peak.

    Attributes
    ----------
    node : str
        Op whose kernel allocated it.
    bytes : int
    alloc_us, free_us : int, int or None
        Its measured lifetime (``None``: still alive at the end of the step).
    simulated : str
        ``"alive"`` if the simulation holds it at the same point of the schedule,
        ``"freed"`` / ``"not yet allocated"`` if not, ``"unknown"`` for a buffer the
        simulation has no tensor for (a kernel's temporary).
    """

    node: str
    bytes: int
    alloc_us: int
    free_us: int | None
    simulated: str


@dataclass(frozen=True)
class SwapRun:
    """When one swap op ran: measured, and where the simulation put it.

    Attributes
    ----------
    node : str
    role : str
        ``"swap_out"`` or ``"swap_in"``.
    measured_us : int or None
        First allocation of its kernel in the run (``None``: no record).
    simulated_us : float
        Its schedule position, on the measured time axis.
    """

    node: str
    role: str
    measured_us: int | None
    simulated_us: float


@dataclass(frozen=True)
class Timeline:
    """Result of :func:`compare`.

    Attributes
    ----------
    measured : tuple of (int, int)
        ``(time_us, live_bytes)`` steps of the measured device curve.
    simulated : tuple of (float, int)
        ``(time_us, live_bytes)`` at each op of the simulated schedule.
    peak_us : int
        Time of the measured peak.
    peak_op : str
        The op running then (the last one to have allocated).
    measured_peak_bytes, simulated_peak_bytes : int
        Transient device peaks (fed inputs included, persistent memory excluded).
    held : tuple of Held
        Buffers alive at the measured peak, largest first.
    swaps : tuple of SwapRun
    """

    measured: tuple[tuple[int, int], ...]
    simulated: tuple[tuple[float, int], ...]
    peak_us: int
    peak_op: str
    measured_peak_bytes: int
    simulated_peak_bytes: int
    held: tuple[Held, ...]
    swaps: tuple[SwapRun, ...]

    @property
    def missed(self) -> tuple[Held, ...]:
        """Buffers held at the measured peak that the simulation had freed."""
        return tuple(h for h in self.held if h.simulated == "freed")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``missed`` included)."""
        d = asdict(self)
        d["missed"] = [asdict(h) for h in self.missed]
        return d


def compare(graph: Graph, sim: Simulation, measurement: Any, device: str = "CPU:0") -> Timeline:
    """Put the measured and the simulated device memory of ``graph`` on one time axis.

    Parameters
    ----------
    graph : Graph
        The graph that ran (a rewritten one, for a plan).
    sim : Simulation
        Its simulation, with the kernel workspace of the library that ran.
    measurement : lmscore.measure.Measurement
        One run of it.
    device : str
        The device whose memory is compared.

    Returns
    -------
    Timeline

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> from lmscore.ir import Graph, Op, TensorSpec
    >>> from lmscore.memory import simulate
    >>> f = (TensorSpec("float", (1, 256)),)
    >>> g = Graph((Op("x", "Placeholder", outputs=f), Op("a", "Exp", inputs=("x:0",), outputs=f),
    ...            Op("b", "MatMul", inputs=("a:0", "x:0"), outputs=f)))
    >>> rec = [NS(node="a", device="CPU:0", bytes=1024, alloc_us=10, free_us=30),
    ...        NS(node="b", device="CPU:0", bytes=1024, alloc_us=20, free_us=None)]
    >>> t = compare(g, simulate(g, 1), NS(allocations=rec))
    >>> t.measured, t.peak_op, [(h.node, h.simulated) for h in t.held]
    (((10, 1024), (20, 2048), (30, 1024)), 'b', [('a', 'alive'), ('b', 'alive')])
    """
    records = [a for a in measurement.allocations if a.device == device]
    measured, peak_us, peak_bytes = live_curve(records)
    first: dict[str, int] = {}
    for a in records:
        if a.alloc_us < first.get(a.node, 1 << 62):
            first[a.node] = a.alloc_us
    ordering = order(graph)
    schedule = ordering.schedule
    at = _times(graph, schedule, first)
    pos = ordering.position
    base = sim.peak_bytes - sim.transient_peak_bytes - sim.persistent_bytes
    simulated = _simulated_curve(sim, at, base)
    started = [n for n in first if first[n] <= peak_us and n in graph.index]
    peak_op = max(started, key=lambda n: (first[n], pos[graph.index[n]]), default="")
    p = pos[graph.index[peak_op]] if peak_op else 0
    owner = _owners(sim.buffers)
    held = []
    for a in sorted(records, key=lambda a: -a.bytes):
        if a.bytes <= 0 or not (a.alloc_us <= peak_us and (a.free_us is None
                                                         or a.free_us > peak_us)):
            continue  # (a negative record: a copied variable's old storage released)
        b = owner.get(a.node)
        if b is None:
            state = "unknown"
        elif b.first <= p <= b.last:
            state = "alive"
        else:
            state = "freed" if b.last < p else "not yet allocated"
        held.append(Held(a.node, a.bytes, a.alloc_us, a.free_us, state))
    ran: dict[str, int] = {}  # swap-outs run on the host: any device's records
    for a in measurement.allocations:
        if a.alloc_us < ran.get(a.node, 1 << 62):
            ran[a.node] = a.alloc_us
    swaps = tuple(
        SwapRun(op.name, str(op.attrs["_lms_role"]), ran.get(op.name), at[pos[i]])
        for i, op in enumerate(graph.ops) if op.attrs.get("_lms_role") in ("swap_out", "swap_in")
    )
    return Timeline(
        measured=tuple(measured),
        simulated=tuple(simulated),
        peak_us=peak_us,
        peak_op=peak_op,
        measured_peak_bytes=peak_bytes,
        simulated_peak_bytes=sim.transient_peak_bytes + base,
        held=tuple(held),
        swaps=tuple(sorted(swaps, key=lambda s: s.simulated_us)),
    )


def live_curve(records: Sequence[Any]) -> tuple[list[tuple[int, int]], int, int]:
    """Live bytes after each event of allocation ``records``; the peak and its time.

    Within one microsecond allocations come first, then releases (a negative ``bytes`` is
    one) and frees, which can only overestimate the peak. This is the one definition of a
    measured peak: :mod:`lmscore.measure` uses it per device.

    >>> from types import SimpleNamespace as NS
    >>> live_curve([NS(bytes=4, alloc_us=0, free_us=5), NS(bytes=2, alloc_us=5, free_us=None)])
    ([(0, 4), (5, 6), (5, 2)], 5, 6)
    """
    events = []
    for a in records:
        events.append((a.alloc_us, 0 if a.bytes > 0 else 1, a.bytes))
        if a.free_us is not None:
            events.append((a.free_us, 1, -a.bytes))
    events.sort()
    live = peak = 0
    peak_us = 0
    curve = []
    for t, _order, delta in events:
        live += delta
        curve.append((t, live))
        if live > peak:
            peak, peak_us = live, t
    return curve, peak_us, peak


def _times(graph: Graph, schedule: Sequence[int], first: dict[str, int]) -> list[float]:
    """A time for each schedule position, never decreasing.

    The measured start where the op allocated; interpolated between measured neighbours
    elsewhere.
    """
    known = [(k, float(first[graph.ops[i].name])) for k, i in enumerate(schedule)
             if graph.ops[i].name in first]
    n = len(schedule)
    if not known:
        return [float(k) for k in range(n)]
    at = [0.0] * n
    (k0, t0) = known[0]
    for k in range(k0 + 1):
        at[k] = t0
    for (ka, ta), (kb, tb) in zip(known, known[1:], strict=False):
        tb = max(tb, ta)
        for k in range(ka, kb + 1):
            at[k] = ta + (tb - ta) * (k - ka) / (kb - ka)
    kl, tl = known[-1]
    tl = max(tl, at[kl])
    for k in range(kl, n):
        at[k] = tl
    return at


def _simulated_curve(sim: Simulation, at: Sequence[float], base: int) -> list[tuple[float, int]]:
    """The simulated live device bytes at each schedule position, with its time."""
    n = len(at)
    delta = [0] * (n + 1)
    for b in sim.buffers:
        if b.host or b.scratch:
            continue
        delta[b.first] += b.bytes
        delta[b.last + 1] -= b.bytes
    live = base
    out = []
    for k in range(n):
        live += delta[k]
        out.append((at[k], live))
    return out


def _owners(buffers: Sequence[Buffer]) -> dict[str, Buffer]:
    """The simulated buffer of each producing op (and of ops whose outputs are views)."""
    owner: dict[str, Buffer] = {}
    for b in buffers:
        if b.host or b.scratch:
            continue
        for t in (b.tensor, *b.views):
            owner.setdefault(t.rpartition(":")[0], b)
    return owner


def figure(t: Timeline, title: str = "") -> Any:
    """The two device curves on the measured time axis, swaps marked, as a plotly figure.

    Swap-outs and swap-ins are marked where they really ran (measured) and where the
    simulation put them; hovering a point of the measured peak lists what was held there
    that the simulation had freed.
    """
    import plotly.graph_objects as go

    mib = 2**20
    fig = go.Figure()
    fig.add_scatter(x=[x for x, _ in t.measured], y=[y / mib for _, y in t.measured],
                    name="measured", line={"shape": "hv", "color": "#1f6feb"})
    fig.add_scatter(x=[x for x, _ in t.simulated], y=[y / mib for _, y in t.simulated],
                    name="simulated", line={"shape": "hv", "color": "#9aa5b1", "dash": "dot"})
    for role, color in (("swap_out", "#e3a008"), ("swap_in", "#16a34a")):
        runs = [s for s in t.swaps if s.role == role]
        ran = [s for s in runs if s.measured_us is not None]
        fig.add_scatter(x=[s.measured_us for s in ran], y=[0] * len(ran), mode="markers",
                        name=f"{role.replace('_', '-')}, measured", text=[s.node for s in ran],
                        marker={"symbol": "triangle-up", "color": color, "size": 9})
        fig.add_scatter(x=[s.simulated_us for s in runs], y=[0] * len(runs), mode="markers",
                        name=f"{role.replace('_', '-')}, simulated", text=[s.node for s in runs],
                        marker={"symbol": "triangle-up-open", "color": color, "size": 9})
    missed = "<br>".join(f"{h.bytes / mib:.2f} MiB {h.node}" for h in t.missed[:12])
    fig.add_scatter(x=[t.peak_us], y=[t.measured_peak_bytes / mib], mode="markers",
                    name="measured peak", marker={"color": "#d1242f", "size": 11},
                    hovertext=[f"running {t.peak_op}<br>held, simulated freed:<br>"
                               f"{missed or 'nothing'}"], hoverinfo="text")
    fig.update_layout(
        title=title, template="plotly_white", xaxis_title="time in the measured step (µs)",
        yaxis_title="device memory, transient (MiB)", hovermode="closest",
    )
    return fig
