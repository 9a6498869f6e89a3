"""The web app's callbacks, figures and server state as plain functions (no browser)."""

from __future__ import annotations

import base64
import io
import json
import pathlib
import subprocess
import sys
import zipfile
from dataclasses import dataclass

import numpy as np
import pytest

from lmscore import samples
from lmscore.errors import GraphError
from lmscore.plan import fingerprint, plan_from_json
from lmscore.units import format_bytes
from lmsviz import app as lms_app
from lmsviz import (
    callbacks,
    compare_panel,
    edits,
    figures,
    files,
    rendering,
    results,
    state,
    tuning,
)

REPO = pathlib.Path(__file__).resolve().parent.parent
MIB = 2**20


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> state.AppContext:
    return state.new_context("mlp", None, upload_cap_bytes=8 * MIB,
                             data_dir=tmp_path_factory.mktemp("data"))


@pytest.fixture()
def fresh(tmp_path: pathlib.Path) -> state.AppContext:
    """A context with its own data directory (plans saved by one test stay there)."""
    return state.new_context("mlp", None, upload_cap_bytes=8 * MIB, data_dir=tmp_path)


def session(c: state.AppContext) -> dict:
    return state.new_session(c)


def gate(name: str, data: bytes) -> dict:
    return {"filename": name, "size": len(data),
            "contents": "data:application/octet-stream;base64," + base64.b64encode(data).decode()}


def swappable_tensor(c: state.AppContext, s: dict, min_mib: float = 0) -> str:
    """A hotspot row that a hand toggle can swap (searching a few levels)."""
    loaded = c.resolve(s["graph"])
    base = results.base_of(c, loaded, s["settings"]["batch"])
    plan = results.plan_of(c, loaded, None)
    for level in range(len(base.sim.device_curve)):
        for row in rendering.hotspot_rows(base, plan, level):
            if row["swap"] == rendering.SWAP_OFF and row["mib"] >= min_mib:
                up = edits.toggle_swap(c, s["graph"], s["settings"], s["plan"], s["view"],
                                    row["id"])
                if not up.error:
                    return row["id"]
    raise AssertionError("no tensor of the sample can be swapped by hand")


# --- figures ----------------------------------------------------------------------------


def test_op_positions_spread_ops_of_one_level_within_their_lane():
    x, y = figures.op_positions([0, 0, 0, 1], ["forward", "forward", "forward", "backward"])
    assert x.tolist() == [0, 0, 0, 1]
    assert y[0] < y[1] < y[2]
    assert abs(y[1] - 2) < 1e-9 and y[3] == 3.0
    assert all(1.6 <= v <= 2.4 for v in y[:3])


def _ops(n: int, levels: int) -> figures.OpTable:
    cats = [figures.CATEGORIES[i % 5] for i in range(n)]
    return figures.OpTable(
        names=[f"op{i}" for i in range(n)], types=["Relu"] * n,
        levels=[i % levels for i in range(n)], categories=cats, shapes=["[2,2] float"] * n,
        nbytes=[16 * (i + 1) for i in range(n)],
    )


def test_ordering_draws_every_op_below_the_threshold():
    ops = _ops(200, 40)
    traces, note = figures.ordering_traces(ops, figures.op_positions(ops.levels, ops.categories),
                                           max_points=1000)
    assert note == ""
    assert sum(len(t.x) for t in traces) == 200
    assert sorted(int(i) for t in traces for i in t.customdata) == list(range(200))
    assert "op7" in traces[2].text[1] and "level 7" in traces[2].text[1]


def test_ordering_aggregates_above_the_threshold_and_says_so():
    ops = _ops(5000, 1000)
    traces, note = figures.ordering_traces(ops, figures.op_positions(ops.levels, ops.categories),
                                           max_points=600)
    shown = sum(len(t.x) for t in traces)
    assert 0 < shown <= 600
    assert "5,000 ops" in note and "aggregated" in note
    assert all(int(c) == -1 for t in traces for c in t.customdata)
    # every op is counted once
    counts = [int(txt.split("<br>")[1].split()[0]) for t in traces for txt in t.text]
    assert sum(counts) == 5000


def test_overlay_draws_swap_ops_and_rewired_edges():
    pos = (np.array([0, 1, 5, 6, 8]), np.array([2.0, 2.0, 3.0, 3.0, 3.0]))
    draw = figures.SwapDraw("a:0", 0, (((3, 4), 2), ((4,), None)))
    edges, triggers, swap_ops = figures.overlay_traces([draw], pos)
    assert len(swap_ops.x) == 3  # one swap-out, two swap-ins
    assert list(swap_ops.x) == [0.0, 5.0, 1.0]  # the synchronous one sits after the producer
    # producer->out, out->in0, in0->c3, in0->c4, out->in1, in1->c4: 6 segments of 3 points
    assert len(edges.x) == 18
    assert len(triggers.x) == 3


def test_memory_range_leaves_a_far_budget_off_scale():
    near = figures.Curves(before=[0, 100 * MIB], budget=120 * MIB)
    far = figures.Curves(before=[0, 100 * MIB], budget=2**40)
    assert figures.memory_range(near)[1] >= 120
    assert figures.memory_range(far)[1] == pytest.approx(112.0)
    names = [t.name for t in figures.memory_traces(far)]
    assert any("above the chart" in (n or "") for n in names)


def test_studio_figure_has_its_traces_at_fixed_positions():
    ops = _ops(30, 10)
    pos = figures.op_positions(ops.levels, ops.categories)
    curves = figures.Curves(before=[1, 2, 3] * 3 + [0], after=[1] * 10, host=[0] * 10,
                            peak_before=(2, 3), peak_after=(0, 1), budget=10)
    hl = figures.Highlight(producer=0, consumers=(1, 2), op=3, level=4, lifetime=(1, 4, 99),
                           tensor="op0:0")
    fig, note = figures.studio_figure(ops, pos, curves, [], hl, uirevision="k")
    assert len(fig.data) == figures.N_TRACES and note == ""
    assert fig.data[figures.T_BEFORE].name == "device, before"
    assert fig.data[figures.T_AFTER].name == "device, after"
    shapes = fig.layout.shapes
    assert shapes[0].type == "line" and shapes[0].x0 == 4  # the level
    assert [sh.type for sh in shapes[1:5]] == ["circle", "rect", "rect", "circle"]
    assert shapes[1].xanchor == pos[0][0] and shapes[1].xsizemode == "pixel"
    band = shapes[5]
    assert (band.xref, band.x0, band.x1, band.y1) == ("x2", 1, 4, 99 / MIB)
    assert fig.data[figures.T_BEFORE].yaxis == "y2" and fig.data[0].yaxis == "y"


# --- server state -----------------------------------------------------------------------


def test_bounded_cache_evicts_the_least_recently_used():
    c = state.BoundedCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # a is now the most recent
    c.put("c", 3)
    assert c.get("b") is None and c.get("a") == 1 and c.get("c") == 3
    assert c.get_or_compute("d", lambda: 4) == 4 and len(c) == 2


def test_bounded_cache_bounds_the_total_weight_and_keeps_the_newest():
    c = state.BoundedCache(10, max_weight=100)
    c.put("a", 1, 40)
    c.put("b", 2, 40)
    c.get("a")  # b is now the least recently used
    c.put("c", 3, 30)  # 110 > 100: b goes
    assert (c.get("b"), c.get("a"), c.get("c"), c.weight) == (None, 1, 3, 70)
    c.put("a", 4, 10)  # re-putting a key replaces its weight
    assert c.weight == 40 and len(c) == 2
    c.put("huge", 5, 500)  # over the bound alone: kept, everything else evicted
    assert (len(c), c.weight, c.get("huge")) == (1, 500, 5)


def test_bounded_cache_counts_the_weight_it_evicts():
    c = state.BoundedCache(2, max_weight=100)
    c.put("a", 1, 30)
    c.put("a", 2, 50)  # replaced, not evicted
    c.put("b", 3, 40)
    c.put("c", 4, 20)  # count bound: a goes
    c.put("d", 5, 90)  # weight bound: b and c go
    assert (c.evicted, c.weight) == (50 + 40 + 20, 90)


class _Gc:
    """What :func:`state.settle_heap` asks of the garbage collector, recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        return lambda *a: self.calls.append(name)


def test_settle_heap_freezes_results_and_collects_once_enough_was_evicted(
        tmp_path, monkeypatch):
    ctx = state.new_context("mlp", None, upload_cap_bytes=2**20, data_dir=tmp_path)
    fake = _Gc()
    monkeypatch.setattr(state, "gc", fake)
    state.settle_heap(ctx)
    assert fake.calls == []  # off unless the server asks: freezing is process-wide
    ctx.freeze_results = True
    state.settle_heap(ctx)
    assert fake.calls == ["freeze"]
    live = ctx.results.weight + ctx.graphs.weight
    ctx.results.evicted += state.COLLECT_AFTER_EVICTED * live  # not yet more than that
    fake.calls.clear()
    state.settle_heap(ctx)
    assert fake.calls == ["freeze"]
    ctx.results.evicted += 1
    fake.calls.clear()
    state.settle_heap(ctx)
    assert fake.calls == ["unfreeze", "collect", "freeze"]
    fake.calls.clear()
    state.settle_heap(ctx)  # counted from that collection on
    assert fake.calls == ["freeze"]


def test_a_new_result_settles_the_heap(tmp_path, monkeypatch):
    ctx = state.new_context("mlp", None, upload_cap_bytes=2**20, data_dir=tmp_path)
    settled: list[int] = []
    monkeypatch.setattr(state, "settle_heap", lambda c: settled.append(len(c.results)))
    assert ctx.compute(("k",), lambda: 7, "test") == 7 and settled == [1]
    assert ctx.compute(("k",), lambda: 8, "test") == 7 and settled == [1]  # a hit: no


def test_the_caches_of_the_server_are_bounded_by_its_op_limit(tmp_path):
    # mlp: 307 ops, lstm: 395 in the IR (598 with its loop bodies), vgg16: 694
    ctx = state.new_context("mlp", None, upload_cap_bytes=2**20, data_dir=tmp_path,
                            max_ops=700)
    assert ctx.graphs.max_weight == ctx.results.max_weight == 1400
    state.load_sample(ctx, "lstm")
    assert ctx.graphs.weight == 307 + 395
    with pytest.raises(GraphError, match=r"unet3d.pb: [0-9,]+ ops .* over the limit of 700"):
        state.load_sample(ctx, "unet3d")
    state.load_sample(ctx, "vgg16")  # 307 + 395 + 694 = 1396
    assert len(ctx.graphs) == 3 and ctx.graphs.weight == 1396
    state.load_sample(ctx, "lstm")
    assert ctx.graphs.weight == 1396  # the same graph is not counted twice
    ctx.graphs.put("another", None, 100)  # over 1400: the least recently used (mlp) goes
    assert len(ctx.graphs) == 3 and ctx.graphs.weight == 395 + 694 + 100


def test_new_context_loads_a_sample_with_its_batch_size(ctx):
    assert ctx.initial.origin == "sample:mlp" and ctx.initial_batch == 32
    s = session(ctx)
    assert s["graph"]["ops"] == 307 and s["settings"]["batch"] == 32
    assert s["plan"]["json"] is None and s["view"] == state.empty_view()


def test_new_context_refuses_a_missing_file(tmp_path):

    with pytest.raises(GraphError, match="no such file"):
        state.new_context(str(tmp_path / "nope.pb"), None, upload_cap_bytes=MIB,
                          data_dir=tmp_path)


@pytest.mark.parametrize("name, data, why", [
    ("garbage.pb", b"\x07\xff\x00not a graph at all" * 20, "not a GraphDef"),
    ("notes.txt", b"hello world", "not a GraphDef"),
    ("picture.png", b"\x89PNG\r\n", "not a graph file"),
    ("empty.pb", b"", "empty"),
    ("big.pb", b"\0" * (8 * MIB + 1), "over the upload limit"),
    ("model.zip", b"PK\x03\x04broken", "unreadable zip"),
    ("plan.pb", b'{"version": 2, "graph": "x", "swaps": []}', "a plan (JSON), not a graph"),
])
def test_bad_uploads_are_refused_with_a_clear_message(ctx, name, data, why):
    up = edits.upload_graph(ctx, gate(name, data), session(ctx)["settings"])
    assert up.error and why in up.message and up.graph is None
    assert name in up.message


def test_an_upload_refused_by_the_browser_gate_never_reaches_the_parser(ctx):
    up = edits.upload_graph(ctx, {"filename": "huge.pb", "size": 9 * MIB, "refused": True},
                         session(ctx)["settings"])
    assert up.error and "over the upload limit of 8.00 MiB" in up.message


def test_a_zip_bomb_is_refused_before_unpacking(tmp_path):
    c = state.new_context("mlp", None, upload_cap_bytes=64 * 1024, data_dir=tmp_path)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("m/saved_model.pb", b"\0" * (2 * MIB))
    up = edits.upload_graph(c, gate("m.zip", buf.getvalue()), session(c)["settings"])
    assert up.error and "unpacks to" in up.message


def test_an_uploaded_graph_is_kept_and_found_again_after_a_restart(tmp_path):
    c = state.new_context("mlp", None, upload_cap_bytes=8 * MIB, data_dir=tmp_path)
    data = (samples.sample_dir() / "lstm.pb").read_bytes()
    s = session(c)
    up = edits.upload_graph(c, gate("my_step.pb", data), s["settings"])
    assert not up.error and up.graph["origin"] == "upload" and up.graph["name"] == "my_step.pb"
    assert up.settings["batch"] == 32  # an upload keeps the session's batch size
    assert list((tmp_path / "uploads").iterdir())
    restarted = state.new_context("mlp", None, upload_cap_bytes=8 * MIB, data_dir=tmp_path)
    loaded = restarted.resolve(up.graph)
    assert len(loaded.graph.ops) == 395
    options, value = rendering.picker(up.graph)
    assert value.startswith("upload:") and options[0]["label"].startswith("my_step.pb")


def test_a_text_graphdef_upload_is_read(ctx):
    from google.protobuf import text_format
    from tensorboard.compat.proto import graph_pb2

    gd = graph_pb2.GraphDef()
    gd.ParseFromString((samples.sample_dir() / "mlp.pb").read_bytes())
    up = edits.upload_graph(ctx, gate("step.pbtxt", text_format.MessageToString(gd).encode()),
                         session(ctx)["settings"])
    assert not up.error and up.graph["ops"] == 307


def test_a_forged_graph_reference_is_not_read_from_disk(ctx):
    from lmscore.errors import GraphError

    for ref in ({"key": "x", "origin": "file", "name": "/etc/passwd"},
                {"key": "../../etc/passwd", "origin": "upload", "name": "p"},
                {"key": "x", "origin": "sample:nonexistent", "name": "p"}):
        with pytest.raises(GraphError):
            ctx.resolve(ref)


# --- actions ----------------------------------------------------------------------------


def test_choose_a_sample_takes_its_batch_size(ctx):
    s = session(ctx)
    up = edits.choose_graph(ctx, "sample:lstm", s["graph"], s["settings"])
    assert up.graph["name"] == "lstm.pb" and up.settings["batch"] == 16 and up.controls
    assert up.view == state.empty_view() and "395 ops" in up.message


def test_batch_and_budget_are_validated(ctx):
    settings = session(ctx)["settings"]
    assert edits.set_batch(settings, 64).settings["batch"] == 64
    for bad in (0, -3, "x", 2.5, None):
        up = edits.set_batch(settings, bad)
        assert up.error and up.settings is None and up.controls
    assert edits.set_budget(settings, "8GiB").settings["budget"] == "8GiB"
    up = edits.set_budget(settings, "lots")
    assert up.error and "not a size" in up.message


def test_a_device_preset_brings_its_memory_as_the_budget(ctx):
    settings = session(ctx)["settings"]
    devices, links = state.presets()
    other = next(d for d in devices if d != settings["device"])
    up = edits.set_presets(settings, other, settings["link"])
    assert up.settings["device"] == other
    memory = getattr(devices[other], "memory_bytes", None)
    if memory:
        from lmscore.units import parse_bytes

        assert parse_bytes(up.settings["budget"]) == memory
    assert edits.set_presets(settings, "no-such-device", settings["link"]).settings is None


def test_apply_knobs_makes_a_plan_and_saves_it(fresh):
    s = session(fresh)
    knobs = {"threshold": 5, "ahead": 1, "groupby": 5, "sync_mode": 0}
    up = edits.control(fresh, "knobs-apply", {
        f"knob-{k.replace('sync_mode', 'sync')}": v for k, v in knobs.items()}, s)
    assert not up.error and up.plan["source"] == "knobs" and up.plan["swaps"] > 0
    plan = plan_from_json(up.plan["json"])
    assert plan.params["threshold"] == 5
    saved = fresh.data_dir / "plans" / s["tab"] / f"{s['graph']['fingerprint']}.json"
    assert saved.read_text() == up.plan["json"]
    # a restarted server gives a new tab no plan: only the tab that made it gets it back
    restarted = state.new_context("mlp", None, upload_cap_bytes=MIB, data_dir=fresh.data_dir)
    assert session(restarted)["plan"]["json"] is None
    assert state.plan_text(restarted.saved_plan(s["tab"], restarted.initial)) == up.plan["json"]
    assert restarted.saved_plan(session(restarted)["tab"], restarted.initial) is None
    bad = edits.apply_knobs(fresh, s["graph"], s["settings"], {**knobs, "threshold": 0})
    assert bad.error and "threshold" in bad.message and bad.plan is None
    assert edits.apply_knobs(fresh, s["graph"], s["settings"], {**knobs, "ahead": "x"}).error


def test_toggle_adds_then_removes_a_swap_and_refuses_what_cannot_be_swapped(fresh):
    c = state.new_context("lstm", None, upload_cap_bytes=MIB, data_dir=fresh.data_dir)
    s = session(c)
    tensor = swappable_tensor(c, s)
    up = edits.toggle_swap(c, s["graph"], s["settings"], s["plan"], s["view"], tensor)
    assert not up.error and tensor in plan_from_json(up.plan["json"]).swapped()
    assert up.view["tensor"] == tensor
    r = rendering.render(c, {**s, "plan": up.plan}, full=True)
    assert r.figure.data[figures.T_AFTER].y is not None and len(r.figure.data[figures.T_AFTER].y)
    down = edits.toggle_swap(c, s["graph"], s["settings"], up.plan, s["view"], tensor)
    assert not down.error and plan_from_json(down.plan["json"]).swaps == ()
    loaded = c.resolve(s["graph"])
    base = results.base_of(c, loaded, s["settings"]["batch"])
    rows = rendering.hotspot_rows(base, results.plan_of(c, loaded, None), base.sim.peak_level)
    stuck = next(r for r in rows if r["swap"] == rendering.SWAP_NO)
    no = edits.toggle_swap(c, s["graph"], s["settings"], s["plan"], s["view"], stuck["tensor"])
    assert no.error and "cannot be swapped" in no.message and no.plan is None


def test_trigger_and_regroup_edits(fresh):
    s = session(fresh)
    up = edits.apply_knobs(fresh, s["graph"], s["settings"],
                        {"threshold": 2, "ahead": 1, "groupby": 0, "sync_mode": 0})
    plan = plan_from_json(up.plan["json"])
    swap = max(plan.swaps, key=lambda w: sum(len(g.consumers) for g in w.swap_ins))
    sync = edits.set_trigger(fresh, s["graph"], up.plan, swap.tensor, 0, None)
    assert not sync.error and "synchronous" in sync.message
    moved = plan_from_json(sync.plan["json"]).swaps[plan.swaps.index(swap)]
    assert moved.swap_ins[0].trigger is None
    one = edits.regroup_swap(fresh, s["graph"], up.plan, swap.tensor, None)
    assert not one.error and "1 swap-in group" in one.message
    loaded = fresh.resolve(s["graph"])
    producer = loaded.graph.index[swap.tensor.split(":")[0]]
    bad = edits.set_trigger(fresh, s["graph"], up.plan, swap.tensor, 0, producer)
    assert bad.error and "edit refused" in bad.message and bad.plan is None
    assert edits.set_trigger(fresh, s["graph"], up.plan, None, 0, None).error
    assert edits.regroup_swap(fresh, s["graph"], up.plan, swap.tensor, -1).error
    assert edits.regroup_swap(fresh, s["graph"], up.plan, "nope:0", 3).error


def test_plan_file_load_is_checked_and_reset_empties_the_plan(fresh):
    s = session(fresh)
    up = edits.apply_knobs(fresh, s["graph"], s["settings"],
                        {"threshold": 5, "ahead": 1, "groupby": 5, "sync_mode": 0})
    good = edits.load_plan_file(fresh, s["graph"], gate("p.json", up.plan["json"].encode()))
    assert not good.error and good.plan["source"] == "file"
    for name, data, why in (
        ("p.json", b"{not json", "not JSON"),
        ("p.json", b"\xff\xfe", "binary"),
        ("p.json", json.dumps({"version": 1, "graph": "0" * 16, "swaps": []}).encode(),
         "another graph"),
    ):
        bad = edits.load_plan_file(fresh, s["graph"], gate(name, data))
        assert bad.error and why in bad.message and bad.plan is None
    reset = edits.reset_plan(fresh, s["graph"])
    assert plan_from_json(reset.plan["json"]).swaps == () and reset.plan["source"] == "none"


def test_select_and_click(ctx):
    s = session(ctx)
    view = s["view"]
    assert edits.select_level(view, 7.4, 38).view["level"] == 7
    assert edits.select_level(view, 999, 38).view["level"] == 37
    assert edits.select_tensor(view, "a:0").view["tensor"] == "a:0"
    # an op is found from its lane trace and its index there (what the click carries)
    import lmscore

    g = ctx.resolve(s["graph"]).graph
    ordering = lmscore.order(g)
    forward = [i for i, c in enumerate(ordering.categories) if c == "forward"]
    op = forward[3]
    click = {"points": [{"curveNumber": figures.CATEGORIES.index("forward"), "pointNumber": 3,
                         "x": ordering.levels[op]}]}
    up = edits.click_figure(ctx, view, click, s["graph"])
    assert up.view == {"level": ordering.levels[op], "tensor": None, "op": op}
    assert g.ops[op].name in up.message
    click["points"][0]["x"] += 1  # not where that op is: no op picked
    assert edits.click_figure(ctx, view, click, s["graph"]).view["op"] is None
    click = {"points": [{"curveNumber": figures.T_SWAP_OPS, "x": 3, "customdata": "t:0"}]}
    assert edits.click_figure(ctx, view, click, s["graph"]).view["tensor"] == "t:0"
    click = {"points": [{"curveNumber": figures.T_BEFORE, "x": 9}]}
    assert edits.click_figure(ctx, view, click, s["graph"]).view == {
        "level": 9, "tensor": None, "op": None}


@dataclass(frozen=True)
class FakeResult:
    plan: object
    fits: bool = True
    budget_bytes: int = 100
    predicted_peak_bytes: int = 90
    predicted_overhead: float = 0.125
    swapped_tensors: int = 3
    swap_bytes: int = 1000
    message: str = "fits with 3 swaps"


class FakeTuner:
    def __init__(self, ctx: state.AppContext):
        self.ctx = ctx
        self.calls: list = []

    def tune(self, graph, batch_size, budget_bytes, *, device, link, progress, **kw):
        from lmscore.plan import plan_from_params

        self.calls.append((batch_size, budget_bytes, device, link))
        for k in range(5):
            progress(k / 4, f"step {k}")
        return FakeResult(plan_from_params(graph, batch_size))


def test_run_tune_reports_progress_and_its_plan_is_accepted(fresh):
    s = session(fresh)
    seen: list = []
    tuner = FakeTuner(fresh)
    result = tuning.run_tune(fresh, s["graph"], s["settings"], lambda f, m: seen.append((f, m)),
                         tuner=tuner)
    assert tuner.calls[0][0] == 32 and tuner.calls[0][1] == 16 * 2**30
    assert seen and seen[-1][0] == 1.0
    up = edits.accept_tune(fresh, s["graph"], s["settings"], result)
    assert not up.error and up.plan["source"] == "tuner" and "fits" in up.message
    r = rendering.render(fresh, {**s, "plan": up.plan})
    text = " ".join(str(item.children[1].children) for item in r.summary)
    assert "12.5% of step time (tuner)" in text
    # an edit after tuning makes the prediction stale
    tensor = plan_from_json(up.plan["json"]).swaps[0].tensor
    edited = edits.toggle_swap(fresh, s["graph"], s["settings"], up.plan, s["view"], tensor)
    r = rendering.render(fresh, {**s, "plan": {**edited.plan, "tune": up.plan["tune"],
                                        "source": "tuner"}})
    text = " ".join(str(item.children[1].children) for item in r.summary)
    assert "edited since auto-tune" in text


def test_tune_results_for_another_graph_or_errors_are_refused(ctx):
    s = session(ctx)
    assert edits.accept_tune(ctx, s["graph"], s["settings"], {"error": "boom"}).error
    stale = {"key": "other", "batch": 32, "plan": "{}"}
    assert "another graph" in edits.accept_tune(ctx, s["graph"], s["settings"], stale).message
    assert edits.accept_tune(ctx, s["graph"], s["settings"], None).plan is None


def test_run_tune_without_a_tuner_or_budget(ctx, monkeypatch):
    s = session(ctx)
    monkeypatch.setattr(tuning, "tuner_module", lambda: None)
    assert "tuner unavailable" in tuning.run_tune(ctx, s["graph"], s["settings"], print)["error"]
    bad = {**s["settings"], "budget": "much"}
    out = tuning.run_tune(ctx, s["graph"], bad, print, tuner=FakeTuner(ctx))
    assert "not a size" in out["error"]


def test_the_real_tuner_runs_on_mlp(ctx):
    if tuning.tuner_module() is None:
        pytest.skip("lmscore.tune is not installed")
    s = session(ctx)
    seen: list = []
    result = tuning.run_tune(ctx, s["graph"], s["settings"], lambda f, m: seen.append(f))
    assert "error" not in result, result
    assert edits.accept_tune(ctx, s["graph"], s["settings"], result).plan["source"] == "tuner"


# --- rendering --------------------------------------------------------------------------


def test_render_full_then_patch(fresh):
    s = session(fresh)
    r = rendering.render(fresh, s, full=True)
    assert len(r.figure.data) == figures.N_TRACES and r.note == ""
    assert r.rendered["batch"] == 32 and r.rows and r.caption.startswith("Tensors live at")
    assert r.rows == sorted(r.rows, key=lambda row: -row["mib"])
    up = edits.apply_knobs(fresh, s["graph"], s["settings"],
                        {"threshold": 5, "ahead": 1, "groupby": 5, "sync_mode": 0})
    p = rendering.render(fresh, {**s, "plan": up.plan, "view": {"level": 3, "tensor": None,
                                                         "op": None}}, full=False)
    ops = p.figure.to_plotly_json()["operations"]
    touched = {tuple(o["location"][:2]) for o in ops}
    assert ("data", figures.T_AFTER) in touched and ("data", 0) not in touched
    assert "level 3 (selected level)" in p.caption
    view_only = rendering.render(fresh, {**s, "plan": up.plan, "view": {"level": 4, "tensor": None,
                                                                 "op": None}},
                          full=False, data=False)
    ops = view_only.figure.to_plotly_json()["operations"]
    assert [o["location"] for o in ops] == [["layout", "shapes"]]


def test_render_ignores_a_plan_for_another_graph(ctx):
    s = session(ctx)
    other = {"json": json.dumps({"version": 1, "graph": "f" * 16, "swaps": []}),
             "source": "file"}
    r = rendering.render(ctx, {**s, "plan": other})
    assert r.message and "does not fit this graph" in r.message


def test_large_graphs_are_aggregated_on_screen(tmp_path):
    c = state.new_context("bert", None, upload_cap_bytes=MIB, data_dir=tmp_path)
    c.max_points = 2000
    r = rendering.render(c, session(c))
    assert "aggregated points" in r.note
    assert sum(len(t.x) for t in r.figure.data[:5]) <= 2000


def test_tabs_with_different_graphs_do_not_share_state(fresh):
    a = session(fresh)
    b_up = edits.choose_graph(fresh, "sample:lstm", a["graph"], a["settings"])
    b = {"graph": b_up.graph, "settings": b_up.settings, "plan": b_up.plan, "view": b_up.view}
    knobs = {"threshold": 5, "ahead": 1, "groupby": 5, "sync_mode": 0}
    a_plan = edits.apply_knobs(fresh, a["graph"], a["settings"], knobs).plan
    ra = rendering.render(fresh, {**a, "plan": a_plan})
    rb = rendering.render(fresh, b)
    assert "mlp.pb" in str(ra.summary[0].children[1].children)
    assert "lstm.pb" in str(rb.summary[0].children[1].children)
    assert rb.figure.data[figures.T_AFTER].y is None or len(rb.figure.data[figures.T_AFTER].y) == 0


# --- downloads --------------------------------------------------------------------------


def test_export_is_byte_identical_to_the_cli(fresh, tmp_path):
    s = session(fresh)
    up = edits.apply_knobs(fresh, s["graph"], s["settings"],
                        {"threshold": 3, "ahead": 1, "groupby": 5, "sync_mode": 0})
    name, data = files.export_bundle(fresh, s["graph"], up.plan)
    assert name == "mlp.lms.zip"
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert sorted(zf.namelist()) == ["mlp.lms.pb", "mlp.plan.json"]
        pb = zf.read("mlp.lms.pb")
        exported_plan = zf.read("mlp.plan.json").decode()
    plan_name, plan_text, _ = files.plan_download(fresh, s["graph"], up.plan)
    assert plan_name == "mlp.plan.json"
    plan_file = tmp_path / plan_name
    plan_file.write_text(plan_text)
    out = tmp_path / "cli.pb"
    plan_out = tmp_path / "cli.plan.json"
    proc = subprocess.run(
        [sys.executable, "-m", "lmscore.cli", "rewrite", str(samples.sample_dir() / "mlp.pb"),
         "--plan", str(plan_file), "--out", str(out), "--plan-out", str(plan_out)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == pb
    assert plan_out.read_text() == exported_plan
    assert plan_from_json(exported_plan).graph == fingerprint(fresh.initial.graph)


def test_export_with_device_strings_and_an_empty_plan(ctx):
    s = session(ctx)
    name, data = files.export_bundle(ctx, s["graph"], s["plan"], "/device:GPU:1", "/CPU:0")
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert plan_from_json(zf.read("mlp.plan.json").decode()).swaps == ()
    from lmscore.errors import ConfigError

    with pytest.raises(ConfigError):
        files.export_bundle(ctx, s["graph"], s["plan"], "not a device", "/CPU:0")


# --- dispatch and the app ---------------------------------------------------------------


def test_control_dispatches_and_outputs_match_the_callback(ctx):
    s = session(ctx)
    up = edits.control(ctx, "batch", {"batch": 8}, s)
    assert up.settings["batch"] == 8
    out = callbacks._outputs(up, s, "batch")
    assert len(out) == 5 + 4 + 2 + len(rendering.CONTROLS) + 2 + 1
    assert edits.control(ctx, "hotspots", {"hotspots": {"row_id": "x:0", "column_id": "tensor"}},
                      s).view["tensor"] == "x:0"
    assert edits.control(ctx, "edit-trigger", {}, s).error
    assert edits.control(ctx, "st-graph", {}, s).controls
    assert edits.control(ctx, None, {}, s) == edits.Update()


def test_create_app_and_run_defaults(tmp_path, monkeypatch):
    dash_app = lms_app.create_app("mlp", 4, upload_cap_bytes=MIB, data_dir=tmp_path)
    assert dash_app.server.config["MAX_CONTENT_LENGTH"] > MIB
    page = dash_app.layout()
    assert page is not None
    assert lms_app.assets_dir().joinpath("style.css").exists()
    calls = {}

    def fake_run(self, **kw):
        calls.update(kw)

    monkeypatch.setattr(type(dash_app), "run", fake_run)
    lms_app.run(initial_graph="mlp", data_dir=tmp_path)
    assert calls["host"] == "127.0.0.1" and calls["debug"] is False and calls["port"] == 8050


def test_the_page_html_carries_no_figure(tmp_path):
    # Dash puts its validation layout in every page's HTML: the components, not the data
    dash_app = lms_app.create_app("mlp", 4, upload_cap_bytes=MIB, data_dir=tmp_path)
    client = dash_app.server.test_client()
    index = client.get("/").get_data(as_text=True)
    layout = client.get("/_dash-layout").get_data(as_text=True)
    op = "dense_1"  # in the ordering view's hover (JSON escapes the slashes of its names)
    assert op in layout and op not in index
    assert '"validation_layout"' in index and '"id": "hotspots"' in index.replace('":"', '": "')
    assert len(index) < 60_000


def test_without_background_job_packages_the_tuner_runs_inline(tmp_path, monkeypatch):
    monkeypatch.setattr(lms_app, "_background_manager", lambda jobs_dir: None)
    dash_app = lms_app.create_app("mlp", upload_cap_bytes=MIB, data_dir=tmp_path)
    assert dash_app._background_manager is None
    assert any("st-tune.data" in k for k in dash_app.callback_map)


# --- recomputation by hand ----------------------------------------------------------------

#: mlp at batch 32: the first hidden layer's activation is read again by the backward pass.
RELU = "mlp_1/dense_1/Relu:0"


def recompute_rows(c: state.AppContext, s: dict, level: int) -> list[dict]:
    loaded = c.resolve(s["graph"])
    base = results.base_of(c, loaded, s["settings"]["batch"])
    return rendering.hotspot_rows(base, results.plan_of(c, loaded, s["plan"]["json"]), level)


def test_toggle_recompute_adds_then_removes_and_the_views_show_it(fresh):
    s = session(fresh)
    row = next(r for r in recompute_rows(fresh, s, 10) if r["id"] == RELU)
    assert (row["decision"], row["recompute"], row["recomputable"]) == (
        rendering.KEPT, rendering.RECOMPUTE_OFF, "yes")
    up = edits.control(fresh, "hotspots", {"hotspots": {"row_id": RELU, "column_id": "recompute"}},
                    s)
    assert not up.error and up.message == f"{RELU} recomputed; the plan has 0 swaps, 1 recompute"
    plan = plan_from_json(up.plan["json"])
    assert plan.recomputed() == (RELU,) and plan.version == 2 and up.plan["recomputes"] == 1
    assert up.view["tensor"] == RELU
    edited = {**s, "plan": up.plan, "view": {**up.view, "level": 10}}
    r = rendering.render(fresh, edited)
    row = next(x for x in r.rows if x["id"] == RELU)
    assert (row["decision"], row["recompute"], row["swap"]) == (
        rendering.RECOMPUTED, rendering.RECOMPUTE_ON, rendering.SWAP_OFF)
    after = r.figure.data[figures.T_AFTER].y
    assert after is not None and len(after) == len(r.figure.data[figures.T_BEFORE].y)
    items = {item.children[1].id: item.children[1].children for item in r.summary}
    assert items["sum-recomputed"] == "1 tensor, 1 op cloned"
    assert items["sum-after"] != "no plan" and items["sum-swapped"] == "nothing"
    listed = str(r.recomputes)
    again = plan.recomputes[0]
    assert RELU in listed and again.trigger in listed and again.consumers[0] in listed
    assert "is recomputed" in str(r.editor)  # the selected tensor's panel says so too
    down = edits.toggle_recompute(fresh, s["graph"], s["settings"], up.plan, s["view"], RELU)
    assert not down.error and down.message.startswith(f"{RELU} no longer recomputed")
    assert plan_from_json(down.plan["json"]).changes_nothing()
    r = rendering.render(fresh, {**s, "plan": down.plan})
    assert "Nothing is recomputed" in str(r.recomputes)


def test_a_refused_recompute_says_why_and_changes_nothing(fresh):
    s = session(fresh)
    row = next(r for r in recompute_rows(fresh, s, 10) if r["recompute"] == rendering.SWAP_NO
               and "update op" in r["recomputable"])
    up = edits.toggle_recompute(fresh, s["graph"], s["settings"], s["plan"], s["view"], row["id"])
    assert up.error and up.plan is None
    assert up.message == f"edit refused: tensor {row['id']!r} {row['recomputable']}"
    assert "\n" not in up.message
    ghost = edits.toggle_recompute(fresh, s["graph"], s["settings"], s["plan"], s["view"], "nope:0")
    assert ghost.error and "unknown tensor" in ghost.message


@pytest.mark.parametrize("sample", ["mlp", "lstm"])
def test_the_table_offers_exactly_the_recomputes_the_plan_accepts(tmp_path, sample):
    c = state.new_context(sample, None, upload_cap_bytes=MIB, data_dir=tmp_path)
    s = session(c)
    seen: dict[str, bool] = {}
    for level in range(s["graph"]["levels"]):
        for row in recompute_rows(c, s, level):
            offered = row["recompute"] == rendering.RECOMPUTE_OFF
            if seen.setdefault(row["id"], offered) != offered:
                raise AssertionError(f"{row['id']}: the verdict changes with the level")
    assert any(seen.values()) or sample == "lstm"
    for tensor, offered in seen.items():
        up = edits.toggle_recompute(c, s["graph"], s["settings"], s["plan"], s["view"], tensor)
        assert up.error != offered, (tensor, up.message)


def test_swap_and_recompute_replace_each_other(fresh):
    s = session(fresh)
    swapped = edits.toggle_swap(fresh, s["graph"], s["settings"], s["plan"], s["view"], RELU)
    assert not swapped.error
    up = edits.toggle_recompute(fresh, s["graph"], s["settings"], swapped.plan, s["view"], RELU)
    assert not up.error and up.message.startswith(f"{RELU} recomputed instead of swapped")
    plan = plan_from_json(up.plan["json"])
    assert plan.swapped() == () and plan.recomputed() == (RELU,)
    back = edits.toggle_swap(fresh, s["graph"], s["settings"], up.plan, s["view"], RELU)
    assert not back.error and back.message.startswith(f"{RELU} swapped instead of recomputed")
    plan = plan_from_json(back.plan["json"])
    assert plan.swapped() == (RELU,) and plan.recomputed() == ()
    # a refused switch keeps the decision the tensor had
    loaded = fresh.resolve(s["graph"])
    base = results.base_of(fresh, loaded, s["settings"]["batch"])
    mask = "sparse_categorical_crossentropy/Cast_1:0"  # int labels: recomputable, not swappable
    assert not base.recompute_refused(mask)
    kept = edits.toggle_recompute(fresh, s["graph"], s["settings"], s["plan"], s["view"], mask)
    no = edits.toggle_swap(fresh, s["graph"], s["settings"], kept.plan, s["view"], mask)
    assert no.error and no.plan is None and "cannot be swapped" in no.message


def test_plan_files_keep_recomputes_and_version_1_files_still_load(fresh, tmp_path):
    from dataclasses import replace

    s = session(fresh)
    up = edits.apply_knobs(fresh, s["graph"], s["settings"],
                        {"threshold": 5, "ahead": 1, "groupby": 5, "sync_mode": 0})
    v1 = replace(plan_from_json(up.plan["json"]), version=1).to_json()
    assert '"version": 1' in v1 and "recomputes" not in v1
    loaded_v1 = edits.load_plan_file(fresh, s["graph"], gate("old.json", v1.encode()))
    assert not loaded_v1.error and loaded_v1.message.startswith("plan loaded from old.json: ")
    assert plan_from_json(loaded_v1.plan["json"]).version == 1
    # a recompute added to a version 1 plan (here in place of a knob's swap) makes it a
    # version 2 plan
    assert RELU in plan_from_json(v1).swapped()
    edited = edits.toggle_recompute(fresh, s["graph"], s["settings"], loaded_v1.plan, s["view"],
                                 RELU)
    assert not edited.error and "recomputed instead of swapped" in edited.message
    name, text, _ = files.plan_download(fresh, s["graph"], edited.plan)
    doc = json.loads(text)
    assert doc["version"] == 2 and [r["tensor"] for r in doc["recomputes"]] == [RELU]
    assert {w["tensor"] for w in doc["swaps"]} == set(plan_from_json(v1).swapped()) - {RELU}
    back = edits.load_plan_file(fresh, s["graph"], gate(name, text.encode()))
    assert not back.error and plan_from_json(back.plan["json"]) == plan_from_json(text)
    assert back.message.endswith("swaps, 1 recompute")
    # the export rewrites with the clones
    bundle_name, data = files.export_bundle(fresh, s["graph"], edited.plan)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert plan_from_json(zf.read("mlp.plan.json").decode()).recomputed() == (RELU,)
        assert b"lms/recompute_mlp_1/dense_1/Relu_0/mlp_1/dense_1/Relu" in zf.read("mlp.lms.pb")


def test_a_saved_recompute_plan_comes_back(fresh):
    s = session(fresh)
    up = edits.control(fresh, "hotspots", {"hotspots": {"row_id": RELU,
                                                        "column_id": "recompute"}}, s)
    restarted = state.new_context("mlp", None, upload_cap_bytes=MIB, data_dir=fresh.data_dir)
    again = {**session(restarted), "tab": s["tab"]}  # the same tab, reloaded
    other = edits.choose_graph(restarted, "sample:lstm", again["graph"], again["settings"],
                               again["tab"])
    back = edits.choose_graph(restarted, "sample:mlp", other.graph, other.settings, s["tab"])
    assert back.plan["json"] == up.plan["json"] and back.plan["source"] == "saved"
    assert back.message.endswith("restored this tab's plan for it (0 swaps, 1 recompute)")
    # another tab switching to the same graph does not get it
    stranger = edits.choose_graph(restarted, "sample:mlp", other.graph, other.settings,
                                  state.new_tab_id())
    assert stranger.plan["json"] is None


def test_summary_shows_host_memory_against_tensorflows_limit(fresh, monkeypatch):
    s = session(fresh)
    s = {**s, "settings": {**s["settings"], "batch": 1024}}
    tensor = swappable_tensor(fresh, s, min_mib=1)  # a 1024 x 512 activation: 2 MiB
    up = edits.toggle_swap(fresh, s["graph"], s["settings"], s["plan"], s["view"], tensor)
    assert not up.error
    size = results.base_of(fresh, fresh.resolve(s["graph"]), 1024).row(tensor).bytes

    def summary(limit: int) -> dict:
        # TensorFlow's variable counts whole MiB (tests/test_tune.py); a smaller limit here
        monkeypatch.setattr(rendering, "host_memory_limit", lambda: limit)
        r = rendering.render(fresh, {**s, "plan": up.plan})
        return {item.children[1].id: (item.children[1].children, item.children[1].className)
                for item in r.summary}

    roomy = summary(4 * size)
    assert roomy["sum-host"][0] == (f"{format_bytes(size)} of {format_bytes(4 * size)} "
                                    "(TensorFlow's pinned host memory limit)")
    assert "bad" not in roomy["sum-host"][1] and roomy["sum-fits"][0].startswith("fits")
    tight = summary(size // 2)
    assert tight["sum-host"][0] == (f"{format_bytes(size)} of {format_bytes(size // 2)} "
                                    "(TensorFlow's pinned host memory limit)")
    assert "bad" in tight["sum-host"][1]
    assert tight["sum-fits"][0] == ("does not fit: host memory over its limit by "
                                    f"{format_bytes(size - size // 2)}")


def test_regroup_gives_each_group_its_own_trigger(tmp_path):
    # ResNet-50 at batch 8: one group for the three readers of a block output, triggered
    # before the forward reader; regrouped by levels, the backward readers must not be
    # brought back that early (they were: all three at level 241, the peak 1.2% up)
    import lmscore

    c = state.new_context("resnet50", 8, upload_cap_bytes=8 * MIB, data_dir=tmp_path)
    s = session(c)
    tensor = "resnet50_1/conv3_block1_out_1/Relu:0"
    swapped = edits.toggle_swap(c, s["graph"], s["settings"], s["plan"], s["view"], tensor)
    one = edits.regroup_swap(c, s["graph"], swapped.plan, tensor, None)
    split = edits.regroup_swap(c, s["graph"], one.plan, tensor, 0)
    assert not split.error and "3 swap-in group(s)" in split.message
    g = c.resolve(s["graph"]).graph
    lv = lmscore.order(g).levels
    for sw in plan_from_json(split.plan["json"]).swaps[0].swap_ins:
        first = min(lv[g.index[n]] for n in sw.consumers)
        assert sw.trigger is not None and 0 < first - lv[g.index[sw.trigger]] <= 10, sw
    loaded = c.resolve(s["graph"])
    base = results.base_of(c, loaded, 8)
    peaks = [results.after_of(c, base, plan_from_json(u.plan["json"])).sim.peak_bytes
             for u in (swapped, split)]
    assert peaks[1] <= peaks[0] < base.sim.peak_bytes


def test_the_table_at_the_peak_with_a_plan_lists_what_is_on_the_device(fresh):
    s = session(fresh)
    up = edits.control(fresh, "knobs-apply", {"knob-threshold": 2, "knob-ahead": 1,
                                              "knob-groupby": 5, "knob-sync": 0}, s)
    s = {**s, "plan": up.plan, "history": up.history}
    r = rendering.render(fresh, s)
    loaded = fresh.resolve(s["graph"])
    base = results.base_of(fresh, loaded, s["settings"]["batch"])
    after = results.after_of(fresh, base, plan_from_json(up.plan["json"]))
    assert "peak with the plan" in r.caption and f"level {after.peak_level}" in r.caption
    on_device = after.evaluation.on_device(after.peak_level)
    assert {row["held"] for row in r.rows} <= {"kept", "swap-in", "recomputed", "workspace"}
    # a swapped tensor is listed only while a swap-in holds it on the device
    for row in r.rows:
        if row["decision"] == rendering.SWAPPED:
            assert row["held"] == "swap-in", row
    assert len(r.rows) <= len(on_device) and r.rows[0]["mib"] == round(
        on_device[0].bytes / MIB, 3)
    unplanned = {row["id"] for row in rendering.hotspot_rows(base, results.plan_of(
        fresh, loaded, None), after.peak_level)}
    gone = {t for t in plan_from_json(up.plan["json"]).swapped() if t in unplanned}
    listed = {row["id"]: row["held"] for row in r.rows}
    assert all(listed.get(t, "swap-in") == "swap-in" for t in gone)


def _two_edits(c: state.AppContext) -> tuple[dict, edits.Update, edits.Update, dict]:
    """A new tab's session, its two edits (a recompute, then knobs), and the session after."""
    s = session(c)
    first = edits.control(c, "hotspots", {"hotspots": {"row_id": RELU,
                                                       "column_id": "recompute"}}, s)
    s1 = {**s, "plan": first.plan, "history": first.history}
    knobs = edits.control(c, "knobs-apply", {"knob-threshold": 2, "knob-ahead": 1,
                                             "knob-groupby": 5, "knob-sync": 0}, s1)
    return s, first, knobs, {**s1, "plan": knobs.plan, "history": knobs.history}


def test_undo_and_redo_walk_the_tabs_plans(fresh):
    s, first, knobs, s2 = _two_edits(fresh)
    # the tab's history names the plans; their texts stay on the server
    assert [h.get("json") for h in s2["history"]["undo"]] == [None, None]
    assert s2["history"]["undo"][1]["digest"] == results.plan_digest(first.plan["json"])
    assert RELU not in json.dumps(s2["history"]) and RELU in first.plan["json"]
    back = edits.control(fresh, "undo", {}, s2)
    assert back.plan == first.plan and "undo done" in back.message
    s3 = {**s2, "plan": back.plan, "history": back.history}
    assert edits.control(fresh, "redo", {}, s3).plan == knobs.plan
    back2 = edits.control(fresh, "undo", {}, s3)
    assert back2.plan["json"] is None
    s4 = {**s3, "plan": back2.plan, "history": back2.history}
    nothing = edits.control(fresh, "undo", {}, s4)
    assert nothing.error and "nothing to undo" in nothing.message and nothing.plan is None
    # the undone plan is what the tab has on disk too
    saved = fresh.data_dir / "plans" / s["tab"] / f"{s['graph']['fingerprint']}.json"
    assert saved.read_text() == ""
    # a new edit drops the redo stack
    again = edits.control(fresh, "plan-reset", {}, s4)
    assert again.history["redo"] == []
    # only the plans the history names are kept
    kept = {p.stem for p in (fresh.data_dir / "plans" / s["tab"] / "history").glob("*.json")}
    assert kept == {e["digest"] for e in again.history["undo"] if "digest" in e}


def test_undo_says_so_when_the_server_lost_the_plan(fresh):
    s, _, _, s2 = _two_edits(fresh)
    for p in (fresh.data_dir / "plans" / s["tab"] / "history").glob("*.json"):
        p.unlink()
    lost = edits.control(fresh, "undo", {}, s2)
    assert lost.error and lost.plan is None
    assert lost.message == "undo: that plan is no longer on the server"


def test_a_history_in_a_read_only_data_dir_carries_the_plans(fresh, monkeypatch):
    monkeypatch.setattr(type(fresh), "keep_version", lambda *a: False)
    _, first, knobs, s2 = _two_edits(fresh)
    assert knobs.history["undo"][1]["json"] == first.plan["json"]
    assert edits.control(fresh, "undo", {}, s2).plan == first.plan


@pytest.mark.parametrize("value, why", [
    (0, "from 1"), (-4, "got '-4'"), ("2.5", "got '2.5'"), ("", "is empty"), (None, "is empty"),
    ("eight", "got 'eight'")])
def test_a_bad_batch_size_is_named_with_what_was_typed(ctx, value, why):
    up = edits.control(ctx, "batch", {"batch": value}, session(ctx))
    assert up.error and up.message.startswith("batch size") and why in up.message
    assert "None" not in up.message and up.settings is None


def test_a_success_clears_an_earlier_refusal_and_answers_where_the_user_acted(ctx):
    s = session(ctx)
    refused = edits.control(ctx, "edit-trigger", {}, s)
    assert callbacks.message_outputs(refused, "edit-trigger") == [
        "", "message", refused.message, "message error"]
    ok = edits.control(ctx, "hotspots", {"hotspots": {"row_id": "x:0", "column_id": "tensor"}},
                       s)
    assert ok.message == "" and callbacks.message_outputs(ok, "hotspots")[2] == ""
    # a restore (the stores firing on a reload) leaves the messages as they are
    assert edits.control(ctx, "st-graph", {}, s).message is None


def test_a_graph_with_a_fixed_batch_says_the_batch_size_does_not_apply(ctx):
    s = session(ctx)
    fixed = {**s["graph"], "fixed_batch": 32, "name": "fixed.pb"}
    up = edits.set_batch(s["settings"], 8, fixed)
    assert up.error and "fixed.pb's batch is fixed at 32" in up.message and up.controls


@pytest.mark.parametrize("name, data, why", [
    ("model.onnx", b"\x08\x07onnx", "model.onnx: not a graph file"),
    ("model.h5", b"\x89HDF\r\n", "model.h5: not a graph file"),
])
def test_other_file_types_are_refused_by_name(ctx, name, data, why):
    up = edits.upload_graph(ctx, gate(name, data), session(ctx)["settings"])
    assert up.error and why in up.message


def test_a_truncated_pb_is_said_to_be_cut_short(ctx):
    data = (samples.sample_dir() / "resnet50.pb").read_bytes()
    up = edits.upload_graph(ctx, gate("resnet50.pb", data[: len(data) // 2]),
                            session(ctx)["settings"])
    assert up.error and "resnet50.pb" in up.message and "cut short or damaged" in up.message
    assert "codec" not in up.message


def test_a_graph_file_on_load_plan_is_refused_by_name(ctx):
    s = session(ctx)
    data = (samples.sample_dir() / "mlp.pb").read_bytes()
    up = edits.load_plan_file(ctx, s["graph"], gate("mlp.pb", data))
    assert up.error and "mlp.pb: not a plan file" in up.message


def test_a_batch_change_reuses_the_plans_rewrite_and_simulates_as_a_fresh_evaluation(fresh):
    from lmscore.evaluate import evaluate_plan
    from lmscore.plan import plan_from_params

    s = session(fresh)
    loaded = fresh.resolve(s["graph"])
    b = int(s["settings"]["batch"])
    plan = plan_from_params(loaded.graph, b, threshold=1)
    first = results.after_of(fresh, results.base_of(fresh, loaded, b), plan)
    base = results.base_of(fresh, loaded, 2 * b)
    again = results.after_of(fresh, base, plan)
    assert again.rewrite is first.rewrite  # rewritten once for both batch sizes
    full = evaluate_plan(loaded.graph, plan, 2 * b, sizes=base.sizes)
    assert again.device == full.device_curve and again.host == full.host_curve
    assert again.sim.peak_bytes == full.after.peak_bytes
    assert again.evaluation.dominant() == full.dominant()


def test_old_tabs_plans_are_pruned_when_the_server_starts(tmp_path):
    import os
    import time

    plans = tmp_path / "plans"
    old, recent = state.new_tab_id(), state.new_tab_id()
    for tab, age_days in ((old, 40), (recent, 2)):
        (plans / tab / "history").mkdir(parents=True)
        for p in (plans / tab / "f1ccc76a51fbaa0e.json", plans / tab / "history" / "a.json"):
            p.write_text("{}")
            t = time.time() - age_days * 86400
            os.utime(p, (t, t))
    (plans / "not-a-tab").mkdir()
    os.utime(plans / "not-a-tab", (0, 0))
    state.new_context("mlp", None, data_dir=tmp_path, upload_cap_bytes=2**20)
    assert sorted(p.name for p in plans.iterdir()) == sorted([recent, "not-a-tab"])
    assert (plans / recent / "history" / "a.json").exists()


def test_a_forked_tab_gets_a_copy_of_the_plans_and_nothing_else(tmp_path):
    ctx = state.new_context("mlp", None, data_dir=tmp_path, upload_cap_bytes=2**20)
    old, new = state.new_tab_id(), state.new_tab_id()
    ctx.save_plan(old, "f1ccc76a51fbaa0e", '{"plan": 1}')
    assert ctx.keep_version(old, "a" * 64, '{"plan": 0}')
    assert ctx.fork_tab(old, new)
    assert (ctx.plans_dir / new / "f1ccc76a51fbaa0e.json").read_text() == '{"plan": 1}'
    assert ctx.version(new, "a" * 64) == '{"plan": 0}'
    ctx.save_plan(new, "f1ccc76a51fbaa0e", '{"plan": 2}')  # the copy is the new tab's own
    assert (ctx.plans_dir / old / "f1ccc76a51fbaa0e.json").read_text() == '{"plan": 1}'
    # an existing folder is never overwritten; ids that are not tab ids copy nothing
    assert ctx.fork_tab(old, new)
    assert (ctx.plans_dir / new / "f1ccc76a51fbaa0e.json").read_text() == '{"plan": 2}'
    assert not ctx.fork_tab(old, old)
    assert not ctx.fork_tab("../" + old, state.new_tab_id())
    assert not ctx.fork_tab(old, "../escape")
    assert sorted(p.name for p in ctx.plans_dir.iterdir()) == sorted([old, new])


def test_a_swapped_view_is_listed_as_swapped_and_can_be_unswapped(tmp_path):
    # the knobs swap a Reshape's output, a view of a buffer whose row names another of its
    # tensors: its swap-in was listed as a "kernel workspace" nobody could toggle
    c = state.new_context("unet3d", None, upload_cap_bytes=MIB, data_dir=tmp_path)
    s = session(c)
    up = edits.apply_knobs(c, s["graph"], s["settings"],
                           {"threshold": 1, "ahead": 1, "groupby": 5, "sync_mode": 0})
    loaded = c.resolve(s["graph"])
    base = results.base_of(c, loaded, s["settings"]["batch"])
    plan = results.plan_of(c, loaded, up.plan["json"])
    after = results.after_of(c, base, plan)
    views = [r for lvl in range(len(base.sim.device_curve))
             for r in rendering.hotspot_rows(base, plan, lvl, after=after)
             if r["held"] == "swap-in" and results.live_row(base, r["tensor"]) is None]
    assert views, "the sample's knob plan no longer swaps a view"
    row = views[0]
    assert row["tensor"] in plan.swapped() and row["decision"] == rendering.SWAPPED
    assert row["swap"] == rendering.SWAP_ON and row["category"] != "—"
    assert "workspace" not in row["swappable"] + row["recomputable"]
    down = edits.toggle_swap(c, s["graph"], up.settings, up.plan, s["view"], row["id"])
    assert not down.error and row["tensor"] not in plan_from_json(down.plan["json"]).swapped()


def test_the_table_with_a_plan_lists_every_buffer_on_the_device(tmp_path):
    """A tensor kept for a near reader while its swap-in serves a far one is two buffers
    on the device: the table listed one (ResNet-50 at batch 8 tuned to 700 MiB, level
    1619: 6.1 MiB short of the curve, the swap-in missing)."""
    from lmscore.tune import tune

    c = state.new_context("resnet50", None, upload_cap_bytes=MIB, data_dir=tmp_path)
    loaded = c.resolve(session(c)["graph"])
    plan = tune(loaded.graph, 8, 700 * MIB).plan
    base = results.base_of(c, loaded, 8)
    after = results.after_of(c, base, plan)
    ev = after.evaluation

    def key(r):  # the tensor a hand edit of the buffer's row would edit
        t = base.row(r.of) if r.of else None
        return (t.swap_tensor or t.tensor) if t else r.tensor

    doubled = [lvl for lvl in range(len(base.sim.device_curve))
               if len(set(map(key, ev.on_device(lvl)))) < len(ev.on_device(lvl))]
    assert doubled, "no level holds two buffers of one tensor any more"
    for lvl in doubled[:3]:
        rows = rendering.hotspot_rows(base, plan, lvl, after=after)
        assert len({r["id"] for r in rows}) == len(rows)
        assert sum(r["mib"] for r in rows) == pytest.approx(
            sum(r.bytes for r in ev.on_device(lvl)) / MIB, abs=0.001 * len(rows))
        assert {r["held"] for r in rows} >= {"kept", "swap-in"}
        twice = [r for r in rows if rendering.ROW_COPY in r["id"]]
        assert twice and all(rendering.row_tensor(r["id"]) in {x["id"] for x in rows}
                             for r in twice)
    # a recomputed row never says why it could not be recomputed (the tuner's choice,
    # beyond what a hand edit's knob allows, read "recomputable: no op within 10 levels")
    from lmscore.evaluate import resident

    spans = [(b.first, b.last) for b in ev.after.buffers if not b.host and not b.scratch
             and resident(ev.rewrite.graph, b).kind == "recomputed"]
    levels = [lvl for lvl, at in enumerate(ev.level_positions)
              if any(first <= at <= last for first, last in spans)]
    assert levels
    again = [r for lvl in levels[::max(1, len(levels) // 3)][:3]
             for r in rendering.hotspot_rows(base, plan, lvl, after=after)
             if r["decision"] == rendering.RECOMPUTED]
    assert again and all(r["recomputable"] == "yes" for r in again), again[:2]


def test_a_toggled_row_stays_in_the_table_when_its_tensor_leaves_the_device(tmp_path):
    """Swapping the top row at the peak moves its tensor off the device there: the table
    of the peak with the plan lost the row, and with it the toggle to take the swap back."""
    c = state.new_context("resnet50", None, upload_cap_bytes=MIB, data_dir=tmp_path)
    s = session(c)
    loaded = c.resolve(s["graph"])
    base = results.base_of(c, loaded, s["settings"]["batch"])
    top = rendering.hotspot_rows(base, results.plan_of(c, loaded, None), base.sim.peak_level)
    row = next(r for r in top if r["swap"] == rendering.SWAP_OFF)
    up = edits.toggle_swap(c, s["graph"], s["settings"], s["plan"], s["view"], row["id"])
    assert not up.error and up.view["tensor"] == row["id"]
    plan = results.plan_of(c, loaded, up.plan["json"])
    after = results.after_of(c, base, plan)
    level = after.evaluation.after.peak_level
    plain = rendering.hotspot_rows(base, plan, level, after=after)
    kept = rendering.hotspot_rows(base, plan, level, after=after, keep=row["id"])
    mine = [r for r in kept if r["id"] == row["id"]]
    assert mine and mine[0]["decision"] == rendering.SWAPPED
    assert mine[0]["swap"] == rendering.SWAP_ON
    assert not any(r["id"] == row["id"] for r in plain)  # off the device there
    assert mine[0]["held"] == rendering.OFF_DEVICE and mine[0]["mib"] == 0
    assert len(kept) == len(plain) + 1


def test_find_says_when_it_took_the_best_of_several(tmp_path):
    c = state.new_context("mlp", None, upload_cap_bytes=MIB, data_dir=tmp_path)
    s = session(c)
    exact = edits.find_name(c, s["graph"], s["view"], "mlp_1/dense_1/Relu")
    assert exact.message.startswith("found mlp_1/dense_1/Relu at level ")
    many = edits.find_name(c, s["graph"], s["view"], "MatMul")
    assert " more match: " in many.message and many.view["op"] is not None


def test_a_swap_in_row_toggles_the_tensor_the_plan_swaps(tmp_path):
    """A swap-in of a gradient whose buffer's farthest reader is a view of it (an
    ``Add``'s ``Reshape``) named the view: ResNet-50 at batch 8 with the page's knobs,
    each click at the peak un-swapped or swapped a view while the row went on showing
    the gradient's swap-in, and the peak never moved."""
    c = state.new_context("resnet50", None, upload_cap_bytes=MIB, data_dir=tmp_path)
    s = session(c)
    knobs = {f"knob-{k.replace('sync_mode', 'sync')}": v for k, v in state.DEFAULT_KNOBS.items()}
    up = edits.control(c, "knobs-apply", knobs, s)
    assert not up.error
    loaded = c.resolve(s["graph"])
    base = results.base_of(c, loaded, s["settings"]["batch"])
    plan = results.plan_of(c, loaded, up.plan["json"])
    after = results.after_of(c, base, plan)
    ev = after.evaluation

    def named_otherwise(r):  # a swap-in of a buffer's first tensor, its row a view's
        t = base.row(r.of)
        return r.kind == "swap-in" and t is not None and t.tensor == r.of != t.swap_tensor

    level = next(lvl for lvl in range(len(base.sim.device_curve))
                 if any(map(named_otherwise, ev.on_device(lvl))))
    rows = rendering.hotspot_rows(base, plan, level, after=after)
    swap_ins = [r for r in rows if r["held"] == "swap-in"]
    assert swap_ins
    for r in swap_ins:  # the row's tensor is the one the plan swaps
        assert r["decision"] == rendering.SWAPPED and r["tensor"] in plan.swapped(), r
    assert sorted(r["tensor"] for r in swap_ins) == sorted(
        r.of for r in ev.on_device(level) if r.kind == "swap-in")
    top = swap_ins[0]
    down = edits.toggle_swap(c, s["graph"], s["settings"], up.plan, s["view"], top["id"])
    assert not down.error and top["tensor"] not in results.plan_of(
        c, loaded, down.plan["json"]).swapped()


def test_a_plan_that_does_not_pin_its_order_fits_only_in_that_order(fresh):
    """A knob plan the page called "fits" measured 1.28 of its budget in one run of three
    (TensorFlow ran its ops in another order); the tuner's plans pin theirs."""
    s = session(fresh)
    s = {**s, "settings": {**s["settings"], "budget": "1GiB"}}
    knobs = {f"knob-{k.replace('sync_mode', 'sync')}": v for k, v in state.DEFAULT_KNOBS.items()}
    up = edits.control(fresh, "knobs-apply", knobs, s)
    assert not up.error and not plan_from_json(up.plan["json"]).pin_schedule

    def verdict(plan_data: dict) -> tuple[str, str]:
        r = rendering.render(fresh, {**s, "plan": plan_data})
        items = {item.children[1].id: (item.children[1].children, item.children[1].className)
                 for item in r.summary}
        return items["sum-fits"]

    text, cls = verdict(up.plan)
    assert text.startswith("fits in the simulated order of the ops, which this plan does "
                           "not pin") and "warn" in cls
    assert verdict(s["plan"])[0].startswith("fits (")  # no plan: TensorFlow's own order


def test_an_edit_that_changes_nothing_takes_no_undo_step(tmp_path):
    """"one group" of a tensor already in one group answered as if it had regrouped, and
    took an undo step that changed nothing when undone."""
    c = state.new_context("lstm", None, upload_cap_bytes=MIB, data_dir=tmp_path)
    s = session(c)
    knobs = {f"knob-{k.replace('sync_mode', 'sync')}": v for k, v in state.DEFAULT_KNOBS.items()}
    up = edits.control(c, "knobs-apply", knobs, s)
    s = {**s, "plan": up.plan, "history": up.history}
    tensor = plan_from_json(up.plan["json"]).swapped()[0]
    s = {**s, "view": {**s["view"], "tensor": tensor}}
    once = edits.control(c, "edit-onegroup", {}, s)
    assert not once.error
    if once.plan is not None:
        s = {**s, "plan": once.plan, "history": once.history}
    undo_steps = len(s["history"]["undo"])
    again = edits.control(c, "edit-onegroup", {}, s)
    assert not again.error and again.plan is None
    assert again.message.startswith("the plan is unchanged")
    assert again.history is None or len(again.history["undo"]) == undo_steps


def test_a_batch_a_graph_fixed_is_not_kept_for_the_next(tmp_path):
    """A graph of unknown batch uploaded after one whose inputs fixed the batch at 2 was
    shown at 2 (``lms`` takes 1), and a graph fixed at another batch was said not to take
    a batch size the user never typed."""
    from tensorboard.compat.proto import graph_pb2

    data = (samples.sample_dir() / "mlp.pb").read_bytes()
    gd = graph_pb2.GraphDef()
    gd.ParseFromString(data)

    def fixed_at(n: int) -> bytes:
        for node in gd.node:
            if node.op == "Placeholder" and node.attr["shape"].shape.dim:
                node.attr["shape"].shape.dim[0].size = n
                node.attr["_output_shapes"].list.shape[0].dim[0].size = n
        return gd.SerializeToString()

    c = state.new_context("mlp", None, upload_cap_bytes=MIB, data_dir=tmp_path)
    s = session(c)
    two = edits.control(c, "graph-gate", {"graph-gate": gate("two.pb", fixed_at(2))}, s)
    assert not two.error and two.settings["batch"] == 2  # (the sample's 32 "does not apply")
    s = {**s, "graph": two.graph, "settings": two.settings}
    three = edits.control(c, "graph-gate", {"graph-gate": gate("three.pb", fixed_at(3))}, s)
    assert three.settings["batch"] == 3 and "does not apply" not in three.message
    s = {**s, "graph": three.graph, "settings": three.settings}
    free = edits.control(c, "graph-gate", {"graph-gate": gate("free.pb", data)}, s)
    assert not free.error and free.settings["batch"] == 1, free.message
    # a batch the user typed stays
    s = {**s, "graph": free.graph, "settings": {**free.settings, "batch": 16}}
    again = edits.control(c, "graph-gate", {"graph-gate": gate("free2.pb", data + b"")}, s)
    assert again.settings["batch"] == 16


def test_another_graph_cancels_a_running_tune_and_says_so(tmp_path):
    """An upload while auto-tune ran dropped the run without a word."""
    c = state.new_context("mlp", None, upload_cap_bytes=MIB, data_dir=tmp_path)
    s = session(c)
    data = (samples.sample_dir() / "lstm.pb").read_bytes()
    running = edits.control(c, "graph-gate", {"graph-gate": gate("lstm.pb", data),
                                              "tune-run": True}, s)
    assert not running.error and running.message.endswith(
        "; the auto-tune that was running is cancelled")
    idle = edits.control(c, "graph-gate", {"graph-gate": gate("lstm.pb", data),
                                           "tune-run": False}, s)
    assert "auto-tune" not in idle.message
    refused = edits.control(c, "graph-gate", {"graph-gate": gate("x.pb", b"\x07\xff" * 20),
                                              "tune-run": True}, s)
    assert refused.error and "auto-tune" not in refused.message


def test_a_field_and_a_click_in_one_request_are_both_done(fresh):
    """The batch field's value and "apply knobs" arrive together when the click takes the
    focus from the field: the field first, then the knobs, at the new batch."""
    s = session(fresh)
    knobs = {f"knob-{k.replace('sync_mode', 'sync')}": v for k, v in state.DEFAULT_KNOBS.items()}
    values = {**knobs, "batch": 16}
    up, answered = edits.control_all(fresh, ["knobs-apply", "batch"], values, s)
    assert answered == "knobs-apply" and not up.error
    assert up.settings["batch"] == 16 and up.message.startswith("knobs applied:")
    alone = edits.control(fresh, "knobs-apply", knobs, {**s, "settings": up.settings})
    assert up.plan["json"] == alone.plan["json"]  # made at batch 16
    # a refused field stops there: nothing applied at a batch the user did not get
    up, answered = edits.control_all(fresh, ["batch", "knobs-apply"], {**values, "batch": 0}, s)
    assert answered == "batch" and up.error and up.plan is None


def test_a_plan_made_for_another_batch_says_so(fresh):
    """A knob plan saved at batch 32 and loaded at batch 16 was shown at 16 without a word,
    and the comparison's list could not tell it from the same plan made at 16."""
    s = session(fresh)
    knobs = {f"knob-{k.replace('sync_mode', 'sync')}": v for k, v in state.DEFAULT_KNOBS.items()}
    at32 = edits.control(fresh, "knobs-apply", knobs,
                         {**s, "settings": {**s["settings"], "batch": 32}})
    plan = plan_from_json(at32.plan["json"])
    assert plan.params["batch_size"] == 32
    up = edits.load_plan_file(fresh, s["graph"], gate("p.json", at32.plan["json"].encode()), 16)
    assert not up.error and up.message.endswith("; made for batch 32, shown at batch 16")
    same = edits.load_plan_file(fresh, s["graph"], gate("p.json", at32.plan["json"].encode()), 32)
    assert "made for" not in same.message
    assert compare_panel.next_name([], "saved", plan).endswith(", made for batch 32")
