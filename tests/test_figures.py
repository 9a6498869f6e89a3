"""The studio's figure builders: the level window op by op, swap marks, axes, comparisons."""

from __future__ import annotations

import numpy as np
import pytest

from lmscore.browse import DataEdges
from lmsviz import figures

MIB, GIB = 2**20, 2**30


def chain_ops(n: int) -> figures.OpTable:
    """n ops, one per level, all forward, op k producing k+1 KiB."""
    return figures.OpTable(
        names=[f"net/op{k}" for k in range(n)], types=["Relu"] * n, levels=list(range(n)),
        categories=["forward"] * n, shapes=["[1] float"] * n,
        nbytes=[(k + 1) * 1024 for k in range(n)])


def chain_edges(n: int, skip: int = 0) -> DataEdges:
    """k -> k+1 for every k, and k -> k+skip when skip > 1; each tensor (src+1) KiB."""
    pairs = [(k, k + 1) for k in range(n - 1)]
    if skip > 1:
        pairs += [(k, k + skip) for k in range(n - skip)]
    src = np.array([a for a, _ in pairs])
    return DataEdges(src, np.zeros(len(pairs), dtype=np.int64),
                     np.array([b for _, b in pairs]), (src + 1) * 1024)


def test_the_window_draws_exactly_its_ops_and_the_edges_touching_it():
    ops = chain_ops(10)
    pos = figures.op_positions(ops.levels, ops.categories)
    traces, note = figures.window_traces(ops, pos, chain_edges(10, skip=4), (3, 5))
    edges, rec, hover, points, marks = traces
    assert [int(i) for i in points.customdata] == [3, 4, 5]
    assert list(points.text) == ["net/op3", "net/op4", "net/op5"]  # few levels: labelled
    assert points.mode == "markers+text"
    # chain edges 2-3, 3-4, 4-5, 5-6 and skip edges 0-4, 1-5 (end in the window), 3-7,
    # 4-8, 5-9 (start in it): 9 segments of 3 points; 2-6 only passes over it
    assert len(edges.x) == 27 and len(hover.x) == 9
    assert "net/op3:0 · 4.0 KiB" in hover.hovertext[[t.split(" ·")[0] for t in
                                                      hover.hovertext].index("net/op3:0")]
    assert "levels 3–5: 3 ops" in note and "9 data edges" in note
    assert len(rec.x) == 0 and len(marks.x) == 0
    assert "level 4" in points.hovertext[1] and "5.0 KiB" in points.hovertext[1]


def test_a_window_with_too_many_ops_is_left_to_the_lanes():
    ops = chain_ops(50)
    pos = figures.op_positions(ops.levels, ops.categories)
    traces, note = figures.window_traces(ops, pos, chain_edges(50), (0, 30), max_ops=20)
    assert all(len(t.x) == 0 for t in traces)
    assert "31 ops" in note and "zoom in" in note
    traces, note = figures.window_traces(ops, pos, chain_edges(50), None)
    assert all(len(t.x) == 0 for t in traces) and note == ""


def test_the_window_keeps_the_largest_edges_and_says_so():
    ops = chain_ops(20)
    pos = figures.op_positions(ops.levels, ops.categories)
    traces, note = figures.window_traces(ops, pos, chain_edges(20), (0, 19), max_edges=3)
    hover = traces[figures.T_DETAIL_EDGE_HOVER - figures.T_DETAIL_EDGES]
    # the three largest tensors: op18 -> op19, op17 -> op18, op16 -> op17
    assert sorted(t.split(" ·")[0] for t in hover.hovertext) == [
        "net/op16:0", "net/op17:0", "net/op18:0"]
    assert "3 data edges (the 3 largest of 19)" in note


def test_a_wide_window_is_drawn_without_labels():
    ops = chain_ops(100)
    pos = figures.op_positions(ops.levels, ops.categories)
    traces, _ = figures.window_traces(ops, pos, None, (0, 99))
    assert traces[3].mode == "markers" and len(traces[3].x) == 100
    assert len(traces[0].x) == 0  # no edge table given


def test_swaps_of_one_level_get_their_own_heights_and_edges():
    ops = chain_ops(10)
    pos = figures.op_positions(ops.levels, ops.categories)
    # three tensors of op 2 swapped, each back in for op 8 after op 6
    swaps = [figures.SwapDraw(f"net/op2:{k}", 2, (((8,), 6),), nbytes=1024) for k in range(3)]
    edges, _, marks = figures.overlay_traces(swaps, pos)
    lane = figures.SWAP_LANE
    outs = sorted(y for x, y in zip(marks.x, marks.y, strict=True) if y > lane)
    ins = sorted(y for x, y in zip(marks.x, marks.y, strict=True) if y < lane)
    assert outs == pytest.approx([lane + 0.08, lane + 0.215, lane + 0.35])
    assert ins == pytest.approx([lane - 0.35, lane - 0.215, lane - 0.08])
    # producer->out, out->in, in->consumer per swap: 9 distinct segments
    segs = {tuple(np.round(edges.y[k:k + 2], 3)) for k in range(0, len(edges.y), 3)}
    assert len(edges.x) == 27 and len(segs) == 9
    # the hover as Plotly fills its template: the tensor's name only once, as customdata
    hover = [marks.hovertemplate.replace("%{text}", t).replace("%{customdata}", c)
             .replace("%{hovertext}", h).removesuffix("<extra></extra>")
             for t, c, h in zip(marks.text, marks.customdata, marks.hovertext, strict=True)]
    assert hover[0] == "swap-out of net/op2:0 · 1.0 KiB<br>level 2 (to host)"
    assert hover[1] == "swap-in 0 of net/op2:0 · 1.0 KiB<br>trigger level 6, serves 1 op(s)"
    assert list(marks.customdata) == [f"net/op2:{k}" for k in range(3) for _ in range(2)]
    traces, _ = figures.window_traces(ops, pos, None, (5, 9), swaps)
    swap_marks = traces[4]
    assert list(swap_marks.x) == [6.0, 6.0, 6.0]  # the swap-ins, not the swap-outs at 2
    assert all(t.startswith("in net/op2:") for t in swap_marks.text)


def test_recompute_clones_are_drawn_before_their_reader_with_their_edges():
    ops = chain_ops(10)
    pos = figures.op_positions(ops.levels, ops.categories)
    r = figures.RecomputeDraw("net/op3:0", ("net/op2", "net/op3"), inputs=(1,),
                              consumers=(8,), trigger=6, nbytes=4096)
    traces, _ = figures.window_traces(ops, pos, None, (6, 9), recomputes=[r])
    rec, marks = traces[1], traces[4]
    assert list(np.round(marks.x, 3)) == [7.4, 7.85]
    assert list(marks.marker.symbol) == ["triangle-up", "triangle-up"]
    assert "recomputes net/op3:0 · 4.0 KiB" in marks.hovertext[0]
    # input -> clone 1, clone 1 -> clone 2, clone 2 -> reader, trigger -> clone 1
    assert len(rec.x) == 12
    far, _ = figures.window_traces(ops, pos, None, (0, 3), recomputes=[r])
    assert len(far[4].x) == 0


def test_the_memory_axis_reads_gib_and_mib():
    big = figures.Curves(before=[0, 40_000 * MIB])
    axis = figures.memory_axis(big)
    assert axis["ticktext"] == ["0", "10 GiB", "20 GiB", "30 GiB", "40 GiB"]
    assert axis["tickvals"][1] == 10 * 1024
    small = figures.memory_axis(figures.Curves(before=[0, 90 * MIB]))
    assert small["ticktext"][-1] == "100 MiB" and "GiB" not in "".join(small["ticktext"])
    fig, _ = figures.studio_figure(chain_ops(3), figures.op_positions([0, 1, 2], ["forward"] * 3),
                                   figures.Curves(before=[0, 20 * GIB, 5 * GIB]))
    assert list(fig.layout.yaxis2.ticktext)[1:3] == ["5 GiB", "10 GiB"]
    before = fig.data[figures.T_BEFORE]
    assert before.customdata[1] == 20.0 and before.hovertemplate.startswith(
        "device, before, level %{x}: %{customdata:.2f} GiB")
    host = figures.memory_traces(figures.Curves(before=[0, 1], host=[0, 3 * MIB]))[2]
    assert list(host.customdata) == [0.0, 3.0] and "%{customdata:.1f} MiB" in host.hovertemplate


def test_the_curve_hover_says_what_dominates_a_level():
    text = figures.level_hover([3 * MIB, 5 * GIB],
                               [[("kept a:0", 2 * MIB)], [("swap-in of b:0", 4 * GIB),
                                                          ("recomputed c:0", MIB)]])
    assert text[1] == "5.00 GiB<br>swap-in of b:0: 4.00 GiB<br>recomputed c:0: 1.0 MiB"
    curves = figures.Curves(before=[3 * MIB, 5 * GIB], after=[1, 2], hover_after=["x", "y"],
                            fixed=MIB)
    traces = figures.memory_traces(curves)
    assert list(traces[1].text) == ["x", "y"]
    # the curve, the level and what every level holds: once, in the template
    assert traces[1].hovertemplate == ("device, after, level %{x}: %{text}"
                                       "<br>persistent + inputs: 1.0 MiB<extra></extra>")
    assert "persistent" not in figures.memory_traces(
        figures.Curves(before=[1], hover_before=["x"]))[0].hovertemplate


def test_the_studio_figure_zooms_to_a_window():
    ops = chain_ops(30)
    pos = figures.op_positions(ops.levels, ops.categories)
    fig, note = figures.studio_figure(ops, pos, figures.Curves(before=[1] * 30),
                                      edges=chain_edges(30), window=(10, 14))
    assert len(fig.data) == figures.N_TRACES
    assert list(fig.layout.xaxis.range) == [9.5, 14.5]
    assert [int(i) for i in fig.data[figures.T_DETAIL_OPS].customdata] == [10, 11, 12, 13, 14]
    assert "levels 10–14" in note
    fig, note = figures.studio_figure(ops, pos, figures.Curves(before=[1] * 30))
    assert len(fig.data[figures.T_DETAIL_OPS].x) == 0 and note == ""


def test_a_27k_op_window_sends_only_its_ops():
    n = 27_000
    levels = [k // 9 for k in range(n)]  # 3000 levels of 9 ops
    ops = figures.OpTable(names=[f"o{k}" for k in range(n)], types=["Relu"] * n,
                          levels=levels, categories=["forward"] * n, shapes=[""] * n,
                          nbytes=[4] * n)
    pos = figures.op_positions(ops.levels, ops.categories)
    src = np.arange(n - 9)
    edges = DataEdges(src, np.zeros(n - 9, dtype=np.int64), src + 9, np.full(n - 9, 4))
    fig, note = figures.studio_figure(ops, pos, figures.Curves(before=[1] * 3000), edges=edges,
                                      window=(1000, 1019), max_points=20_000)
    assert "aggregated" in note and "levels 1000–1019: 180 ops" in note
    assert len(fig.data[figures.T_DETAIL_OPS].x) == 180
    assert sum(len(t.x) for t in fig.data[: len(figures.CATEGORIES)]) <= 20_000
    # 180 edges out of the window's ops and 9 into its first level
    assert len(fig.data[figures.T_DETAIL_EDGE_HOVER].x) == 189


def test_compare_and_batch_figures():
    fig = figures.compare_figure([("no plan", [0, 3 * GIB, GIB]), ("current", [0, GIB, GIB])],
                                 2 * GIB, level=1)
    assert [t.name for t in fig.data] == ["no plan", "current", "budget 2.00 GiB"]
    assert "GiB" in fig.layout.yaxis.ticktext[-1]
    plot = figures.BatchPlot([1, 2, 4, 8], [GIB, 2 * GIB, 4 * GIB, 8 * GIB],
                             [0.1, 0.2, 0.4, 0.8], 5 * GIB, 4,
                             plan_peak_bytes=[GIB, GIB, 2 * GIB, 3 * GIB], max_with_plan=8,
                             bound=16, current=2)
    fig = figures.batch_figure(plot)
    names = [t.name for t in fig.data]
    assert names == ["peak, no plan", "peak, current plan", "step time, no plan",
                     "budget 5.00 GiB", "fits up to batch 4", "plan fits up to batch 8",
                     "no plan beyond batch 16", "batch 2"]
    assert list(fig.data[4].x) == [4, 4] and fig.layout.xaxis.type == "log"
    assert list(fig.data[0].y) == [1024, 2048, 4096, 8192]


def test_memory_axes_reset_to_zero_not_below():
    """A double-click resets an axis to its autorange, which went below 0 (-292.5 MiB on
    the batch plot, -56.3 MiB on the studio's memory row)."""
    curves = figures.Curves(before=[0, 3 * GIB, GIB])
    studio, _ = figures.studio_figure(chain_ops(3), figures.op_positions(
        [0, 1, 2], ["forward"] * 3), curves)
    compare = figures.compare_figure([("no plan", [0, 3 * GIB, GIB])], 2 * GIB, level=1)
    plot = figures.batch_figure(figures.BatchPlot([1, 2], [GIB, 2 * GIB], [0.1, 0.2], 5 * GIB, 2))
    assert studio.layout.yaxis2.rangemode == compare.layout.yaxis.rangemode == (
        plot.layout.yaxis.rangemode) == "nonnegative"


def test_comparison_rows():
    from lmscore.compare import PlanSummary

    s = PlanSummary("current", 3 * GIB, 7, MIB, 2, 2 * MIB, 1, 3, 4096, 1.0, 1.25, 0.25, True,
                    (), ())
    (row,) = figures.comparison_rows([s])
    # sizes as the summary writes them
    assert row == {"plan": "current", "peak": "3.00 GiB (level 7)", "host": "1.00 MiB",
                   "swapped": "2 · 2.00 MiB", "recomputed": "1 · 4.00 KiB (3 ops)",
                   "overhead": "25.0%", "step": "1.25e+03 ms", "fits": "yes"}


def test_the_legend_names_every_mark_of_the_figure():
    meanings = " ".join(m for _, _, m in figures.LEGEND)
    for word in ("input", "persistent", "forward", "backward", "update", "aggregated",
                 "swap-out", "swap-in", "trigger", "recomputing clone", "data edge", "budget",
                 "peaks", "host memory", "selected level"):
        assert word in meanings, word
    assert "level" in figures.LEVEL_HELP


def _every_figure() -> list:
    """The studio figure (lanes, swaps, recomputes, curves, window, selection) and the
    comparison and batch figures, as JSON."""
    import json

    import plotly.io as pio

    ops = chain_ops(12)
    pos = figures.op_positions(ops.levels, ops.categories)
    swaps = [figures.SwapDraw("net/op2:0", 2, (((8,), 6),), nbytes=1024)]
    recomputes = [figures.RecomputeDraw("net/op3:0", ("net/op3",), (2,), (9,), 7)]
    curves = figures.Curves(before=[k * MIB for k in range(12)], after=[MIB] * 12,
                            host=[0] * 6 + [GIB] * 6, budget=GIB, peak_before=(11, 11 * MIB),
                            peak_after=(0, MIB), hover_after=[f"l{k}" for k in range(12)])
    hl = figures.Highlight(producer=2, consumers=(3, 8), op=4, level=5,
                           lifetime=(2, 8, 1024), tensor="net/op2:0")
    out = []
    for window in (None, (4, 9)):
        fig, _ = figures.studio_figure(ops, pos, curves, swaps, hl, uirevision="u",
                                       edges=chain_edges(12, skip=3), window=window,
                                       recomputes=recomputes)
        out.append(fig)
    out.append(figures.studio_figure(chain_ops(300), figures.op_positions(
        list(range(300)), ["forward"] * 300), figures.Curves(before=[1] * 300),
        max_points=50)[0])
    out.append(figures.compare_figure([("no plan", [0, 3 * GIB]), ("current", [0, GIB])],
                                      2 * GIB, level=1))
    out.append(figures.batch_figure(figures.BatchPlot(
        [1, 2, 4], [GIB, 2 * GIB, 4 * GIB], [0.1, 0.2, 0.4], 3 * GIB, 2,
        plan_peak_bytes=[GIB, GIB, 2 * GIB], max_with_plan=4, bound=8, current=2)))
    return [json.loads(pio.to_json(f)) for f in out]


def test_figures_are_what_plotly_would_check_them_to_be(monkeypatch):
    # the figures are built without Plotly's per-point checks (figures.VALIDATE): checked,
    # every one of them comes out the same, and a property Plotly does not know fails
    fast = _every_figure()
    monkeypatch.setattr(figures, "VALIDATE", True)
    assert _every_figure() == fast
    with pytest.raises(ValueError):
        figures._scatter(x=[1], colour="red")


def test_the_batch_axis_reads_whole_batches_under_the_lowest_row():
    """Plotly's log ticks read "8 9 | 1 | 2 3 ... | 10 | 2 3" (20-70 labelled 2-7, and
    0.8, 0.9), and with a host row the axis title sat on the host limit line."""
    b = [1, 2, 4, 8, 16, 32, 46]
    plot = figures.BatchPlot(b, [k * GIB for k in b], [0.01 * k for k in b], 40 * GIB, 32,
                             plan_peak_bytes=[k * GIB // 2 for k in b], max_with_plan=46,
                             plan_host_bytes=[k * GIB for k in b], host_bytes=128 * GIB)
    x = figures.batch_figure(plot).layout.xaxis
    assert list(x.tickvals) == [1, 2, 4, 8, 16, 32, 64]
    assert list(x.ticktext) == ["1", "2", "4", "8", "16", "32", "64"]
    assert x.anchor == "y3"
