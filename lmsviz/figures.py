"""Pure figure builders: results in, plotly figures out.

Nothing here loads, simulates or rewrites a graph. The callbacks extract plain arrays
from :mod:`lmscore` results (:class:`OpTable`, :class:`Curves`, :class:`SwapDraw`) and
these functions turn them into traces.

The studio figure has two rows that share one x-axis, the CTO level: the ordering (ops
as points, one lane per category, swap ops and rewired edges on top) and the memory
curves. Its traces sit at fixed positions (the ``T_*`` constants) so that a callback can
replace the ones a plan changes with a ``dash.Patch``. The selection (level line, rings
around a tensor's producer and consumers, its lifetime) is drawn with layout shapes, so
selecting something patches the layout only and the browser does not recompute the
thousands of ordering points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

#: Lanes of the ordering view, bottom to top; swap ops get a lane of their own.
CATEGORIES = ("input", "persistent", "forward", "backward", "update")
LANES = (*CATEGORIES, "swap")
SWAP_LANE = len(CATEGORIES)
LANE_COLORS = {
    "input": "#6b7280", "persistent": "#9ca3af", "forward": "#2563eb",
    "backward": "#dc2626", "update": "#16a34a", "swap": "#d97706",
}
#: Above this many ops the ordering view shows one point per (level bin, category).
MAX_POINTS = 20_000
MIB = 2**20

# Fixed trace positions of the studio figure.
T_SWAP_EDGES = len(CATEGORIES)
T_TRIGGER_EDGES = T_SWAP_EDGES + 1
T_SWAP_OPS = T_SWAP_EDGES + 2
T_BEFORE = T_SWAP_EDGES + 3
T_AFTER = T_SWAP_EDGES + 4
T_HOST = T_SWAP_EDGES + 5
T_BUDGET = T_SWAP_EDGES + 6
T_PEAKS = T_SWAP_EDGES + 7
N_TRACES = T_PEAKS + 1


@dataclass(frozen=True)
class OpTable:
    """Per-op columns of the ordering view (indexed like ``graph.ops``).

    Attributes
    ----------
    names, types : sequence of str
    levels : sequence of int
        CTO level of each op.
    categories : sequence of str
        One of :data:`CATEGORIES`.
    shapes : sequence of str
        Output shapes and dtypes as shown on hover (``"[8,112,112,64] float"``).
    nbytes : sequence of int
        Bytes of the op's outputs (unknown sizes count 0).
    """

    names: Sequence[str]
    types: Sequence[str]
    levels: Sequence[int]
    categories: Sequence[str]
    shapes: Sequence[str]
    nbytes: Sequence[int]

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class Curves:
    """Memory curves over the CTO levels of the original graph.

    Attributes
    ----------
    before : sequence of int
        Device bytes per level of the original graph.
    after : sequence of int, optional
        Device bytes per level with the plan applied (None without a plan).
    host : sequence of int, optional
        Host bytes per level with the plan applied.
    peak_before, peak_after : (int, int) or None
        ``(level, bytes)`` of each peak.
    budget : int, optional
        Device budget in bytes.
    """

    before: Sequence[int]
    after: Sequence[int] | None = None
    host: Sequence[int] | None = None
    peak_before: tuple[int, int] | None = None
    peak_after: tuple[int, int] | None = None
    budget: int | None = None


@dataclass(frozen=True)
class SwapDraw:
    """One swapped tensor as drawn: op indices of its producer, consumers and triggers.

    Attributes
    ----------
    tensor : str
    producer : int
    groups : tuple of (tuple of int, int or None)
        For each swap-in, the consumers it serves and its trigger (None: synchronous).
    """

    tensor: str
    producer: int
    groups: tuple[tuple[tuple[int, ...], int | None], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Highlight:
    """What to emphasise: a tensor's producer and consumers, a chosen op, a level.

    Attributes
    ----------
    producer : int, optional
    consumers : tuple of int
    op : int, optional
        An op clicked in the ordering view.
    level : int, optional
        The selected level (a vertical line across both rows).
    lifetime : (int, int, int) or None
        ``(first level, last level, bytes)`` of the selected tensor.
    tensor : str
        Its name (labels).
    """

    producer: int | None = None
    consumers: tuple[int, ...] = ()
    op: int | None = None
    level: int | None = None
    lifetime: tuple[int, int, int] | None = None
    tensor: str = ""


def format_mib(n: float) -> str:
    """Bytes as MiB or GiB text.

    >>> format_mib(3 * 2**20), format_mib(5 * 2**30)
    ('3.0 MiB', '5.00 GiB')
    """
    if abs(n) >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / MIB:.1f} MiB"


def op_positions(levels: Sequence[int], categories: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates of every op: x is its level, y its lane plus a spread within the lane.

    Ops of one level and category are spread evenly over 70% of the lane height, in
    source order, so a wide level shows as a tall column.

    >>> x, y = op_positions([0, 0, 1], ["input", "input", "forward"])
    >>> x.tolist(), [round(v, 3) for v in y.tolist()]
    ([0, 0, 1], [-0.175, 0.175, 2.0])
    """
    lv = np.asarray(levels, dtype=np.int64)
    lane = np.array([LANES.index(c) for c in categories], dtype=np.int64)
    n = len(lv)
    if n == 0:
        return lv.astype(np.float64), lane.astype(np.float64)
    key = lv * len(LANES) + lane
    order = np.lexsort((np.arange(n), key))  # by bucket, then source order
    sorted_key = key[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_key)) + 1]
    counts = np.diff(np.r_[starts, n])
    rank = np.arange(n) - np.repeat(starts, counts)
    size = np.repeat(counts, counts)
    offset = np.where(size > 1, (rank / np.maximum(size - 1, 1) - 0.5) * 0.35 * 2, 0.0)
    y = np.empty(n, dtype=np.float64)
    y[order] = lane[order] + offset
    return lv.astype(np.int64), y


def ordering_traces(
    ops: OpTable, positions: tuple[np.ndarray, np.ndarray], max_points: int = MAX_POINTS
) -> tuple[list[go.Scattergl], str]:
    """The lane traces of the ordering view and a note on what is shown.

    Parameters
    ----------
    ops : OpTable
    positions : (ndarray, ndarray)
        From :func:`op_positions`.
    max_points : int
        Above this many ops, points are aggregated per level bin and category (the note
        says so); below, every op is a point whose ``customdata`` is its index.

    Returns
    -------
    traces : list of go.Scattergl
        One per category, in :data:`CATEGORIES` order.
    note : str
        Empty when every op is drawn.
    """
    if len(ops) > max_points:
        return _aggregated_traces(ops, max_points)
    x, y = positions
    cats = np.asarray(ops.categories)
    traces = []
    for c in CATEGORIES:
        idx = np.flatnonzero(cats == c)
        text = [
            f"{ops.names[i]}<br>{ops.types[i]} · level {ops.levels[i]}<br>{ops.shapes[i]}"
            f"<br>{format_mib(ops.nbytes[i])}"
            for i in idx.tolist()
        ]
        traces.append(go.Scattergl(
            x=x[idx], y=y[idx], mode="markers", name=c,
            marker={"size": 5, "color": LANE_COLORS[c], "opacity": 0.75},
            text=text, customdata=idx, hovertemplate="%{text}<extra>%{fullData.name}</extra>",
            xaxis="x", yaxis="y", showlegend=False,
        ))
    return traces, ""


def _aggregated_traces(ops: OpTable, max_points: int) -> tuple[list[go.Scattergl], str]:
    """One point per (level bin, category): its op count, bytes and largest op."""
    lv = np.asarray(ops.levels, dtype=np.int64)
    lane = np.array([CATEGORIES.index(c) for c in ops.categories], dtype=np.int64)
    nbytes = np.asarray(ops.nbytes, dtype=np.float64)
    n_levels = int(lv.max()) + 1 if len(lv) else 1
    width = 1
    while (n_levels + width - 1) // width * len(CATEGORIES) > max_points:
        width += 1
    bins = lv // width
    key = bins * len(CATEGORIES) + lane
    uniq, inverse = np.unique(key, return_inverse=True)
    count = np.bincount(inverse)
    total = np.bincount(inverse, weights=nbytes)
    # the largest op of each bin: last of each group when sorted by (group, bytes)
    order = np.lexsort((nbytes, inverse))
    last = np.r_[np.flatnonzero(np.diff(inverse[order])), len(order) - 1]
    largest = order[last]
    traces = []
    peak = max(int(count.max()), 1)
    for k, c in enumerate(CATEGORIES):
        sel = np.flatnonzero(uniq % len(CATEGORIES) == k)
        b = uniq[sel] // len(CATEGORIES)
        text = [
            (f"levels {lo}–{lo + width - 1}" if width > 1 else f"level {lo}")
            + f" · {c}<br>{cnt} ops, {format_mib(tot)}<br>largest: {ops.names[j]} ({ops.types[j]})"
            for lo, cnt, tot, j in zip(
                (b * width).tolist(), count[sel].tolist(), total[sel].tolist(),
                largest[sel].tolist(), strict=True,
            )
        ]
        traces.append(go.Scattergl(
            x=b * width + (width - 1) / 2, y=np.full(len(sel), float(k)), mode="markers",
            name=c,
            # a vertical bar per bin, as tall as the bin is wide in ops (like the columns
            # of the unaggregated view)
            marker={"symbol": "line-ns-open", "size": 4 + 26 * np.sqrt(count[sel] / peak),
                    "color": LANE_COLORS[c], "line": {"width": 2, "color": LANE_COLORS[c]},
                    "opacity": 0.8},
            text=text, customdata=np.full(len(sel), -1),
            hovertemplate="%{text}<extra>%{fullData.name}</extra>", xaxis="x", yaxis="y",
            showlegend=False,
        ))
    shown = sum(len(t.x) for t in traces)
    per = f"{width} levels" if width > 1 else "level"
    note = (f"{len(ops):,} ops: too many to draw one by one; showing {shown:,} aggregated points "
            f"(one per {per} and category; hover for counts).")
    return traces, note


def _segments(pairs: list[tuple[float, float, float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Line segments as one polyline broken by NaN gaps (fast to validate and to send)."""
    if not pairs:
        return np.empty(0), np.empty(0)
    a = np.asarray(pairs, dtype=np.float64)
    nan = np.full(len(a), np.nan)
    xs = np.column_stack([a[:, 0], a[:, 2], nan]).ravel()
    ys = np.column_stack([a[:, 1], a[:, 3], nan]).ravel()
    return xs, ys


def overlay_traces(
    swaps: Sequence[SwapDraw], positions: tuple[np.ndarray, np.ndarray]
) -> list[go.Scattergl]:
    """Swap ops and rewired edges drawn over the ordering view.

    A swap-out sits in the swap lane at its producer's level, a swap-in at its trigger's
    level (one level after the producer when synchronous). Edges: producer -> swap-out
    -> swap-in -> each consumer it serves (solid), trigger ..> swap-in (dotted).

    Returns
    -------
    list of go.Scattergl
        Three traces: rewired edges, trigger edges, swap ops (in ``T_*`` order).
    """
    x, y = positions
    edges: list[tuple[float, float, float, float]] = []
    triggers: list[tuple[float, float, float, float]] = []
    mx: list[float] = []
    my: list[float] = []
    mtext: list[str] = []
    mdata: list[str] = []
    lane_y = float(SWAP_LANE)
    for s in swaps:
        px, py = float(x[s.producer]), float(y[s.producer])
        out_y = lane_y + 0.2
        edges.append((px, py, px, out_y))
        mx.append(px)
        my.append(out_y)
        mtext.append(f"swap-out of {s.tensor}<br>level {int(px)} (host)")
        mdata.append(s.tensor)
        for k, (consumers, trig) in enumerate(s.groups):
            ix = float(x[trig]) if trig is not None else px + 1
            in_y = lane_y - 0.2
            edges.append((px, out_y, ix, in_y))
            for c in consumers:
                edges.append((ix, in_y, float(x[c]), float(y[c])))
            if trig is not None:
                triggers.append((float(x[trig]), float(y[trig]), ix, in_y))
            mx.append(ix)
            my.append(in_y)
            how = f"trigger level {int(ix)}" if trig is not None else "synchronous"
            mtext.append(f"swap-in {k} of {s.tensor}<br>{how}, serves {len(consumers)} op(s)")
            mdata.append(s.tensor)
    ex, ey = _segments(edges)
    tx, ty = _segments(triggers)
    return [
        go.Scattergl(x=ex, y=ey, mode="lines", name="rewired edges", hoverinfo="skip",
                     line={"color": LANE_COLORS["swap"], "width": 1}, opacity=0.5,
                     xaxis="x", yaxis="y", showlegend=bool(edges)),
        go.Scattergl(x=tx, y=ty, mode="lines", name="triggers", hoverinfo="skip",
                     line={"color": "#7c3aed", "width": 1, "dash": "dot"}, opacity=0.6,
                     xaxis="x", yaxis="y", showlegend=bool(triggers)),
        go.Scattergl(x=mx, y=my, mode="markers", name="swap ops", text=mtext, customdata=mdata,
                     hovertemplate="%{text}<extra></extra>",
                     marker={"symbol": "diamond", "size": 8, "color": LANE_COLORS["swap"],
                             "line": {"width": 1, "color": "#7c2d12"}},
                     xaxis="x", yaxis="y", showlegend=bool(swaps)),
    ]


def memory_traces(curves: Curves) -> list[go.Scatter]:
    """The memory row: device before/after, host, budget line, peaks.

    Values are plotted in MiB.

    Returns
    -------
    list of go.Scatter
        Five traces in ``T_*`` order (empty traces where there is nothing to draw).
    """
    n = len(curves.before)

    def mib(v: Sequence[int]) -> np.ndarray:
        return np.asarray(v, dtype=np.float64) / MIB

    def line(values: Sequence[int] | None, name: str, color: str, dash: str = "solid",
             width: float = 1.5) -> go.Scatter:
        if values is None:
            return go.Scatter(x=[], y=[], name=name, xaxis="x2", yaxis="y2", showlegend=False)
        return go.Scatter(
            x=np.arange(len(values)), y=mib(values), mode="lines", name=name,
            line={"color": color, "dash": dash, "width": width, "shape": "hv"},
            hovertemplate=f"{name}<br>level %{{x}}: %{{y:.1f}} MiB<extra></extra>",
            xaxis="x2", yaxis="y2",
        )

    traces = [
        line(curves.before, "device, before", "#64748b", width=1.2),
        line(curves.after, "device, after", "#2563eb", width=2),
        line(curves.host, "host", "#d97706", dash="dot"),
    ]
    if curves.budget:
        b = curves.budget / MIB
        off = " (above the chart)" if b > memory_range(curves)[1] else ""
        traces.append(go.Scatter(
            x=[0, max(n - 1, 1)], y=[b, b], mode="lines",
            name=f"budget {format_mib(curves.budget)}{off}",
            line={"color": "#b91c1c", "dash": "dash", "width": 1.5}, hoverinfo="skip",
            xaxis="x2", yaxis="y2",
        ))
    else:
        traces.append(go.Scatter(x=[], y=[], name="budget", xaxis="x2", yaxis="y2",
                                 showlegend=False))
    px, py, ptext, pos = [], [], [], []
    for label, peak, where in (("peak before", curves.peak_before, "top left"),
                               ("peak after", curves.peak_after, "top right")):
        if peak is not None:
            px.append(peak[0])
            py.append(peak[1] / MIB)
            ptext.append(f"{label}: {format_mib(peak[1])} at level {peak[0]}")
            pos.append(where)
    traces.append(go.Scatter(
        x=px, y=py, mode="markers+text", name="peaks", text=[t.split(":")[0] for t in ptext],
        textposition=pos, customdata=ptext, hovertemplate="%{customdata}<extra></extra>",
        marker={"symbol": "triangle-down", "size": 11, "color": "#111827"}, showlegend=False,
        xaxis="x2", yaxis="y2",
    ))
    return traces


def memory_range(curves: Curves) -> list[float]:
    """The memory row's y range in MiB: the curves, and the budget when it is near them.

    A budget far above the curves would flatten them, so it is then left off scale (its
    legend entry says so).

    >>> memory_range(Curves(before=[0, 100 * 2**20], budget=2**40))
    [0.0, 112.0]
    """
    top = max([max(c, default=0) for c in (curves.before, curves.after or (), curves.host or ())])
    top_mib = top / MIB * 1.12 or 1.0
    if curves.budget and curves.budget / MIB <= top_mib * 1.5:
        top_mib = max(top_mib, curves.budget / MIB * 1.06)
    return [0.0, round(top_mib, 3)]


def selection_shapes(hl: Highlight, positions: tuple[np.ndarray, np.ndarray]) -> list[dict]:
    """Layout shapes of the selection.

    A dotted line across both rows at the selected level; circles (fixed pixel size)
    around the selected tensor's producer, squares around its consumers, a diamond around
    the selected op; the tensor's lifetime as a band from its first to its last level,
    as high as its size, labelled with its name.
    """
    x, y = positions
    shapes: list[dict] = []
    if hl.level is not None:
        shapes.append({
            "type": "line", "xref": "x", "yref": "paper", "x0": hl.level, "x1": hl.level,
            "y0": 0, "y1": 1, "line": {"color": "#7c3aed", "width": 1.5, "dash": "dot"},
        })

    def ring(i: int, kind: str, color: str, size: int) -> dict:
        return {
            "type": kind, "xref": "x", "yref": "y", "xsizemode": "pixel", "ysizemode": "pixel",
            "xanchor": float(x[i]), "yanchor": float(y[i]), "x0": -size, "x1": size,
            "y0": -size, "y1": size, "line": {"color": color, "width": 2},
        }

    if hl.producer is not None:
        shapes.append(ring(hl.producer, "circle", "#111827", 8))
    shapes += [ring(c, "rect", "#111827", 6) for c in hl.consumers]
    if hl.op is not None:
        shapes.append(ring(hl.op, "circle", "#7c3aed", 11))
    if hl.lifetime is not None:
        s, e, nbytes = hl.lifetime
        shapes.append({
            "type": "rect", "xref": "x2", "yref": "y2", "x0": s, "x1": max(e, s + 0.5),
            "y0": 0, "y1": nbytes / MIB, "fillcolor": "rgba(124,58,237,0.25)",
            "line": {"color": "#7c3aed", "width": 1},
            "label": {"text": f"{hl.tensor} · {format_mib(nbytes)} · levels {s}–{e}",
                      "textposition": "top left", "font": {"size": 11, "color": "#5b21b6"}},
        })
    return shapes


def dynamic_traces(
    swaps: Sequence[SwapDraw], positions: tuple[np.ndarray, np.ndarray], curves: Curves
) -> list[go.Scatter | go.Scattergl]:
    """Every trace after the ordering lanes, in ``T_*`` order (what a plan changes)."""
    return [*overlay_traces(swaps, positions), *memory_traces(curves)]


def studio_figure(
    ops: OpTable,
    positions: tuple[np.ndarray, np.ndarray],
    curves: Curves,
    swaps: Sequence[SwapDraw] = (),
    hl: Highlight | None = None,
    *,
    max_points: int = MAX_POINTS,
    uirevision: str = "",
) -> tuple[go.Figure, str]:
    """The two-row figure: ordering on top, memory below, one x-axis (CTO level).

    Returns
    -------
    figure : go.Figure
    note : str
        Non-empty when the ordering row is aggregated (see :func:`ordering_traces`).
    """
    hl = hl or Highlight()
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        row_heights=[0.45, 0.55])
    lanes, note = ordering_traces(ops, positions, max_points)
    for tr in [*lanes, *dynamic_traces(swaps, positions, curves)]:
        fig.add_trace(tr)
    fig.update_layout(
        margin={"l": 70, "r": 20, "t": 10, "b": 40},
        height=640,
        hovermode="closest",
        clickmode="event",
        dragmode="zoom",
        uirevision=uirevision,
        plot_bgcolor="#ffffff",
        legend={"orientation": "h", "y": -0.08, "x": 0, "font": {"size": 11}},
        shapes=selection_shapes(hl, positions),
        hoverdistance=30,
    )
    fig.update_yaxes(row=1, col=1, tickvals=list(range(len(LANES))), ticktext=list(LANES),
                     range=[-0.6, len(LANES) - 0.4], showgrid=False, zeroline=False,
                     fixedrange=True)
    fig.update_yaxes(row=2, col=1, title_text="memory (MiB)", range=memory_range(curves),
                     gridcolor="#e5e7eb")
    fig.update_xaxes(row=2, col=1, title_text="level (categorized topological order)",
                     gridcolor="#f1f5f9")
    fig.update_xaxes(row=1, col=1, gridcolor="#f1f5f9")
    return fig, note
