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

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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
#: Whether traces are checked by Plotly as they are built. Off: a check walks every point
#: (two thirds of building the ResNet-50 figure); ``test_figures`` builds each figure both
#: ways and compares them.
VALIDATE = False
MIB = 2**20
#: Lane labels on the y-axis (clones are drawn in the swap lane when zoomed in).
LANE_LABELS = [*CATEGORIES, "swap · recompute"]
RECOMPUTE_COLOR = "#059669"

# Fixed trace positions of the studio figure.
T_SWAP_EDGES = len(CATEGORIES)
T_TRIGGER_EDGES = T_SWAP_EDGES + 1
T_SWAP_OPS = T_SWAP_EDGES + 2
T_BEFORE = T_SWAP_EDGES + 3
T_AFTER = T_SWAP_EDGES + 4
T_HOST = T_SWAP_EDGES + 5
T_BUDGET = T_SWAP_EDGES + 6
T_PEAKS = T_SWAP_EDGES + 7
# the level window drawn op by op (:func:`window_traces`), on top of everything
T_DETAIL_EDGES = T_PEAKS + 1
T_DETAIL_RECOMPUTE = T_PEAKS + 2
T_DETAIL_EDGE_HOVER = T_PEAKS + 3
T_DETAIL_OPS = T_PEAKS + 4
T_DETAIL_MARKS = T_PEAKS + 5
N_TRACES = T_DETAIL_MARKS + 1
#: A window of at most this many ops is drawn op by op; a wider one stays aggregated.
DETAIL_MAX_OPS = 3000
#: At most this many data edges of a window are drawn (the largest tensors first).
DETAIL_MAX_EDGES = 4000
#: Op names are written next to their points when the window spans at most this many
#: levels and holds at most :data:`LABEL_MAX_OPS` ops.
LABEL_MAX_LEVELS = 60
LABEL_MAX_OPS = 400


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
    hover_before, hover_after : sequence of str, optional
        Per level, its bytes and what dominates it (:func:`level_hover`), shown on hover
        of each curve.
    fixed : int
        Persistent memory and feeds, held at every level: said once in the hover template
        of a curve with hover text, not in each level's text.
    """

    before: Sequence[int]
    after: Sequence[int] | None = None
    host: Sequence[int] | None = None
    peak_before: tuple[int, int] | None = None
    peak_after: tuple[int, int] | None = None
    budget: int | None = None
    hover_before: Sequence[str] | None = None
    hover_after: Sequence[str] | None = None
    fixed: int = 0


@dataclass(frozen=True)
class SwapDraw:
    """One swapped tensor as drawn: op indices of its producer, consumers and triggers.

    Attributes
    ----------
    tensor : str
    producer : int
    groups : tuple of (tuple of int, int or None)
        For each swap-in, the consumers it serves and its trigger (None: synchronous).
    nbytes : int
        The tensor's size (shown on hover; 0 when not given).
    """

    tensor: str
    producer: int
    groups: tuple[tuple[tuple[int, ...], int | None], ...] = field(default_factory=tuple)
    nbytes: int = 0


@dataclass(frozen=True)
class RecomputeDraw:
    """One recomputed tensor as drawn: the clones, what they read, whom they serve.

    Attributes
    ----------
    tensor : str
    clones : tuple of str
        Names of the original ops cloned, in the order they run.
    inputs : tuple of int
        Op indices of the kept tensors' producers that the clones read.
    consumers : tuple of int
        Op indices of the readers served by the recomputed tensor.
    trigger : int
        Op index after which the clones run.
    nbytes : int
        The tensor's size.
    """

    tensor: str
    clones: tuple[str, ...]
    inputs: tuple[int, ...]
    consumers: tuple[int, ...]
    trigger: int
    nbytes: int = 0


class Edges(Protocol):
    """Data edges as parallel arrays (:class:`lmscore.browse.DataEdges` is one)."""

    src: np.ndarray
    port: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray


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



def _scatter(**props: Any) -> go.Scatter:
    """A ``go.Scatter``, checked only when :data:`VALIDATE` is set."""
    return go.Scatter(_validate=VALIDATE, **props)


def _scattergl(**props: Any) -> go.Scattergl:
    """A ``go.Scattergl``, checked only when :data:`VALIDATE` is set."""
    return go.Scattergl(_validate=VALIDATE, **props)

def format_size(n: float) -> str:
    """Bytes in the unit their magnitude calls for (B, KiB, MiB, GiB, TiB).

    >>> format_size(512), format_size(3 * 2**10), format_size(40_000 * 2**20)
    ('512 B', '3.0 KiB', '39.06 GiB')
    """
    a = abs(n)
    for unit, scale, digits in (("TiB", 2**40, 2), ("GiB", 2**30, 2), ("MiB", 2**20, 1),
                                ("KiB", 2**10, 1)):
        if a >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)} B"


def short_name(name: str, width: int = 28) -> str:
    """The tail of a long op or tensor name, as a label next to its point.

    >>> short_name("model/block1/conv/Conv2D:0"), short_name("a" * 40, 10)
    ('…/block1/conv/Conv2D:0', '…aaaaaaaaa')
    """
    parts = name.split("/")
    tail = "/".join(parts[-3:])
    if len(parts) > 3:
        tail = "…/" + tail  # (without the mark, a tail reads as another op's whole name)
    return tail if len(tail) <= width else "…" + name[-(width - 1):]


def window_names(names: Sequence[str], width: int = 30) -> list[str]:
    """Labels for the ops of a window: the shortest tails of their names that tell them apart.

    Cut to one width, ``conv5_block1_0_conv/BiasAdd/BiasAddGrad`` and its ``_3`` sibling
    both read ``…1/BiasAdd/BiasAddGrad``. A tail longer than ``width`` characters is cut
    from the left, or in its middle where that leaves two alike, or not drawn where even
    that does (the hover names every op in full).

    >>> window_names(["m/b0/conv/BiasAddGrad", "m/b3/conv/BiasAddGrad", "m/b0/Relu"])
    ['…/b0/conv/BiasAddGrad', '…/b3/conv/BiasAddGrad', '…/b0/Relu']
    >>> window_names(["x", "dense/MatMul"])
    ['x', 'dense/MatMul']
    """
    parts = [n.split("/") for n in names]
    depth = [min(2, len(p)) for p in parts]
    for _ in range(max((len(p) for p in parts), default=0)):
        seen = Counter("/".join(p[-d:]) for p, d in zip(parts, depth, strict=True))
        clash = [k for k, p in enumerate(parts)
                 if seen["/".join(p[-depth[k]:])] > 1 and depth[k] < len(p)]
        if not clash:
            break
        for k in clash:
            depth[k] += 1
    tails = ["/".join(p[-d:]) for p, d in zip(parts, depth, strict=True)]

    def fit(tail: str, name: str) -> str:  # marked where shortened, cut to the width
        label = tail if tail == name else "…/" + tail
        return label if len(label) <= width else "…" + tail[-(width - 1):]

    out = [fit(t, n) for t, n in zip(tails, names, strict=True)]
    # cut to the width, two tails may end alike: their middles go instead, or the labels
    head = width // 3
    count = Counter(out)
    out = [t[:head] + "…" + t[-(width - head - 1):] if count[label] > 1 else label
           for label, t in zip(out, tails, strict=True)]
    count = Counter(out)
    return [label if count[label] == 1 else "" for label in out]


#: The ordering view's plotting area in pixels, as a wide window draws it, and a label's
#: character width and line height at its 9 px font (:func:`placed_labels`).
VIEW_PX = (1100.0, 260.0)
CHAR_PX, LINE_PX = 5.2, 11.0


def placed_labels(x: Sequence[float], y: Sequence[float], labels: Sequence[str],
                  order: Sequence[int], x_span: float, y_span: float) -> list[str]:
    """The labels that can be drawn above their points without covering each other.

    Taken in ``order`` (the largest tensors' ops first), a label is kept where its box,
    centred above its point in a view of :data:`VIEW_PX` over ``x_span`` by ``y_span``
    data units, meets no kept one; the others are left to the hover. Drawn all at once,
    the names of a level's ops, stacked a few pixels apart, covered one another.

    >>> placed_labels([0, 0, 5], [0.0, 0.05, 0.0], ["conv", "relu", "add"], [0, 1, 2], 30, 6)
    ['conv', '', 'add']
    """
    sx, sy = VIEW_PX[0] / max(x_span, 1e-9), VIEW_PX[1] / max(y_span, 1e-9)
    kept: list[tuple[float, float, float, float]] = []
    out = [""] * len(labels)
    for k in order:
        half = len(labels[k]) * CHAR_PX / 2
        cx, cy = float(x[k]) * sx, float(y[k]) * sy
        box = (cx - half, cx + half, cy + 4, cy + 4 + LINE_PX)
        if any(box[0] < b[1] and b[0] < box[1] and box[2] < b[3] and b[2] < box[3]
               for b in kept):
            continue
        kept.append(box)
        out[k] = labels[k]
    return out


def memory_ticks(top_mib: float, target: int = 6) -> tuple[list[float], list[str]]:
    """Tick positions (in MiB, the memory row's unit) and labels in a unit fit for ``top``.

    GiB from 2 GiB up, KiB under 1 MiB, MiB between; steps of 1, 2, 2.5 or 5 times a
    power of ten of that unit, at most ``target`` intervals.

    >>> memory_ticks(40_960)
    ([0.0, 10240.0, 20480.0, 30720.0, 40960.0], ['0', '10 GiB', '20 GiB', '30 GiB', '40 GiB'])
    >>> memory_ticks(300)[1]
    ['0', '50 MiB', '100 MiB', '150 MiB', '200 MiB', '250 MiB', '300 MiB']
    >>> memory_ticks(0.5)[1][:3]
    ['0', '100 KiB', '200 KiB']
    """
    top_mib = max(float(top_mib), 1e-6)
    if top_mib >= 2048:
        unit, per = "GiB", 1024.0
    elif top_mib >= 1:
        unit, per = "MiB", 1.0
    else:
        unit, per = "KiB", 1 / 1024
    top = top_mib / per
    step = 1.0
    for e in range(-3, 12):
        for m in (1, 2, 2.5, 5):
            step = m * 10.0 ** e
            if top / step <= target:
                break
        else:
            continue
        break
    vals = [k * step for k in range(int(top / step + 1e-9) + 1)]
    text = ["0" if v == 0 else f"{v:g} {unit}" for v in vals]
    return [round(v * per, 6) for v in vals], text


def memory_axis(curves: Curves) -> dict[str, Any]:
    """The memory row's y-axis: its range (:func:`memory_range`) and human-unit ticks."""
    rng = memory_range(curves)
    vals, text = memory_ticks(rng[1])
    # (a double-click's autorange then starts at 0, not at a negative margin)
    return {"range": rng, "tickvals": vals, "ticktext": text, "tickmode": "array",
            "rangemode": "nonnegative"}


def level_hover(values: Sequence[int], tops: Sequence[Sequence[tuple[str, int]]] | None
                ) -> list[str]:
    """Hover text of a memory curve: each level's total and what dominates it.

    The curve's name, the level and the memory held at every level are in the trace's
    hover template (:func:`memory_traces`), written once instead of at every level (a
    third of the text on the ResNet-50 sample).

    Parameters
    ----------
    values : sequence of int
        The curve, bytes per level.
    tops : sequence of sequence of (str, int), optional
        Per level, the largest buffers as ``(what, bytes)``
        (:meth:`lmscore.evaluate.PlanEvaluation.dominant`).

    >>> level_hover([3 * 2**20], [[("kept a:0", 2 * 2**20)]])
    ['3.0 MiB<br>kept a:0: 2.0 MiB']
    """
    out = []
    # the same few buffers top many levels in a row: each line is written once
    said: dict[tuple[str, int], str] = {}
    for lvl, v in enumerate(values):
        text = format_size(v)
        if tops is not None and lvl < len(tops):
            for pair in tops[lvl]:
                line = said.get(pair)
                if line is None:
                    line = said[pair] = f"<br>{_short_words(pair[0])}: {format_size(pair[1])}"
                text += line
        out.append(text)
    return out


def _short_words(what: str, width: int = 40) -> str:
    """``what`` with each name in it shortened (:func:`short_name`), its words kept.

    Cut as one string from the left, a line lost what the plan does with the buffer.

    >>> _short_words("swap-in of model/stage1/block2/conv/Conv2D:0")
    'swap-in of …/block2/conv/Conv2D:0'
    """
    return " ".join(short_name(w, width) if "/" in w else w for w in what.split(" "))


def op_positions(levels: Sequence[int], categories: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates of every op: x is its level, y its lane plus a spread within the lane.

    Ops of one level and category are spread evenly over 70% of the lane height, in
    source order, so a wide level shows as a tall column.

    >>> x, y = op_positions([0, 0, 1], ["input", "input", "forward"])
    >>> x.tolist(), [round(v, 3) for v in y.tolist()]
    ([0, 0, 1], [-0.35, 0.35, 2.0])
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
            f"<br>{format_size(ops.nbytes[i])}"
            for i in idx.tolist()
        ]
        traces.append(_scattergl(
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
            + f" · {c}<br>{cnt} ops, {format_size(tot)}<br>largest: {ops.names[j]} ({ops.types[j]})"
            for lo, cnt, tot, j in zip(
                (b * width).tolist(), count[sel].tolist(), total[sel].tolist(),
                largest[sel].tolist(), strict=True,
            )
        ]
        traces.append(_scattergl(
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


def _spread(xs: Sequence[float], centre: float, sign: float) -> np.ndarray:
    """Heights in half a lane for marks sharing an x: one at +-0.2, several over 0.08-0.35.

    >>> _spread([3, 3, 3, 4], 5.0, 1).round(3).tolist()
    [5.08, 5.215, 5.35, 5.2]
    """
    x = np.asarray(xs, dtype=np.float64)
    n = len(x)
    if n == 0:
        return x
    order = np.lexsort((np.arange(n), x))
    sx = x[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sx)) + 1]
    counts = np.diff(np.r_[starts, n])
    rank = np.arange(n) - np.repeat(starts, counts)
    size = np.repeat(counts, counts)
    off = np.where(size > 1, 0.08 + 0.27 * rank / np.maximum(size - 1, 1), 0.2)
    y = np.empty(n)
    y[order] = centre + sign * off
    return y


@dataclass(frozen=True)
class _SwapLayout:
    """Where the swap ops of a plan sit, and the segments between them and their ops."""

    x: np.ndarray
    y: np.ndarray
    label: list[str]
    tensor: list[str]
    edges: list[tuple[float, float, float, float]]
    triggers: list[tuple[float, float, float, float]]
    kind: list[str]  # "swap-out", "swap-in 0": the hover says "<kind> of <tensor><tail>"
    tail: list[str]  # size, and where it runs


def _swap_layout(swaps: Sequence[SwapDraw], positions: tuple[np.ndarray, np.ndarray]
                 ) -> _SwapLayout:
    """Swap-outs above the swap lane's middle, swap-ins below, spread when they share a level.

    Each swap of a level gets its own height, so 100 swaps of one level and their
    edges stay 100 lines rather than one.
    """
    x, y = positions
    lane_y = float(SWAP_LANE)
    outs: list[float] = []
    ins: list[float] = []
    for s in swaps:
        px = float(x[s.producer])
        outs.append(px)
        ins += [float(x[t]) if t is not None else px + 1 for _, t in s.groups]
    out_y = _spread(outs, lane_y, 1)
    in_y = _spread(ins, lane_y, -1)
    mx: list[float] = []
    my: list[float] = []
    label: list[str] = []
    tensor: list[str] = []
    kind: list[str] = []
    tail: list[str] = []
    edges: list[tuple[float, float, float, float]] = []
    triggers: list[tuple[float, float, float, float]] = []
    k_in = 0
    for n, s in enumerate(swaps):
        px, py, oy = float(x[s.producer]), float(y[s.producer]), float(out_y[n])
        size = f" · {format_size(s.nbytes)}" if s.nbytes else ""
        edges.append((px, py, px, oy))
        mx.append(px)
        my.append(oy)
        kind.append("swap-out")
        tail.append(f"{size}<br>level {int(px)} (to host)")
        label.append(f"out {short_name(s.tensor)}")
        tensor.append(s.tensor)
        for k, (consumers, trig) in enumerate(s.groups):
            ix, iy = ins[k_in], float(in_y[k_in])
            k_in += 1
            edges.append((px, oy, ix, iy))
            for c in consumers:
                edges.append((ix, iy, float(x[c]), float(y[c])))
            if trig is not None:
                triggers.append((float(x[trig]), float(y[trig]), ix, iy))
            mx.append(ix)
            my.append(iy)
            how = f"trigger level {int(ix)}" if trig is not None else "synchronous"
            kind.append(f"swap-in {k}")
            tail.append(f"{size}<br>{how}, serves {len(consumers)} op(s)")
            label.append(f"in {short_name(s.tensor)}")
            tensor.append(s.tensor)
    return _SwapLayout(np.asarray(mx), np.asarray(my), label, tensor, edges, triggers, kind,
                       tail)


def overlay_traces(
    swaps: Sequence[SwapDraw], positions: tuple[np.ndarray, np.ndarray]
) -> list[go.Scattergl]:
    """Swap ops and rewired edges drawn over the ordering view.

    A swap-out sits in the swap lane at its producer's level, a swap-in at its trigger's
    level (one level after the producer when synchronous); swap ops of one level are
    spread over the lane (:func:`_spread`). Edges: producer -> swap-out -> swap-in -> each
    consumer it serves (solid), trigger ..> swap-in (dotted).

    Returns
    -------
    list of go.Scattergl
        Three traces: rewired edges, trigger edges, swap ops (in ``T_*`` order).
    """
    lay = _swap_layout(swaps, positions)
    ex, ey = _segments(lay.edges)
    tx, ty = _segments(lay.triggers)
    return [
        _scattergl(x=ex, y=ey, mode="lines", name="rewired edges", hoverinfo="skip",
                     line={"color": LANE_COLORS["swap"], "width": 1}, opacity=0.5,
                     xaxis="x", yaxis="y", showlegend=bool(lay.edges)),
        _scattergl(x=tx, y=ty, mode="lines", name="triggers", hoverinfo="skip",
                     line={"color": "#7c3aed", "width": 1, "dash": "dot"}, opacity=0.6,
                     xaxis="x", yaxis="y", showlegend=bool(lay.triggers)),
        # the tensor's name is sent once, as the point's customdata (what a click
        # selects): in the text too it was 40% of the trace (~60 KB of a ResNet-50 edit)
        _scattergl(x=lay.x, y=lay.y, mode="markers", name="swap ops", text=lay.kind,
                     hovertext=lay.tail, customdata=lay.tensor,
                     hovertemplate="%{text} of %{customdata}%{hovertext}<extra></extra>",
                     marker={"symbol": "diamond", "size": 8, "color": LANE_COLORS["swap"],
                             "line": {"width": 1, "color": "#7c2d12"}},
                     xaxis="x", yaxis="y", showlegend=bool(swaps)),
    ]


def memory_traces(curves: Curves) -> list[go.Scatter]:
    """The memory row: device before/after, host, budget line, peaks.

    Values are plotted in MiB (the axis labels them in the unit their magnitude calls for,
    :func:`memory_axis`); hover says each level's bytes and, when ``curves`` carries it,
    what dominates the level.

    Returns
    -------
    list of go.Scatter
        Five traces in ``T_*`` order (empty traces where there is nothing to draw).
    """
    n = len(curves.before)

    def mib(v: Sequence[int]) -> np.ndarray:
        return np.asarray(v, dtype=np.float64) / MIB

    def line(values: Sequence[int] | None, name: str, color: str, dash: str = "solid",
             width: float = 1.5, hover: Sequence[str] | None = None) -> go.Scatter:
        if values is None:
            return _scatter(x=[], y=[], name=name, xaxis="x2", yaxis="y2", showlegend=False)
        # a level's text is sent only where it says more than its bytes; else the browser
        # formats a number in the curve's unit (a third of the characters)
        if hover is not None:
            tail = (f"<br>persistent + inputs: {format_size(curves.fixed)}"
                    if curves.fixed else "")
            extra = {"text": list(hover),
                     "hovertemplate": f"{name}, level %{{x}}: %{{text}}{tail}<extra></extra>"}
        else:
            unit, scale, digits = ("GiB", 2**30, 2) if max(values, default=0) >= 2**30 else (
                "MiB", MIB, 1)
            extra = {"customdata": np.round(np.asarray(values, dtype=np.float64) / scale, digits),
                     "hovertemplate": f"{name}, level %{{x}}: %{{customdata:.{digits}f}} {unit}"
                                      "<extra></extra>"}
        return _scatter(
            x=np.arange(len(values)), y=mib(values), mode="lines", name=name,
            line={"color": color, "dash": dash, "width": width, "shape": "hv"},
            xaxis="x2", yaxis="y2", **extra,
        )

    traces = [
        line(curves.before, "device, before", "#64748b", width=1.2, hover=curves.hover_before),
        line(curves.after, "device, after", "#2563eb", width=2, hover=curves.hover_after),
        line(curves.host, "host", "#d97706", dash="dot"),
    ]
    if curves.budget:
        b = curves.budget / MIB
        off = " (above the chart)" if b > memory_range(curves)[1] else ""
        traces.append(_scatter(
            x=[0, max(n - 1, 1)], y=[b, b], mode="lines",
            name=f"budget {format_size(curves.budget)}{off}",
            line={"color": "#b91c1c", "dash": "dash", "width": 1.5}, hoverinfo="skip",
            xaxis="x2", yaxis="y2",
        ))
    else:
        traces.append(_scatter(x=[], y=[], name="budget", xaxis="x2", yaxis="y2",
                                 showlegend=False))
    px, py, ptext, pos = [], [], [], []
    for label, peak, where in (("peak before", curves.peak_before, "top left"),
                               ("peak after", curves.peak_after, "top right")):
        if peak is not None:
            px.append(peak[0])
            py.append(peak[1] / MIB)
            ptext.append(f"{label}: {format_size(peak[1])} at level {peak[0]}")
            pos.append(where)
    traces.append(_scatter(
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


def selection_shapes(hl: Highlight, positions: tuple[np.ndarray, np.ndarray],
                     y_top: float | None = None) -> list[dict]:
    """Layout shapes of the selection.

    A dotted line across both rows at the selected level; circles (fixed pixel size)
    around the selected tensor's producer, squares around its consumers, a diamond around
    the selected op; the tensor's lifetime as a band from its first to its last level,
    as high as its size, labelled with its name.

    The label sits inside the band's top, on the side away from the nearer end of the
    levels, so that it runs towards the middle of the plot (a band near the right end is
    labelled from its right edge leftwards). With ``y_top`` (the memory axis' top, MiB)
    a band taller than the axis is cut there, so its label stays in view.

    >>> x, y = op_positions(range(100), ["forward"] * 100)
    >>> band = lambda s, e, top=None: selection_shapes(
    ...     Highlight(lifetime=(s, e, 50 * MIB), tensor="t:0"), (x, y), top)[-1]
    >>> band(90, 99)["label"]["textposition"], band(3, 20)["label"]["textposition"]
    ('top right', 'top left')
    >>> band(90, 99)["y1"], band(90, 99, 40.0)["y1"]
    (50.0, 40.0)
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
        last = float(x.max()) if len(x) else 0.0
        # a label runs from its anchor inwards: from the right edge in the right half
        side = "right" if (s + e) / 2 > last / 2 else "left"
        top = nbytes / MIB if not y_top or y_top <= 0 else min(nbytes / MIB, y_top)
        shapes.append({
            "type": "rect", "xref": "x2", "yref": "y2", "x0": s, "x1": max(e, s + 0.5),
            "y0": 0, "y1": top, "fillcolor": "rgba(124,58,237,0.25)",
            "line": {"color": "#7c3aed", "width": 1},
            "label": {"text": f"{hl.tensor} · {format_size(nbytes)} · levels {s}–{e}",
                      "textposition": f"top {side}", "font": {"size": 11, "color": "#5b21b6"}},
        })
    return shapes


def dynamic_traces(
    swaps: Sequence[SwapDraw], positions: tuple[np.ndarray, np.ndarray], curves: Curves
) -> list[go.Scatter | go.Scattergl]:
    """The traces after the ordering lanes that a plan changes, in ``T_*`` order."""
    return [*overlay_traces(swaps, positions), *memory_traces(curves)]


def window_from_relayout(relayout: dict[str, Any] | None, n_levels: int,
                         current: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """The level window a zoom or pan of the figure shows (Plotly's ``relayoutData``).

    Parameters
    ----------
    relayout : dict
        The event: ``xaxis.range[0]``/``[1]`` (or ``xaxis2``, or ``xaxis.range`` as a
        pair) after a zoom or pan, ``xaxis.autorange`` after a reset.
    n_levels : int
    current : (int, int), optional
        The window before the event, kept when the event does not move the x-axis.

    Returns
    -------
    (int, int) or None
        First and last level shown, clipped to the graph; None for the whole graph.

    >>> window_from_relayout({"xaxis.range[0]": 10.4, "xaxis.range[1]": 30.2}, 100)
    (10, 31)
    >>> window_from_relayout({"xaxis2.autorange": True}, 100, (10, 31)) is None
    True
    >>> window_from_relayout({"autosize": True}, 100, (10, 31))
    (10, 31)
    >>> window_from_relayout({"xaxis.range": [-5, 500]}, 100, (10, 31)) is None
    True
    """
    if not isinstance(relayout, dict):
        return current
    for ax in ("xaxis", "xaxis2"):
        if relayout.get(f"{ax}.autorange"):
            return None
        pair = relayout.get(f"{ax}.range")
        lo = relayout.get(f"{ax}.range[0]", pair[0] if isinstance(pair, list | tuple)
                          and len(pair) == 2 else None)
        hi = relayout.get(f"{ax}.range[1]", pair[1] if isinstance(pair, list | tuple)
                          and len(pair) == 2 else None)
        if lo is None or hi is None:
            continue
        try:
            a, b = sorted((float(lo), float(hi)))
        except (TypeError, ValueError):
            return current
        if not (np.isfinite(a) and np.isfinite(b)):
            return current
        first, last = max(int(np.floor(a)), 0), min(int(np.ceil(b)), n_levels - 1)
        if first <= 0 and last >= n_levels - 1:
            return None
        return (first, max(first, last))
    return current


def window_traces(
    ops: OpTable,
    positions: tuple[np.ndarray, np.ndarray],
    edges: Edges | None,
    window: tuple[int, int] | None,
    swaps: Sequence[SwapDraw] = (),
    recomputes: Sequence[RecomputeDraw] = (),
    *,
    max_ops: int = DETAIL_MAX_OPS,
    max_edges: int = DETAIL_MAX_EDGES,
) -> tuple[list[go.Scatter], str]:
    """The ops of a level window drawn one by one, with their edges, swaps and recomputes.

    Only the window's ops and edges are sent, so however large the graph the browser gets
    at most ``max_ops`` points and ``max_edges`` edges.

    Parameters
    ----------
    ops : OpTable
    positions : (ndarray, ndarray)
        From :func:`op_positions`.
    edges : Edges, optional
        The graph's data edges (:func:`lmscore.browse.data_edges`).
    window : (int, int) or None
        First and last level (:func:`window_from_relayout`); None draws nothing (the
        whole graph is shown by the lanes).
    swaps, recomputes : sequence
        The plan's swaps and recomputes; those touching the window are labelled.
    max_ops, max_edges : int
        A wider window is left to the lanes (the note says to zoom in); of more edges the
        largest tensors are kept.

    Returns
    -------
    traces : list of go.Scatter
        Five, in ``T_DETAIL_*`` order: data edges, recompute edges, edge hover points,
        ops, swap and recompute ops.
    note : str
        What the window shows, or why it is not drawn op by op.
    """
    empty = _window_empty()
    if window is None:
        return empty, ""
    lo, hi = window
    x, y = positions
    lv = np.asarray(ops.levels, dtype=np.int64)
    inside = np.flatnonzero((lv >= lo) & (lv <= hi))
    if len(inside) > max_ops:
        return empty, (f"levels {lo}–{hi}: {len(inside):,} ops, too many to draw one by one; "
                       f"zoom in to at most {max_ops:,} ops to see them with their edges.")
    labelled = hi - lo + 1 <= LABEL_MAX_LEVELS and len(inside) <= LABEL_MAX_OPS
    cats = np.asarray(ops.categories)
    colors = [LANE_COLORS.get(c, "#111827") for c in cats[inside]]
    hover = [f"{ops.names[i]}<br>{ops.types[i]} · level {ops.levels[i]} · {cats[i]}"
             f"<br>{ops.shapes[i]}<br>{format_size(ops.nbytes[i])}" for i in inside.tolist()]
    labels: list[str] = []
    if labelled:
        names = window_names([ops.names[i] for i in inside.tolist()])
        sizes = np.asarray(ops.nbytes, dtype=np.float64)[inside]
        labels = placed_labels(x[inside], y[inside], names,
                               np.argsort(-sizes, kind="stable").tolist(),
                               hi - lo + 1, len(LANES) + 0.2)
    op_trace = _scatter(
        x=x[inside], y=y[inside], mode="markers+text" if labelled else "markers",
        name="ops", text=labels,
        textposition="top center", textfont={"size": 9, "color": "#374151"},
        hovertext=hover, hovertemplate="%{hovertext}<extra></extra>", customdata=inside,
        marker={"size": 9, "color": colors, "line": {"width": 1, "color": "#ffffff"}},
        xaxis="x", yaxis="y", showlegend=False, cliponaxis=False,
    )
    # data edges with an end in the window (the other end may lie outside)
    n_edges = 0
    kept = 0
    seg: list[tuple[float, float, float, float]] = []
    mid_x: list[float] = []
    mid_y: list[float] = []
    mid_text: list[str] = []
    if edges is not None and len(edges.src):
        src = np.asarray(edges.src)
        dst = np.asarray(edges.dst)
        nb = np.asarray(edges.nbytes)
        sel = np.flatnonzero(((lv[src] >= lo) & (lv[src] <= hi))
                             | ((lv[dst] >= lo) & (lv[dst] <= hi)))
        n_edges = len(sel)
        if n_edges > max_edges:
            sel = sel[np.argsort(-nb[sel], kind="stable")[:max_edges]]
        kept = len(sel)
        for e in sel.tolist():
            a, b = int(src[e]), int(dst[e])
            seg.append((float(x[a]), float(y[a]), float(x[b]), float(y[b])))
            mid_x.append((float(x[a]) + float(x[b])) / 2)
            mid_y.append((float(y[a]) + float(y[b])) / 2)
            mid_text.append(f"{ops.names[a]}:{int(edges.port[e])} · {format_size(int(nb[e]))}"
                            f"<br>{short_name(ops.names[a], 40)} → {short_name(ops.names[b], 40)}")
    ex, ey = _segments(seg)
    # swap ops in the window, labelled
    lay = _swap_layout(swaps, positions)
    in_win = [k for k in range(len(lay.x)) if lo - 0.5 <= lay.x[k] <= hi + 0.5]
    mx = [float(lay.x[k]) for k in in_win]
    my = [float(lay.y[k]) for k in in_win]
    mtext = [f"{lay.kind[k]} of {lay.tensor[k]}{lay.tail[k]}" for k in in_win]
    mlabel = [lay.label[k] for k in in_win]
    msym = ["diamond"] * len(in_win)
    mcolor = [LANE_COLORS["swap"]] * len(in_win)
    mdata: list[Any] = [lay.tensor[k] for k in in_win]
    # recomputing clones: in the swap lane just before the first reader they serve
    rseg: list[tuple[float, float, float, float]] = []
    for r in recomputes:
        first = min((float(x[c]) for c in r.consumers), default=float(x[r.trigger]))
        n = len(r.clones)
        cx = [first - 0.6 + 0.45 * k / max(n - 1, 1) for k in range(n)]
        cy = _spread([round(v, 3) for v in cx], float(SWAP_LANE), -1).tolist()
        touches = lo - 1 <= first <= hi + 1 or any(lo <= x[c] <= hi for c in r.consumers)
        if not touches:
            continue
        for i in r.inputs:
            rseg.append((float(x[i]), float(y[i]), cx[0], cy[0]))
        rseg += [(cx[k], cy[k], cx[k + 1], cy[k + 1]) for k in range(n - 1)]
        rseg += [(cx[-1], cy[-1], float(x[c]), float(y[c])) for c in r.consumers]
        rseg.append((float(x[r.trigger]), float(y[r.trigger]), cx[0], cy[0]))
        size = f" · {format_size(r.nbytes)}" if r.nbytes else ""
        for k, name in enumerate(r.clones):
            mx.append(cx[k])
            my.append(cy[k])
            mtext.append(f"clone of {name} ({k + 1} of {n})<br>recomputes {r.tensor}{size}"
                         f"<br>for {len(r.consumers)} reader(s); after level "
                         f"{int(x[r.trigger])}")
            mlabel.append(f"re {short_name(name, 20)}")
            msym.append("triangle-up")
            mcolor.append(RECOMPUTE_COLOR)
            mdata.append(r.tensor)
    rx, ry = _segments(rseg)
    traces = [
        _scatter(x=ex, y=ey, mode="lines", name="data edges (window)", hoverinfo="skip",
                   line={"color": "#94a3b8", "width": 1}, opacity=0.7, xaxis="x", yaxis="y",
                   showlegend=False),
        _scatter(x=rx, y=ry, mode="lines", name="recompute edges", hoverinfo="skip",
                   line={"color": RECOMPUTE_COLOR, "width": 1.2, "dash": "dash"},
                   xaxis="x", yaxis="y", showlegend=False),
        _scatter(x=mid_x, y=mid_y, mode="markers", name="tensors", hovertext=mid_text,
                   hovertemplate="%{hovertext}<extra>tensor</extra>",
                   marker={"size": 7, "color": "rgba(100,116,139,0.25)"}, xaxis="x",
                   yaxis="y", showlegend=False),
        op_trace,
        _scatter(x=mx, y=my, mode="markers+text" if labelled else "markers",
                   name="swap and recompute ops", text=mlabel, textposition="middle right",
                   textfont={"size": 9, "color": "#7c2d12"}, hovertext=mtext,
                   hovertemplate="%{hovertext}<extra></extra>", customdata=mdata,
                   marker={"symbol": msym, "size": 10, "color": mcolor,
                           "line": {"width": 1, "color": "#111827"}},
                   xaxis="x", yaxis="y", showlegend=False, cliponaxis=False),
    ]
    more = f" (the {kept:,} largest of {n_edges:,})" if kept < n_edges else ""
    note = (f"levels {lo}–{hi}: {len(inside):,} ops drawn one by one with {kept:,} data "
            f"edges{more}; hover an edge's middle for its tensor and size.")
    return traces, note


def _window_empty() -> list[go.Scatter]:
    return [_scatter(x=[], y=[], name=n, xaxis="x", yaxis="y", showlegend=False)
            for n in ("data edges (window)", "recompute edges", "tensors", "ops",
                      "swap and recompute ops")]


@functools.lru_cache(maxsize=1)
def _grid_layout() -> dict[str, Any]:
    """The layout of the two rows sharing one x-axis, as a dict.

    Made once: plotly takes 7 ms to make it, and 8 ms more to make a figure of it.
    """
    grid = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                         row_heights=[0.45, 0.55])
    return grid.layout.to_plotly_json()


def studio_figure(
    ops: OpTable,
    positions: tuple[np.ndarray, np.ndarray],
    curves: Curves,
    swaps: Sequence[SwapDraw] = (),
    hl: Highlight | None = None,
    *,
    max_points: int = MAX_POINTS,
    uirevision: str = "",
    edges: Edges | None = None,
    window: tuple[int, int] | None = None,
    recomputes: Sequence[RecomputeDraw] = (),
) -> tuple[go.Figure, str]:
    """The two-row figure: ordering on top, memory below, one x-axis (CTO level).

    With ``window`` the x-axis shows those levels and their ops are drawn one by one on
    top of the lanes (:func:`window_traces`).

    Returns
    -------
    figure : go.Figure
    note : str
        Non-empty when the ordering row is aggregated (see :func:`ordering_traces`) or a
        window is shown.
    """
    hl = hl or Highlight()
    grid = _grid_layout()
    lanes, note = ordering_traces(ops, positions, max_points)
    detail, wnote = window_traces(ops, positions, edges, window, swaps, recomputes)
    # row 1 is the ordering (xaxis, yaxis), row 2 the memory (xaxis2, yaxis2)
    xaxis = {**grid["xaxis"], "gridcolor": "#f1f5f9"}
    xaxis2 = {**grid["xaxis2"], "title": {"text": "level (categorized topological order)"},
              "gridcolor": "#f1f5f9"}
    if window is not None:
        for ax in (xaxis, xaxis2):
            ax.update(range=[window[0] - 0.5, window[1] + 0.5], autorange=False)
    layout = {
        **grid,
        "margin": {"l": 70, "r": 20, "t": 10, "b": 40},
        "height": 640,
        "hovermode": "closest",
        "clickmode": "event",
        "dragmode": "zoom",
        "uirevision": uirevision,
        "plot_bgcolor": "#ffffff",
        "legend": {"orientation": "h", "y": -0.08, "x": 0, "font": {"size": 11}},
        "hoverdistance": 30,
        "yaxis": {**grid["yaxis"], "tickvals": list(range(len(LANES))),
                  "ticktext": LANE_LABELS, "range": [-0.6, len(LANES) - 0.4],
                  "showgrid": False, "zeroline": False, "fixedrange": True},
        "yaxis2": {**grid["yaxis2"], "title": {"text": "device memory"},
                   "gridcolor": "#e5e7eb", **memory_axis(curves)},
        "xaxis": xaxis,
        "xaxis2": xaxis2,
    }
    shapes = selection_shapes(hl, positions, memory_range(curves)[1])
    if shapes:  # as plotly leaves an empty list out
        layout["shapes"] = shapes
    # one figure of the built traces and layout: adding traces one by one, or updating
    # the layout of plotly's own subplot figure, would check and copy them again
    fig = go.Figure(data=[*lanes, *dynamic_traces(swaps, positions, curves), *detail],
                    layout=layout, _validate=VALIDATE)
    return fig, " ".join(t for t in (note, wnote) if t)


#: What a level is, in one paragraph for the page.
LEVEL_HELP = (
    "A level is one step of the categorized topological order: every op runs at the first "
    "level after all the ops it reads from (data and control edges), so the ops of one "
    "level could run together, and a tensor lives from its producer's level to its last "
    "reader's. The memory row shows, per level, the most the device holds while that "
    "level's ops run.")

#: Every mark of the studio figure: (glyph, colour, meaning), for the page's legend.
LEGEND: tuple[tuple[str, str, str], ...] = (
    ("●", LANE_COLORS["input"], "input op (feeds)"),
    ("●", LANE_COLORS["persistent"], "persistent op (variables, constants)"),
    ("●", LANE_COLORS["forward"], "forward op"),
    ("●", LANE_COLORS["backward"], "backward op (gradients)"),
    ("●", LANE_COLORS["update"], "update op (optimizer)"),
    ("|", LANE_COLORS["forward"], "aggregated: ops of a level (or a bin of levels) and "
     "category, as tall as their count"),
    ("◆", LANE_COLORS["swap"], "swap-out (above the swap lane's middle) and swap-in (below)"),
    ("—", LANE_COLORS["swap"], "rewired edge: producer → swap-out → swap-in → readers"),
    ("┈", "#7c3aed", "trigger: the op after which a swap-in starts"),
    ("▲", "#059669", "recomputing clone, with its edges (zoomed in)"),
    ("—", "#94a3b8", "data edge (zoomed in; hover its middle for the tensor and its size)"),
    ("—", "#64748b", "device memory, unmodified step"),
    ("—", "#2563eb", "device memory with the plan"),
    ("┈", "#d97706", "host memory with the plan (swapped tensors)"),
    ("╌", "#b91c1c", "budget"),
    ("▼", "#111827", "peaks"),
    ("┊", "#7c3aed", "selected level; rings: selected tensor's producer (circle) and "
     "readers (squares)"),
)


def compare_figure(series: Sequence[tuple[str, Sequence[int]]], budget: int | None = None,
                   *, level: int | None = None) -> go.Figure:
    """Device curves of several plans of one step overlaid, over the original levels.

    Parameters
    ----------
    series : sequence of (str, sequence of int)
        Name and device bytes per level of each plan (the first is drawn grey).
    budget : int, optional
    level : int, optional
        A level to mark (the selected one).

    >>> fig = compare_figure([("no plan", [0, 2**30]), ("current", [0, 2**29])], 2**30)
    >>> [t.name for t in fig.data], list(fig.layout.yaxis.ticktext)[-1]
    (['no plan', 'current', 'budget 1.00 GiB'], '1000 MiB')
    """
    palette = ("#64748b", "#2563eb", "#059669", "#9333ea", "#d97706")
    fig = go.Figure()
    top = 0
    n = 1
    for k, (name, curve) in enumerate(series):
        vals = np.asarray(curve, dtype=np.float64)
        top = max(top, int(vals.max()) if len(vals) else 0)
        n = max(n, len(vals))
        fig.add_trace(_scatter(
            x=np.arange(len(vals)), y=vals / MIB, mode="lines", name=name,
            line={"color": palette[k % len(palette)], "width": 1.2 if k == 0 else 2,
                  "shape": "hv"},
            text=[f"{name}, level {i}: {format_size(v)}" for i, v in enumerate(curve)],
            hovertemplate="%{text}<extra></extra>",
        ))
    if budget:
        fig.add_trace(_scatter(x=[0, max(n - 1, 1)], y=[budget / MIB] * 2, mode="lines",
                                 name=f"budget {format_size(budget)}", hoverinfo="skip",
                                 line={"color": "#b91c1c", "dash": "dash", "width": 1.5}))
        top = max(top, budget)
    vals, text = memory_ticks(top * 1.08 / MIB or 1)
    fig.update_layout(
        height=300, margin={"l": 70, "r": 20, "t": 10, "b": 40}, plot_bgcolor="#ffffff",
        hovermode="x unified", legend={"orientation": "h", "y": -0.25, "x": 0},
        yaxis={"tickvals": vals, "ticktext": text, "tickmode": "array",
               "range": [0, top * 1.08 / MIB or 1], "gridcolor": "#e5e7eb",
               "title": {"text": "device memory"}, "rangemode": "nonnegative"},
        xaxis={"title": {"text": "level"}, "gridcolor": "#f1f5f9"},
    )
    if level is not None:
        fig.add_vline(x=level, line={"color": "#7c3aed", "width": 1.5, "dash": "dot"})
    return fig


@dataclass(frozen=True)
class BatchPlot:
    """What :func:`batch_figure` draws (a :class:`lmscore.compare.BatchSweep`'s columns).

    Attributes
    ----------
    batches : sequence of int
    peak_bytes : sequence of int
        Device peak of the unplanned step at each batch.
    step_seconds : sequence of float
        Its predicted step time.
    device_bytes : int
        The budget line.
    max_without : int
        Largest batch that fits unplanned.
    plan_peak_bytes : sequence of int, optional
        Device peak with the current plan.
    max_with_plan : int
        Largest batch of ``batches`` the plan fits (device and host memory).
    bound : int
        Largest batch any plan could fit (0: not known).
    current : int, optional
        The batch size being looked at.
    plan_host_bytes : sequence of int, optional
        Host memory the plan holds at each batch (a lower row, with ``host_bytes``).
    host_bytes : int
        The host memory limit (0: not drawn).
    next_batch : int
        The batch after the largest that fits, where the tuner was asked (0: not asked).
    next_limited_by : str
        Its answer: ``"host"``, ``"device"`` or ``""`` (a tuned plan fits it).
    """

    batches: Sequence[int]
    peak_bytes: Sequence[int]
    step_seconds: Sequence[float]
    device_bytes: int
    max_without: int
    plan_peak_bytes: Sequence[int] | None = None
    max_with_plan: int = 0
    bound: int = 0
    current: int | None = None
    plan_host_bytes: Sequence[int] | None = None
    host_bytes: int = 0
    next_batch: int = 0
    next_limited_by: str = ""


def limit_note(p: BatchPlot) -> str:
    """What stops a batch larger than the largest that fits, in one line ("" if not asked).

    >>> print(limit_note(BatchPlot([1], [1], [0.1], 1, 4, next_batch=5, next_limited_by="host")))
    batch 5: host memory stops it (the tuner's best plan fits the device, not the host)
    >>> limit_note(BatchPlot([1], [1], [0.1], 1, 4, next_batch=5))
    'batch 5: auto-tune finds a plan that fits it'
    """
    if not p.next_batch:
        return ""
    return f"batch {p.next_batch}: " + {
        "host": "host memory stops it (the tuner's best plan fits the device, not the host)",
        "device": "device memory stops it, whatever the plan",
    }.get(p.next_limited_by, "auto-tune finds a plan that fits it")


def batch_ticks(lo: int, hi: int) -> dict[str, Any]:
    """Ticks of a log batch axis at the powers of two from ``lo`` to ``hi``, as integers.

    Plotly's own log ticks read "8 9 | 1 | 2 3 ... | 10 | 2 3": 20-70 labelled as 2-7, and
    0.8 and 0.9, batches that do not exist.

    >>> batch_ticks(3, 40)["ticktext"]
    ['2', '4', '8', '16', '32', '64']
    >>> batch_ticks(1, 5000)["ticktext"][-2:]
    ['4,096', '8,192']
    >>> batch_ticks(1, 65536)["ticktext"][-2:]
    ['16,384', '65,536']
    """
    first = 1 << max(0, int(lo).bit_length() - 1)
    vals = [first]
    while vals[-1] < hi:
        vals.append(vals[-1] * 2)
    if len(vals) > 14:  # every other power on a wide range
        vals = vals[::2]
    return {"tickmode": "array", "tickvals": vals, "ticktext": [f"{v:,}" for v in vals]}


def batch_figure(p: BatchPlot) -> go.Figure:
    """Peak device memory (and predicted step time) against the batch size.

    The budget is a horizontal line; vertical lines mark the largest batch that fits
    without a plan, with the current plan, the bound no plan passes and the current batch.
    With ``plan_host_bytes`` and ``host_bytes`` a lower row shows the plan's host memory
    against the host limit, and the batch where the tuner found host memory to stop it.

    >>> fig = batch_figure(BatchPlot([1, 2, 4], [2**20, 2**21, 2**22], [1e-3, 2e-3, 4e-3],
    ...                              3 * 2**20, 2))
    >>> [t.name for t in fig.data]
    ['peak, no plan', 'step time, no plan', 'budget 3.0 MiB', 'fits up to batch 2']
    """
    fig = go.Figure()
    b = list(p.batches)
    host_row = p.plan_host_bytes is not None and p.host_bytes > 0
    tops = [p.device_bytes, *p.peak_bytes, *(p.plan_peak_bytes or ())]
    top = max(tops) if tops else 1
    fig.add_trace(_scatter(
        x=b, y=np.asarray(p.peak_bytes, dtype=np.float64) / MIB, mode="lines+markers",
        name="peak, no plan", line={"color": "#64748b", "width": 2},
        text=[f"batch {k}: peak {format_size(v)}" for k, v in zip(b, p.peak_bytes, strict=True)],
        hovertemplate="%{text}<extra></extra>"))
    if p.plan_peak_bytes is not None:
        fig.add_trace(_scatter(
            x=b, y=np.asarray(p.plan_peak_bytes, dtype=np.float64) / MIB, mode="lines+markers",
            name="peak, current plan", line={"color": "#2563eb", "width": 2},
            text=[f"batch {k}: peak with the plan {format_size(v)}"
                  for k, v in zip(b, p.plan_peak_bytes, strict=True)],
            hovertemplate="%{text}<extra></extra>"))
    fig.add_trace(_scatter(
        x=b, y=np.asarray(p.step_seconds, dtype=np.float64) * 1e3, mode="lines",
        name="step time, no plan", yaxis="y2", line={"color": "#9333ea", "dash": "dot"},
        text=[f"batch {k}: {s * 1e3:.3g} ms predicted" for k, s in
              zip(b, p.step_seconds, strict=True)],
        hovertemplate="%{text}<extra></extra>"))
    lo_b, hi_b = min(b, default=1), max(b, default=1)
    fig.add_trace(_scatter(
        x=[lo_b, hi_b], y=[p.device_bytes / MIB] * 2, mode="lines",
        name=f"budget {format_size(p.device_bytes)}", hoverinfo="skip",
        line={"color": "#b91c1c", "dash": "dash", "width": 1.5}))
    marks = [(p.max_without, f"fits up to batch {p.max_without}", "#64748b")]
    if p.plan_peak_bytes is not None:
        marks.append((p.max_with_plan, f"plan fits up to batch {p.max_with_plan}", "#2563eb"))
    if p.bound:
        marks.append((p.bound, f"no plan beyond batch {p.bound}", "#111827"))
    if p.current:
        marks.append((p.current, f"batch {p.current}", "#7c3aed"))
    if p.next_limited_by == "host":
        marks.append((p.next_batch, f"host memory stops batch {p.next_batch}", "#d97706"))
    ymax = top * 1.1 / MIB
    for k, (x, label, color) in enumerate(marks):
        if x:  # a trace, not a shape: shapes on a log axis take log coordinates
            h = ymax * (0.97 - 0.07 * k)
            fig.add_trace(_scatter(
                x=[x, x], y=[0, h], mode="lines+text", text=["", label], name=label,
                textposition="middle right", textfont={"size": 10, "color": color},
                line={"color": color, "width": 1.2, "dash": "dot"}, hoverinfo="skip",
                showlegend=False))
    vals, text = memory_ticks(ymax)
    fig.update_layout(
        height=420 if host_row else 320, margin={"l": 70, "r": 60, "t": 10, "b": 40},
        plot_bgcolor="#ffffff", hovermode="closest",
        legend={"orientation": "h", "y": -0.2, "x": 0},
        xaxis={"type": "log", "title": {"text": "batch size"}, "gridcolor": "#f1f5f9",
               **batch_ticks(lo_b, hi_b)},
        yaxis={"tickvals": vals, "ticktext": text, "tickmode": "array",
               "range": [0, ymax], "gridcolor": "#e5e7eb",
               "title": {"text": "peak device memory"}, "rangemode": "nonnegative"},
        yaxis2={"overlaying": "y", "side": "right", "title": {"text": "step time (ms)"},
                "showgrid": False, "rangemode": "tozero"},
    )
    if host_row:
        assert p.plan_host_bytes is not None  # for the type checker: host_row says so
        # the host limit (128 GiB by default) would flatten the device curves: its own row
        hv = np.asarray(p.plan_host_bytes, dtype=np.float64) / MIB
        fig.add_trace(_scatter(
            x=b, y=hv, mode="lines+markers", name="host, current plan", yaxis="y3",
            line={"color": "#d97706", "width": 2},
            text=[f"batch {k}: the plan holds {format_size(v)} on the host"
                  for k, v in zip(b, p.plan_host_bytes, strict=True)],
            hovertemplate="%{text}<extra></extra>"))
        fig.add_trace(_scatter(
            x=[lo_b, hi_b], y=[p.host_bytes / MIB] * 2, mode="lines", yaxis="y3",
            name=f"host limit {format_size(p.host_bytes)}", hoverinfo="skip",
            line={"color": "#92400e", "dash": "dash", "width": 1.5}))
        htop = max(float(hv.max(initial=0.0)), p.host_bytes / MIB) * 1.1 or 1.0
        hvals, htext = memory_ticks(htop, 3)
        fig.update_layout(
            yaxis={"domain": [0.36, 1]}, yaxis2={"domain": [0.36, 1]},
            # the batch axis under the lower row: under the upper one, its title sat on
            # the host row's limit line
            xaxis={"anchor": "y3"},
            yaxis3={"domain": [0, 0.26], "anchor": "x", "range": [0, htop],
                    "tickvals": hvals, "ticktext": htext, "tickmode": "array",
                    "gridcolor": "#e5e7eb", "title": {"text": "host memory"}},
            legend={"y": -0.14})
    return fig


def comparison_rows(summaries: Sequence[Any]) -> list[dict[str, Any]]:
    """Rows of the plan comparison table, one per :class:`lmscore.compare.PlanSummary`.

    Sizes are written as the summary above the views writes them
    (:func:`lmscore.units.format_bytes`), so the two can be read against each other.
    """
    from lmscore.units import format_bytes as format_size

    rows = []
    for s in summaries:
        rows.append({
            "plan": s.name,
            "peak": f"{format_size(s.peak_bytes)} (level {s.peak_level})",
            "host": format_size(s.host_peak_bytes),
            "swapped": f"{s.swapped_tensors} · {format_size(s.swap_bytes)}",
            "recomputed": (f"{s.recomputed_tensors} · {format_size(s.recompute_bytes)} "
                           f"({s.cloned_ops} ops)"),
            "overhead": f"{100 * s.overhead:.1f}%",
            "step": f"{s.step_seconds * 1e3:.3g} ms",
            "fits": "—" if s.fits is None else ("yes" if s.fits else "no"),
        })
    return rows
